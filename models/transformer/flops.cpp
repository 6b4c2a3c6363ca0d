#include "models/transformer/flops.h"

#include "models/transformer/causal_lm.h"

namespace dtr {

double llama_matmul_weights(const LlamaConfig& c) {
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.intermediate_size);
  const double D = static_cast<double>(llama_head_dim(c)), H = static_cast<double>(c.num_attention_heads);
  const double KV = static_cast<double>(c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads);
  const double q = H * D, kv = KV * D;
  const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * f;  // q, k, v, o, gate, up, down
  return static_cast<double>(c.num_hidden_layers) * per_layer + h * static_cast<double>(c.vocab_size);
}

double llama_train_flops_per_token(const LlamaConfig& c, bool lora, double lora_weights, double seq) {
  const double N = llama_matmul_weights(c);
  const double attention = 12.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(c.num_attention_heads) *
                           static_cast<double>(llama_head_dim(c)) * seq;
  return (lora ? 4.0 * N + 6.0 * lora_weights : 6.0 * N) + attention;
}

}  // namespace dtr
