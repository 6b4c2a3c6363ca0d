// nn::Embedding (see embedding.h).
#include "tensor/nn/embedding.h"

#include "tensor/ops.h"

namespace dtr::nn {

Embedding::Embedding(int64_t num, int64_t dim, DType dtype, bool init) : num_embeddings(num), embedding_dim(dim) {
  DTR_CHECK(num >= 0 && dim >= 0, "Embedding: negative size (num_embeddings ", num, ", embedding_dim ", dim, ")");
  DTR_CHECK(is_floating(dtype), "Embedding: dtype must be floating, got ", dtype);
  register_parameter("weight", init ? normal({num, dim}, 0.0, 1.0, TensorOptions(dtype)) : zeros({num, dim}, TensorOptions(dtype)));
}

Tensor Embedding::forward(const Tensor& ids) { return embedding(ids, weight()); }

}  // namespace dtr::nn
