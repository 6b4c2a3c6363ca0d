// nn::Module tree: FQNs, traversal order, state_dict round trip, load_state_dict errors, hooks,
// submodule / parameter replacement, train/eval with dropout, and the layers' init and forward.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/nn/dropout.h"
#include "tensor/nn/embedding.h"
#include "tensor/nn/linear.h"
#include "tensor/nn/module_list.h"
#include "tensor/nn/rms_norm.h"
#include "tensor/random.h"

using namespace dtr;
using namespace dtr::nn;

namespace {

struct Attention : Module {
  std::shared_ptr<Linear> q_proj = register_module("q_proj", std::make_shared<Linear>(8, 8, false));
  std::shared_ptr<Linear> o_proj = register_module("o_proj", std::make_shared<Linear>(8, 8, false));
  std::string type_name() const override { return "Attention"; }
  Tensor forward(const Tensor& x) override { return o_proj->call(q_proj->call(x)); }
};

struct Layer : Module {
  std::shared_ptr<RMSNorm> input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(8));
  std::shared_ptr<Attention> self_attn = register_module("self_attn", std::make_shared<Attention>());
  std::shared_ptr<Dropout> dropout = register_module("dropout", std::make_shared<Dropout>(0.5));
  std::string type_name() const override { return "Layer"; }
  Tensor forward(const Tensor& x) override { return add(x, dropout->call(self_attn->call(input_layernorm->call(x)))); }
};

/// A miniature of the Hugging Face Llama layout: model.embed_tokens, model.layers.N, lm_head.
struct Inner : Module {
  std::shared_ptr<Embedding> embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(16, 8));
  std::shared_ptr<ModuleList> layers = register_module("layers", std::make_shared<ModuleList>());
  std::shared_ptr<RMSNorm> norm = register_module("norm", std::make_shared<RMSNorm>(8));
  Inner() {
    layers->push_back(std::make_shared<Layer>());
    layers->push_back(std::make_shared<Layer>());
    register_buffer("inv_freq", ones({4}), /*persistent=*/false);
  }
};

struct Model : Module {
  std::shared_ptr<Inner> model = register_module("model", std::make_shared<Inner>());
  std::shared_ptr<Linear> lm_head = register_module("lm_head", std::make_shared<Linear>(8, 16, false));
  Model() { register_buffer("step", zeros({1})); }
  std::string type_name() const override { return "Model"; }
  Tensor forward(const Tensor& ids) override {
    Tensor h = model->embed_tokens->call(ids);
    for (size_t i = 0; i < model->layers->size(); ++i) h = (*model->layers)[static_cast<int64_t>(i)]->call(h);
    return lm_head->call(model->norm->call(h));
  }
};

std::vector<std::string> keys(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& [k, t] : v) out.push_back(k);
  return out;
}

}  // namespace

