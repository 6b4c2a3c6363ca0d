// Autograd engine: accumulation, retain_graph, grad mode, detach, requires_grad rules, tensor
// hooks, post-accumulate-grad hooks, version-counter checks, diamond graphs, and activation
// checkpointing (gradients equal to the plain graph, dropout included), end-of-backward callbacks
// (queue_callback: once after every node of the outermost backward, in queue order, never early
// inside a checkpoint's nested backward, never left queued when a backward throws).
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/autograd/checkpoint.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/nn/dropout.h"
#include "tensor/nn/linear.h"
#include "tensor/random.h"

using namespace dtr;

namespace {
Tensor leaf(std::vector<double> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector<double>(v, {n}).set_requires_grad(true);
}
}  // namespace

TEST_CASE("gradients accumulate over two backward calls", "[autograd]") {
  Tensor x = leaf({1.0, -2.0, 3.0});
  sum(mul(x, x)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, -4, 6});
  sum(mul(x, x)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, -8, 12});
  x.set_grad(Tensor());
  sum(mul(x, 3.0)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 3, 3});
}

TEST_CASE("retain_graph allows a second backward; without it the second one raises", "[autograd]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 8});
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("retain_graph"));
}

TEST_CASE("NoGradGuard disables recording and restores the mode", "[autograd]") {
  Tensor x = leaf({1.0, 2.0});
  REQUIRE(grad_enabled());
  {
    NoGradGuard g;
    CHECK_FALSE(grad_enabled());
    Tensor y = mul(x, 2.0);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    {
      GradModeGuard on(true);
      CHECK(mul(x, 2.0).requires_grad());
    }
    CHECK_FALSE(grad_enabled());
  }
  CHECK(grad_enabled());
  CHECK(mul(x, 2.0).requires_grad());
}

TEST_CASE("detach shares data and cuts the graph", "[autograd]") {
  Tensor x = leaf({1.0, 2.0, 3.0});
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.data_ptr() == x.data_ptr());
  // y = x * detach(x): only the first factor carries gradient, so dy/dx = x.
  sum(mul(x, d)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 2, 3});
  {
    NoGradGuard g;
    d.fill_(7.0);
  }
  CHECK(x.to_vector<double>() == std::vector<double>{7, 7, 7});
}

TEST_CASE("requires_grad can only be changed on floating leaves", "[autograd]") {
  Tensor x = leaf({1.0});
  Tensor y = mul(x, 2.0);
  CHECK_FALSE(y.is_leaf());
  CHECK_THROWS_WITH(y.set_requires_grad(false), Catch::Contains("only leaves"));
  CHECK_THROWS_WITH(zeros({2}, DType::i64).set_requires_grad(true), Catch::Contains("floating"));
  x.set_requires_grad(false);
  CHECK_FALSE(mul(x, 2.0).requires_grad());
  CHECK_THROWS_WITH(sum(mul(x, 2.0)).backward(), Catch::Contains("does not require grad"));
}

TEST_CASE("tensor hooks replace gradients on leaves and non-leaves", "[autograd][hooks]") {
  SECTION("leaf hook doubling the gradient") {
    Tensor x = leaf({1.0, 2.0});
    x.register_hook([](const Tensor& g) { return mul(g, 2.0); });
    sum(mul(x, 3.0)).backward();
    CHECK(x.grad().to_vector<double>() == std::vector<double>{6, 6});
  }
  SECTION("non-leaf hook doubling flows to the inputs") {
    Tensor x = leaf({1.0, 2.0});
    Tensor h = mul(x, 3.0);
    Tensor seen;
    h.register_hook([&](const Tensor& g) {
      seen = g;
      return mul(g, 2.0);
    });
    sum(mul(h, h)).backward();  // d/dh = 2h = [6, 12]; doubled -> [12, 24]; times 3
    CHECK(seen.to_vector<double>() == std::vector<double>{6, 12});
    CHECK(x.grad().to_vector<double>() == std::vector<double>{36, 72});
  }
  SECTION("a hook returning an undefined tensor keeps the gradient") {
    Tensor x = leaf({1.0, 2.0});
    int calls = 0;
    x.register_hook([&](const Tensor&) {
      ++calls;
      return Tensor();
    });
    sum(x).backward();
    CHECK(calls == 1);
    CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1});
  }
}

