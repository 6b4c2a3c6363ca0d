// CausalLM's loss through the fused head (call_list({ids, targets}) -> lm_head's
// linear_cross_entropy, no [B, T, V] logits) equals the unfused causal_lm_loss(forward(ids))
// in f64: the loss and every parameter's gradient, shifted and unshifted labels with ignored
// positions, untied and tied embeddings, and the unfused fallback of a softcapped head.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "models/transformer/causal_lm.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::max_abs_diff;

namespace {

/// Loss and gradients (by parameter name) of one backward of `loss_fn(m)`.
std::pair<double, std::map<std::string, Tensor>> loss_and_grads(CausalLM& m, const std::function<Tensor()>& loss_fn) {
  for (auto& p : m.parameters()) p.set_grad(Tensor());
  Tensor loss = loss_fn();
  loss.backward();
  std::map<std::string, Tensor> g;
  for (auto& [name, p] : m.named_parameters()) g[name] = p.grad().clone();
  return {loss.item<double>(), g};
}

void check_fused_equals_unfused(const ModelConfig& c) {
  manual_seed(240);
  CausalLM m(c, DType::f64);
  const int64_t B = 2, T = 7;
  std::vector<int64_t> iv(B * T), lv(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    iv[i] = (i * 37 + 5) % c.vocab_size;
    lv[i] = i % 5 == 2 ? -100 : (i * 11 + 1) % c.vocab_size;
  }
  const Tensor ids = from_vector<int64_t>(iv, {B, T}), labels = from_vector<int64_t>(lv, {B, T});
  for (bool shift : {true, false}) {
    INFO("shift " << shift << ", tied " << c.tie_word_embeddings << ", softcap " << c.final_logit_softcapping);
    const auto [ref, gref] = loss_and_grads(m, [&] { return causal_lm_loss(m.forward(ids), labels, shift); });
    const auto [fused, gf] = loss_and_grads(m, [&] { return m.forward_loss(ids, labels, shift); });
    CHECK(fused == Approx(ref).epsilon(1e-12));
    for (const auto& [name, g] : gref) {
      INFO(name);
      CHECK(max_abs_diff(gf.at(name), g) < 1e-12);
    }
  }
}

}  // namespace

TEST_CASE("CausalLM forward_loss through the fused head equals the unfused loss", "[models][fused]") {
  ModelConfig c = llama_debug_config();
  check_fused_equals_unfused(c);
  c.tie_word_embeddings = true;  // lm_head.weight is embed_tokens.weight: both gradients add up
  check_fused_equals_unfused(c);
  c.final_logit_softcapping = 3.0;  // the softcapped head takes the unfused path
  check_fused_equals_unfused(c);
}

TEST_CASE("CausalLM call_list with targets checks them", "[models][fused]") {
  CausalLM m(llama_debug_config(), DType::f32);
  const Tensor ids = zeros({1, 4}, DType::i64);
  CHECK_THROWS_WITH(m.call_list({ids, zeros({1, 3}, DType::i64)}), Catch::Contains("targets must be [B, T]"));
  CHECK_THROWS_WITH(m.call_list({ids, zeros({1, 4}, DType::i32)}), Catch::Contains("targets must be int64"));
  CHECK_THROWS_WITH(causal_lm_loss(m, ids, zeros({1, 4}, DType::i32)), Catch::Contains("labels must be int64"));
  CHECK_THROWS_WITH(causal_lm_loss(m, zeros({1, 1}, DType::i64), zeros({1, 1}, DType::i64)),
                    Catch::Contains("shift needs T >= 2"));
}
