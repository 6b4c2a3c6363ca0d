#pragma once
// The debug Llama and its token batches shared by the FSDP / FSDP + TP Llama tests.
#include <memory>
#include <string>
#include <vector>

#include "models/transformer/causal_lm.h"
#include "models/lora/inject.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr::testing {

/// The debug Llama (llama_debug_config, or `config`), seeded 42; with `lora`, LoRA r 4 alpha 8 on
/// the default targets and lora_B drawn from N(0, 0.02) (B starts at zero, which would leave A
/// without gradient at step 1).
inline std::shared_ptr<LlamaForCausalLM> make_debug_llama(bool lora, const ModelConfig& config = llama_debug_config()) {
  manual_seed(42);
  auto m = std::make_shared<LlamaForCausalLM>(config);
  if (lora) {
    LoraConfig lc;
    lc.options.r = 4;
    lc.options.alpha = 8;
    apply_lora(*m, lc);
    NoGradGuard g;
    for (auto& [n, p] : m->named_parameters())
      if (n.find("lora_B") != std::string::npos) p.copy_(normal(p.sizes(), 0.0, 0.02));
  }
  return m;
}

/// Token ids [b1 - b0, seq] of global batch rows b0..b1 at optimizer step `step` (ids < 128, a
/// fixed formula, so every rank can build its own rows of the same global batch).
inline Tensor debug_token_rows(int step, int64_t b0, int64_t b1, int64_t seq) {
  std::vector<int64_t> ids;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t t = 0; t < seq; ++t) ids.push_back((b * 13 + t * 7 + step * 3 + (b * t) % 11) % 128);
  return from_vector<int64_t>(ids, {b1 - b0, seq});
}

}  // namespace dtr::testing