TEST_CASE("post-accumulate-grad hooks fire once per leaf with the final gradient", "[autograd][hooks]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor w = leaf({3.0, 4.0});
  int x_calls = 0, w_calls = 0;
  std::vector<double> x_grad_in_hook;
  x.register_post_accumulate_grad_hook([&](Tensor& t) {
    ++x_calls;
    x_grad_in_hook = t.grad().to_vector<double>();
  });
  w.register_post_accumulate_grad_hook([&](Tensor&) { ++w_calls; });
  // x reaches the loss along three paths.
  Tensor y = add(add(mul(x, w), mul(x, x)), exp(x));
  sum(y).backward();
  CHECK(x_calls == 1);
  CHECK(w_calls == 1);
  const std::vector<double> expect{3 + 2 + std::exp(1.0), 4 + 4 + std::exp(2.0)};
  CHECK(x_grad_in_hook == x.grad().to_vector<double>());
  CHECK(x.grad().to_vector<double>()[0] == Approx(expect[0]));
  CHECK(x.grad().to_vector<double>()[1] == Approx(expect[1]));
  CHECK_THROWS_WITH(mul(x, 2.0).register_post_accumulate_grad_hook([](Tensor&) {}), Catch::Contains("only leaves"));
}

TEST_CASE("in-place changes to tensors saved for backward are detected", "[autograd][version]") {
  SECTION("add_ on a saved input that does not require grad") {
    Tensor x = leaf({1.0, 2.0});
    Tensor w = from_vector<double>({3.0, 4.0}, {2});
    Tensor y = sum(mul(x, w));
    const uint32_t v0 = w.version();
    {
      NoGradGuard g;
      add_(w, ones({2}, DType::f64));
    }
    CHECK(w.version() == v0 + 1);
    CHECK_THROWS_WITH(y.backward(), Catch::Contains("modified by an in-place operation"));
  }
  SECTION("mul_ on a saved leaf under NoGradGuard") {
    Tensor x = leaf({1.0, 2.0});
    Tensor y = sum(mul(x, x));
    {
      NoGradGuard g;
      mul_(x, 2.0);
    }
    CHECK_THROWS_WITH(y.backward(), Catch::Contains("modified by an in-place operation"));
  }
  SECTION("copy_ through a view of a saved tensor") {
    Tensor x = leaf({1.0, 2.0, 3.0});
    Tensor w = from_vector<double>({1.0, 1.0, 1.0}, {3});
    Tensor y = sum(mul(x, w));
    {
      NoGradGuard g;
      w.narrow(0, 1, 1).copy_(full({1}, 5.0, DType::f64));
    }
    CHECK_THROWS_WITH(y.backward(), Catch::Contains("modified by an in-place operation"));
  }
  SECTION("an in-place change that backward does not depend on is fine") {
    Tensor x = leaf({1.0, 2.0});
    Tensor unrelated = zeros({2}, DType::f64);
    Tensor y = sum(mul(x, 2.0));
    add_(unrelated, ones({2}, DType::f64));
    y.backward();
    CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2});
  }
  SECTION("in-place on a leaf that requires grad raises with grad mode on") {
    Tensor x = leaf({1.0, 2.0});
    CHECK_THROWS_WITH(add_(x, ones({2}, DType::f64)), Catch::Contains("requires grad"));
    CHECK_THROWS_WITH(mul_(x, 2.0), Catch::Contains("requires grad"));
    CHECK_THROWS_WITH(x.copy_(ones({2}, DType::f64)), Catch::Contains("requires grad"));
  }
}

TEST_CASE("diamond graphs sum the gradients of every path", "[autograd]") {
  manual_seed(3);
  Tensor x = uniform({3, 4}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true);
  // x -> a = exp(x), b = x * x -> a * b: both branches reach x.
  auto f = [](const std::vector<Tensor>& v) {
    Tensor a = exp(v[0]);
    Tensor b = mul(v[0], v[0]);
    return mul(a, b);
  };
  CHECK(testing::gradcheck(f, {x}) == "");
  x.set_grad(Tensor());  // gradcheck ran backward on x too
  sum(f({x})).backward();
  auto xs = x.to_vector<double>();
  auto gs = x.grad().to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i)
    CHECK(gs[i] == Approx(std::exp(xs[i]) * (xs[i] * xs[i] + 2 * xs[i])).epsilon(1e-12));
}

// ---- activation checkpointing ------------------------------------------------------------------

namespace {
struct Mlp {
  std::shared_ptr<nn::Linear> fc1 = std::make_shared<nn::Linear>(8, 16, true, DType::f64);
  std::shared_ptr<nn::Dropout> drop = std::make_shared<nn::Dropout>(0.3);
  std::shared_ptr<nn::Linear> fc2 = std::make_shared<nn::Linear>(16, 4, true, DType::f64);
  Tensor block(const Tensor& x) const { return fc2->call(silu(drop->call(fc1->call(x)))); }
  std::vector<Tensor> params() const { return {fc1->weight(), fc1->bias(), fc2->weight(), fc2->bias()}; }
  void zero() const {
    for (auto p : params()) p.set_grad(Tensor());
  }
};

std::vector<std::vector<double>> grads_of(const std::vector<Tensor>& ts) {
  std::vector<std::vector<double>> out;
  for (const auto& t : ts) out.push_back(t.grad().defined() ? t.grad().to_vector<double>() : std::vector<double>{});
  return out;
}
}  // namespace