TEST_CASE("FQNs follow registration order with Hugging Face dotted names", "[nn]") {
  manual_seed(1);
  auto m = std::make_shared<Model>();
  const std::vector<std::string> want{
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.1.input_layernorm.weight",
      "model.layers.1.self_attn.q_proj.weight",
      "model.layers.1.self_attn.o_proj.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  CHECK(keys(m->named_parameters()) == want);
  CHECK(m->parameters().size() == want.size());
  CHECK(keys(m->named_buffers()) == std::vector<std::string>{"step", "model.inv_freq"});
  CHECK(keys(m->model->named_parameters("model", false)) == std::vector<std::string>{});
  CHECK(keys(m->model->layers->named_parameters("", true)).front() == "0.input_layernorm.weight");

  auto mods = m->named_modules();
  REQUIRE(mods.size() == 18);
  CHECK(mods[0].first == "");
  CHECK(mods[0].second.get() == m.get());
  CHECK(mods[1].first == "model");
  CHECK(mods[3].first == "model.layers");
  CHECK(mods[4].first == "model.layers.0");
  CHECK(mods[6].first == "model.layers.0.self_attn");
  CHECK(mods[7].first == "model.layers.0.self_attn.q_proj");
  CHECK(mods[7].second->type_name() == "Linear");
  CHECK(mods.back().first == "lm_head");
  CHECK(m->children().size() == 2);
  CHECK(m->named_children()[1].first == "lm_head");
  CHECK(m->get_submodule("model.layers.1.self_attn")->type_name() == "Attention");
  CHECK(m->get_parameter("model.layers.1.self_attn.q_proj.weight").is_same(
      m->model->layers->at<Layer>(1)->self_attn->q_proj->weight()));
  CHECK_THROWS_WITH(m->get_submodule("model.layers.2"), Catch::Contains("no submodule \"2\""));
  for (auto& p : m->parameters()) CHECK(p.requires_grad());
}

TEST_CASE("tied weights appear once in parameters and under every name in state_dict", "[nn]") {
  auto m = std::make_shared<Model>();
  m->lm_head->set_parameter("weight", m->model->embed_tokens->weight());
  auto names = keys(m->named_parameters());
  CHECK(std::find(names.begin(), names.end(), "lm_head.weight") == names.end());
  CHECK(keys(m->named_parameters("", true, false)).back() == "lm_head.weight");
  auto sd = m->state_dict();
  CHECK(sd.count("lm_head.weight") == 1);
  CHECK(sd.count("model.embed_tokens.weight") == 1);
}

TEST_CASE("state_dict round trip and load_state_dict errors", "[nn]") {
  manual_seed(2);
  auto a = std::make_shared<Model>();
  manual_seed(3);
  auto b = std::make_shared<Model>();
  auto sd = a->state_dict();
  CHECK(sd.size() == 10);  // 9 parameters + the persistent buffer; inv_freq is not persistent
  CHECK(sd.count("model.inv_freq") == 0);
  CHECK_FALSE(sd.at("lm_head.weight").requires_grad());
  Tensor ids = from_vector<int64_t>({1, 5, 7}, {3});
  a->eval();
  b->eval();
  CHECK(testing::max_abs_diff(a->call(ids), b->call(ids)) > 0);
  auto res = b->load_state_dict(sd);
  CHECK(res.missing_keys.empty());
  CHECK(res.unexpected_keys.empty());
  CHECK(a->call(ids).to_vector<float>() == b->call(ids).to_vector<float>());
  // The live parameters were written in place (not re-bound).
  CHECK(b->lm_head->weight().requires_grad());

  SECTION("missing and unexpected keys name the keys") {
    auto bad = sd;
    bad.erase("model.norm.weight");
    bad["model.extra.weight"] = zeros({2});
    CHECK_THROWS_WITH(b->load_state_dict(bad), Catch::Contains("Missing key(s)") &&
                                                   Catch::Contains("\"model.norm.weight\"") &&
                                                   Catch::Contains("Unexpected key(s)") &&
                                                   Catch::Contains("\"model.extra.weight\""));
    auto r = b->load_state_dict(bad, /*strict=*/false);
    CHECK(r.missing_keys == std::vector<std::string>{"model.norm.weight"});
    CHECK(r.unexpected_keys == std::vector<std::string>{"model.extra.weight"});
  }
  SECTION("a shape mismatch raises even when not strict and copies nothing") {
    auto bad = sd;
    bad["model.norm.weight"] = zeros({9});
    bad["lm_head.weight"] = full({16, 8}, 0.25);
    CHECK_THROWS_WITH(b->load_state_dict(bad, false), Catch::Contains("size mismatch for model.norm.weight") &&
                                                          Catch::Contains("[9]") && Catch::Contains("[8]"));
    CHECK(b->lm_head->weight().to_vector<float>()[0] != 0.25f);
  }
  SECTION("values of another dtype are converted") {
    StateDict sd64;
    for (auto& [k, t] : sd) sd64[k] = t.to(DType::f64);
    sd64["lm_head.weight"] = full({16, 8}, 0.5, DType::f64);
    b->load_state_dict(sd64);
    CHECK(b->lm_head->weight().dtype() == DType::f32);
    CHECK(b->lm_head->weight().to_vector<float>()[3] == 0.5f);
  }
}

TEST_CASE("forward pre/post hooks see and may replace inputs and outputs", "[nn][hooks]") {
  auto lin = std::make_shared<Linear>(3, 2);
  std::vector<std::string> order;
  std::vector<float> input_sums;
  auto h1 = lin->register_forward_pre_hook([&](Module& m, const std::vector<Tensor>& in) -> std::optional<std::vector<Tensor>> {
    order.push_back("pre:" + m.type_name());
    CHECK(in.size() == 1);
    return std::vector<Tensor>{mul(in[0], 0.0)};  // replace the input by zeros
  });
  lin->register_forward_hook([&](Module&, const std::vector<Tensor>& in, const std::vector<Tensor>& out)
                                 -> std::optional<std::vector<Tensor>> {
    order.push_back("post");
    input_sums.push_back(sum(abs(in[0])).item<float>());
    return std::vector<Tensor>{add(out[0], 1.0)};
  });
  Tensor y = lin->call(ones({4, 3}));
  CHECK(order == std::vector<std::string>{"pre:Linear", "post"});
  CHECK(input_sums == std::vector<float>{0.0f});  // the post hook saw the replaced input
  // Output = 0 @ W^T + b + 1.
  auto b = lin->bias().to_vector<float>();
  CHECK(y.to_vector<float>()[1] == Approx(b[1] + 1.0f));
  CHECK(lin->remove_hook(h1));
  CHECK_FALSE(lin->remove_hook(h1));
  Tensor y2 = (*lin)(ones({1, 3}));
  auto w = lin->weight().to_vector<float>();
  CHECK(y2.to_vector<float>()[0] == Approx(w[0] + w[1] + w[2] + b[0] + 1.0f));
  CHECK(input_sums == std::vector<float>{0.0f, 3.0f});
  CHECK_THROWS_WITH(std::make_shared<ModuleList>()->call(ones({1})), Catch::Contains("ModuleList"));
}

namespace {
struct CountState : ModuleState {
  static constexpr const char* kKey = "count_api";
  int calls = 0;
};
struct OtherState : ModuleState {
  static constexpr const char* kKey = "other_api";
};
}  // namespace

TEST_CASE("composable state: one typed state per key on each module, freed with the module", "[nn][state]") {
  auto m = std::make_shared<Linear>(2, 3);
  CHECK(m->state<CountState>() == nullptr);
  auto st = std::make_shared<CountState>();
  std::weak_ptr<CountState> w = st;
  m->set_composable_state(CountState::kKey, st);
  st.reset();
  REQUIRE(m->state<CountState>() != nullptr);
  m->state<CountState>()->calls = 7;
  CHECK(m->state_ptr<CountState>()->calls == 7);
  CHECK(m->state<OtherState>() == nullptr);
  CHECK_THROWS_WITH(m->set_composable_state(CountState::kKey, std::make_shared<CountState>()),
                    Catch::Contains("count_api: already applied to this Linear"));
  m->set_composable_state(OtherState::kKey, std::make_shared<OtherState>());
  CHECK(m->composable_state_keys() == std::vector<std::string>{"count_api", "other_api"});
  // A state stored under a key belongs to its type: another type under that key reads as none.
  m->set_composable_state("x", std::make_shared<OtherState>());
  CHECK(m->composable_state("x") != nullptr);
  auto other = std::make_shared<Linear>(2, 3);
  CHECK(other->state<CountState>() == nullptr);
  m.reset();
  CHECK(w.expired());
}

TEST_CASE("train/eval propagate; dropout is the identity in eval", "[nn]") {
  manual_seed(4);
  auto m = std::make_shared<Model>();
  CHECK(m->is_training());
  m->eval();
  for (auto& [n, mod] : m->named_modules()) CHECK_FALSE(mod->is_training());
  auto drop = m->model->layers->at<Layer>(0)->dropout;
  Tensor x = ones({1000});
  CHECK(drop->call(x).to_vector<float>() == x.to_vector<float>());
  m->train();
  CHECK(drop->is_training());
  auto y = drop->call(x).to_vector<float>();
  const auto zeros_count = std::count(y.begin(), y.end(), 0.0f);
  CHECK(zeros_count > 400);  // p = 0.5 of 1000: 500 +- 16 (1 sd)
  CHECK(zeros_count < 600);
  for (float v : y) CHECK((v == 0.0f || v == 2.0f));
  int visited = 0;
  m->apply([&](Module&) { ++visited; });
  CHECK(visited == 18);
  CHECK_THROWS_WITH(Dropout(1.5), Catch::Contains("[0, 1]"));
}

TEST_CASE("set_submodule and set_parameter replace entries in place", "[nn]") {
  auto m = std::make_shared<Model>();
  auto new_q = std::make_shared<Linear>(8, 8, true);
  m->set_submodule("model.layers.0.self_attn.q_proj", new_q);
  CHECK(m->get_submodule("model.layers.0.self_attn.q_proj").get() == new_q.get());
  auto names = keys(m->named_parameters());
  CHECK(std::find(names.begin(), names.end(), "model.layers.0.self_attn.q_proj.bias") != names.end());
  // Position in the registry kept: q_proj still precedes o_proj.
  auto attn = m->get_submodule("model.layers.0.self_attn");
  CHECK(attn->named_children()[0].first == "q_proj");
  CHECK_THROWS_WITH(m->set_submodule("model.layers.0.self_attn.k_proj", new_q), Catch::Contains("no submodule"));

  Tensor w = zeros({8}).set_requires_grad(true);
  m->set_parameter("model.norm.weight", w);
  CHECK(m->model->norm->weight().is_same(w));
  CHECK(m->state_dict().at("model.norm.weight").data_ptr() == w.data_ptr());
  CHECK_THROWS_WITH(m->set_parameter("model.norm.bias", w), Catch::Contains("no parameter \"bias\""));
  CHECK_THROWS_WITH(m->register_buffer("lm_head", zeros({1})), Catch::Contains("already a module"));
  CHECK_THROWS_WITH(m->register_parameter("a.b", zeros({1})), Catch::Contains("no '.'"));
}

TEST_CASE("layers: init distributions and forward values", "[nn]") {
  manual_seed(5);
  SECTION("Linear: U(-1/sqrt(in), 1/sqrt(in)), forward = x W^T + b, deterministic by seed") {
    Linear l(64, 32);
    CHECK(l.weight().sizes() == Shape{32, 64});
    CHECK(l.bias().sizes() == Shape{32});
    const float bound = 1.0f / 8.0f;
    auto w = l.weight().to_vector<float>();
    float lo = 1, hi = -1;
    for (float v : w) lo = std::min(lo, v), hi = std::max(hi, v);
    CHECK(lo >= -bound);
    CHECK(hi < bound);
    CHECK(lo < -0.9f * bound);  // 2048 draws cover the range
    CHECK(hi > 0.9f * bound);
    Tensor x = uniform({3, 64}, -1, 1);
    CHECK(testing::max_abs_diff(l.call(x), linear(x, l.weight(), l.bias())) == 0.0);
    manual_seed(5);
    Linear again(64, 32);
    CHECK(again.weight().to_vector<float>() == w);
    Linear nobias(4, 3, false, DType::f64);
    CHECK_FALSE(nobias.bias().defined());
    CHECK(nobias.weight().dtype() == DType::f64);
    CHECK(nobias.named_parameters().size() == 1);
  }
  SECTION("Embedding: N(0, 1) rows looked up by id") {
    Embedding e(512, 16);
    auto w = e.weight().to_vector<float>();
    double s = 0, s2 = 0;
    for (float v : w) s += v, s2 += double(v) * v;
    const double n = static_cast<double>(w.size());
    CHECK(std::abs(s / n) < 6 / std::sqrt(n));
    CHECK(std::abs(s2 / n - 1.0) < 6 * std::sqrt(2.0 / n));
    Tensor out = e.call(from_vector<int64_t>({3, 0}, {2}));
    CHECK(out.sizes() == Shape{2, 16});
    CHECK(out.narrow(0, 0, 1).to_vector<float>() == e.weight().narrow(0, 3, 1).to_vector<float>());
  }
  SECTION("RMSNorm: ones weight, normalised rows") {
    RMSNorm n(4, 1e-6);
    CHECK(n.weight().to_vector<float>() == std::vector<float>(4, 1.0f));
    Tensor x = from_vector<float>({1, 2, 3, 4}, {1, 4});
    auto y = n.call(x).to_vector<float>();
    const float r = 1.0f / std::sqrt((1 + 4 + 9 + 16) / 4.0f + 1e-6f);
    for (int i = 0; i < 4; ++i) CHECK(y[i] == Approx((i + 1) * r).epsilon(1e-6));
  }
  SECTION("ModuleList indexing") {
    ModuleList l({std::make_shared<RMSNorm>(2), std::make_shared<Dropout>(0.1)});
    CHECK(l.size() == 2);
    CHECK(l[-1]->type_name() == "Dropout");
    CHECK(keys(l.named_parameters()) == std::vector<std::string>{"0.weight"});
    CHECK_THROWS_WITH(l[2], Catch::Contains("out of range"));
    CHECK_THROWS_WITH(l.at<Linear>(0), Catch::Contains("RMSNorm"));
  }
}

TEST_CASE("a module's gradient flows to every parameter", "[nn]") {
  manual_seed(6);
  auto m = std::make_shared<Model>();
  Tensor logits = m->call(from_vector<int64_t>({1, 2, 3}, {3}));
  CHECK(logits.sizes() == Shape{3, 16});
  sum(mul(logits, logits)).backward();
  for (auto& [n, p] : m->named_parameters()) {
    INFO(n);
    CHECK(p.grad().defined());
  }
}
