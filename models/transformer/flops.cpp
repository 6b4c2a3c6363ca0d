#include "models/transformer/flops.h"

#include <algorithm>

#include "models/transformer/causal_lm.h"

namespace dtr {

double llama_matmul_weights(const LlamaConfig& c) {
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.intermediate_size);
  const double D = static_cast<double>(llama_head_dim(c)), H = static_cast<double>(c.num_attention_heads);
  const double KV = static_cast<double>(c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads);
  const double q = H * D, kv = KV * D;
  const double attention = h * q + 2 * h * kv + q * h;  // q, k, v, o
  // MoE layer: router [E, h] + k active experts of gate, up, down [moe_I, h] each.
  const double moe_mlp = h * static_cast<double>(c.num_experts) +
                         static_cast<double>(c.num_experts_per_tok) * 3 * h * static_cast<double>(c.moe_intermediate_size);
  double n = h * static_cast<double>(c.vocab_size);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) n += attention + (c.is_moe_layer(l) ? moe_mlp : 3 * h * f);
  return n;
}

double llama_train_flops_per_token(const LlamaConfig& c, bool lora, double lora_weights, double seq) {
  const double N = llama_matmul_weights(c);
  // Keys a query is counted against: the full sequence (no causal halving), or on a
  // sliding-window layer min(seq, window), the band the attention kernel computes.
  double keys = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    keys += c.is_sliding(l) && c.sliding_window > 0 ? std::min(seq, static_cast<double>(c.sliding_window)) : seq;
  const double attention =
      12.0 * static_cast<double>(c.num_attention_heads) * static_cast<double>(llama_head_dim(c)) * keys;
  return (lora ? 4.0 * N + 6.0 * lora_weights : 6.0 * N) + attention;
}

double active_weights(const LlamaConfig& c, const std::string& fqn, int64_t numel) {
  const double n = static_cast<double>(numel);
  if (c.num_experts <= 0 || fqn.find("mlp.experts.") == std::string::npos) return n;
  return n * static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_experts);
}

}  // namespace dtr