TEST_CASE("checkpoint gives the same outputs and gradients as the plain graph (with dropout)", "[autograd][checkpoint]") {
  manual_seed(11);
  Mlp mlp;
  Tensor x = uniform({5, 8}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true);
  Tensor target = uniform({5, 4}, -1, 1, TensorOptions(DType::f64));
  auto loss_of = [&](const Tensor& out) { return sum(mul(sub(out, target), sub(out, target))); };
  std::vector<Tensor> all = mlp.params();
  all.push_back(x);

  set_generator_state({77, 1000});
  Tensor out_plain = mlp.block(x);
  const GeneratorState after_plain = generator_state();
  loss_of(out_plain).backward();
  const auto plain = grads_of(all);
  for (auto& t : all) t.set_grad(Tensor());

  set_generator_state({77, 1000});
  int calls = 0;
  Tensor out_ckpt = checkpoint(
      [&](const std::vector<Tensor>& in) {
        ++calls;
        return mlp.block(in[0]);
      },
      std::vector<Tensor>{x});
  CHECK(calls == 1);
  CHECK(out_ckpt.requires_grad());
  CHECK(out_ckpt.grad_fn()->name() == "checkpointBackward");
  CHECK(generator_state().offset == after_plain.offset);
  CHECK(out_ckpt.to_vector<double>() == out_plain.to_vector<double>());
  // Some units were dropped, or the test would not exercise the RNG restore.
  {
    NoGradGuard g;
    set_generator_state({77, 1000});
    auto h = mlp.drop->call(ones({5, 16}, DType::f64)).to_vector<double>();
    CHECK(std::count(h.begin(), h.end(), 0.0) > 0);
  }
  set_generator_state(after_plain);
  loss_of(out_ckpt).backward();
  CHECK(calls == 2);  // recomputed once in backward
  CHECK(generator_state().offset == after_plain.offset);  // backward did not move the stream
  const auto ckpt = grads_of(all);
  for (size_t i = 0; i < all.size(); ++i) CHECK(ckpt[i] == plain[i]);
}

TEST_CASE("checkpoint: parameters get gradients when no input requires grad", "[autograd][checkpoint]") {
  manual_seed(12);
  Mlp mlp;
  mlp.drop->eval();
  Tensor x = uniform({3, 8}, -1, 1, TensorOptions(DType::f64));
  sum(mlp.block(x)).backward();
  const auto plain = grads_of(mlp.params());
  mlp.zero();
  int post_hooks = 0;
  mlp.fc1->weight().register_post_accumulate_grad_hook([&](Tensor&) { ++post_hooks; });
  Tensor out = checkpoint([&](const std::vector<Tensor>& in) { return mlp.block(in[0]); }, std::vector<Tensor>{x});
  sum(out).backward();
  CHECK(post_hooks == 1);
  CHECK(grads_of(mlp.params()) == plain);
}

TEST_CASE("checkpoint: several outputs, retain_graph, in-place detection, no-grad mode", "[autograd][checkpoint]") {
  Tensor a = leaf({1.0, 2.0});
  Tensor b = leaf({3.0, 4.0});
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{mul(in[0], in[1]), exp(in[0])};
  };
  SECTION("two outputs, one unused") {
    auto outs = checkpoint(fn, {a, b});
    REQUIRE(outs.size() == 2);
    sum(outs[0]).backward();
    CHECK(a.grad().to_vector<double>() == std::vector<double>{3, 4});
    CHECK(b.grad().to_vector<double>() == std::vector<double>{1, 2});
  }
  SECTION("retain_graph") {
    auto outs = checkpoint(fn, {a, b});
    Tensor l = add(sum(outs[0]), sum(outs[1]));
    l.backward(Tensor(), true);
    l.backward();
    CHECK(b.grad().to_vector<double>() == std::vector<double>{2, 4});
    CHECK_THROWS_WITH(l.backward(), Catch::Contains("retain_graph"));
  }
  SECTION("an input changed in place before backward") {
    Tensor w = from_vector<double>({1.0, 1.0}, {2});
    auto outs = checkpoint(fn, {a, w});
    {
      NoGradGuard g;
      mul_(w, 3.0);
    }
    CHECK_THROWS_WITH(sum(outs[0]).backward(), Catch::Contains("modified by an in-place operation"));
  }
  SECTION("under NoGradGuard it is a plain call") {
    NoGradGuard g;
    auto outs = checkpoint(fn, {a, b});
    CHECK_FALSE(outs[0].requires_grad());
    CHECK(outs[0].to_vector<double>() == std::vector<double>{3, 8});
  }
}

// ---- end-of-backward callbacks ---------------------------------------------------------------

