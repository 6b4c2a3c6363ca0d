#pragma once
// nn::Embedding: a lookup table. Source: torch.nn.Embedding.
#include "tensor/nn/module.h"

namespace dtr::nn {

/// Parameter: weight [num_embeddings, embedding_dim] ~ N(0, 1) from the Philox generator.
/// Input: integer ids of any shape -> [..., embedding_dim]. Errors: ids out of range.
class Embedding : public Module {
 public:
  /// init = false: zeros and no random draw (weights about to be loaded).
  Embedding(int64_t num_embeddings, int64_t embedding_dim, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return "Embedding"; }
  Tensor forward(const Tensor& ids) override;
  Tensor weight() const { return parameter("weight"); }

  const int64_t num_embeddings;
  const int64_t embedding_dim;
};

}  // namespace dtr::nn