TEST_CASE("queue_callback: runs after every node, in queue order, once per backward", "[autograd][callback]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = leaf({3.0});
  std::vector<std::string> log;
  Tensor h = mul(x, 2.0);
  h.register_hook([&](const Tensor&) {
    // Queued while nodes remain: x's and y's gradients are not accumulated yet.
    queue_callback([&] {
      log.push_back("first x.grad=" + std::to_string(x.grad().to_vector<double>()[1]) +
                    " y.grad=" + std::to_string(y.grad().to_vector<double>()[0]));
      queue_callback([&] { log.push_back("queued by a callback"); });
    });
    queue_callback([&] { log.push_back("second"); });
    return Tensor();
  });
  CHECK(current_backward_id() == 0);
  uint64_t id_seen = 0;
  y.register_hook([&](const Tensor&) {
    id_seen = current_backward_id();
    return Tensor();
  });
  add(sum(h), sum(mul(y, y))).backward();
  CHECK(log == std::vector<std::string>{"first x.grad=2.000000 y.grad=6.000000", "second", "queued by a callback"});
  CHECK(id_seen > 0);
  CHECK(current_backward_id() == 0);
  // A second backward over a new graph runs none of the old callbacks and has a new id.
  log.clear();
  uint64_t id2 = 0;
  Tensor z = mul(x, 1.0);
  z.register_hook([&](const Tensor&) {
    id2 = current_backward_id();
    return Tensor();
  });
  sum(z).backward();
  CHECK(log.empty());
  CHECK(id2 > id_seen);
}

TEST_CASE("queue_callback: a checkpoint's nested backward defers to the outermost one", "[autograd][callback]") {
  Tensor w = leaf({0.5, -1.5});
  Tensor x = leaf({2.0, 4.0});
  int ran = 0;
  bool w_grad_final_when_run = false;
  uint64_t inner_id = 0;
  Tensor out = checkpoint(
      [&](const std::vector<Tensor>& in) {
        Tensor h = mul(in[0], w);
        if (checkpoint_recomputing())
          h.register_hook([&](const Tensor&) {
            // Inside the recomputation's nested backward: same outermost id, queued for its end.
            inner_id = current_backward_id();
            queue_callback([&] {
              ++ran;
              w_grad_final_when_run = w.grad().defined() && x.grad().defined();
            });
            return Tensor();
          });
        return h;
      },
      std::vector<Tensor>{x});
  Tensor before = mul(out, 3.0);
  uint64_t outer_id = 0;
  before.register_hook([&](const Tensor&) {
    outer_id = current_backward_id();
    return Tensor();
  });
  sum(before).backward();
  CHECK(ran == 1);
  CHECK(w_grad_final_when_run);
  CHECK(inner_id == outer_id);
  CHECK(w.grad().to_vector<double>() == std::vector<double>{6, 12});
}

TEST_CASE("queue_callback: a backward that throws leaves no callback for the next one", "[autograd][callback]") {
  Tensor x = leaf({1.0, 2.0});
  int ran = 0;
  Tensor h = mul(x, 2.0);
  h.register_hook([&](const Tensor& g) {
    queue_callback([&] { ++ran; });
    return g;
  });
  Tensor y = mul(h, 3.0);
  y.register_hook([&](const Tensor&) -> Tensor {
    // Runs before h's hook (y is later in the graph); queue, then let a later node fail.
    queue_callback([&] { ++ran; });
    return Tensor();
  });
  x.register_hook([](const Tensor&) -> Tensor { DTR_ERROR("boom in backward"); });
  CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("boom in backward"));
  CHECK(ran == 0);
  CHECK(current_backward_id() == 0);
  // The next backward (no failing hook) runs only what it queues itself.
  Tensor x2 = leaf({1.0});
  int ran2 = 0;
  Tensor h2 = mul(x2, 1.0);
  h2.register_hook([&](const Tensor&) {
    queue_callback([&] { ++ran2; });
    return Tensor();
  });
  sum(h2).backward();
  CHECK(ran == 0);
  CHECK(ran2 == 1);
  // A callback that throws drops the rest.
  Tensor x3 = leaf({1.0});
  Tensor h3 = mul(x3, 1.0);
  int after = 0;
  h3.register_hook([&](const Tensor&) {
    queue_callback([] { DTR_ERROR("callback failed"); });
    queue_callback([&] { ++after; });
    return Tensor();
  });
  CHECK_THROWS_WITH(sum(h3).backward(), Catch::Contains("callback failed"));
  CHECK(after == 0);
  sum(mul(x2, 1.0)).backward();
  CHECK(after == 0);
}

TEST_CASE("queue_callback: outside backward is an error", "[autograd][callback]") {
  CHECK_THROWS_WITH(queue_callback([] {}), Catch::Contains("only be queued during backward"));
}
