#include "models/formats/qk_permute.h"

#include <cstring>

#include "tensor/error.h"

namespace dtr {

namespace {
// inverse=false: dst[h*d + 2i + j] = src[h*d + j*d/2 + i]   (permute, HF -> GGUF)
// inverse=true:  dst[h*d + j*d/2 + i] = src[h*d + 2i + j]   (unpermute, GGUF -> HF)
void move_rows(const void* src, void* dst, int64_t rows, int64_t cols, size_t elem_bytes, int64_t n_head,
               bool inverse) {
  DTR_CHECK(n_head > 0 && rows % (2 * n_head) == 0, "unpermute_qk: ", rows, " rows are not divisible by 2 * n_head = ",
            2 * n_head);
  DTR_CHECK(src != dst, "unpermute_qk: src and dst must differ");
  const int64_t d = rows / n_head, half = d / 2;
  const size_t rb = static_cast<size_t>(cols) * elem_bytes;
  const auto* s = static_cast<const char*>(src);
  auto* o = static_cast<char*>(dst);
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * d + 2 * i + j, hf_row = h * d + j * half + i;
        const int64_t from = inverse ? gguf_row : hf_row, to = inverse ? hf_row : gguf_row;
        std::memcpy(o + to * rb, s + from * rb, rb);
      }
}

Tensor move_tensor(const Tensor& w, int64_t n_head, bool inverse) {
  DTR_CHECK(w.dim() == 1 || w.dim() == 2, "unpermute_qk: expected a [out, in] weight or [out] bias, got shape ",
            w.sizes());
  Tensor c = w.is_contiguous() ? w : w.contiguous();
  Tensor out = empty(w.sizes(), TensorOptions(w.dtype()));
  const int64_t cols = w.dim() == 2 ? w.size(1) : 1;
  move_rows(c.data_ptr(), out.data_ptr(), w.size(0), cols, itemsize(w.dtype()), n_head, inverse);
  return out;
}
}  // namespace

void unpermute_qk_rows(const void* src, void* dst, int64_t rows, int64_t cols, size_t elem_bytes, int64_t n_head) {
  move_rows(src, dst, rows, cols, elem_bytes, n_head, true);
}
void permute_qk_rows(const void* src, void* dst, int64_t rows, int64_t cols, size_t elem_bytes, int64_t n_head) {
  move_rows(src, dst, rows, cols, elem_bytes, n_head, false);
}

Tensor unpermute_qk(const Tensor& w, int64_t n_head) { return move_tensor(w, n_head, true); }
Tensor permute_qk(const Tensor& w, int64_t n_head) { return move_tensor(w, n_head, false); }

std::vector<float> unpermute_qk(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t n_head) {
  DTR_CHECK(static_cast<int64_t>(w.size()) == rows * cols, "unpermute_qk: ", w.size(), " values for [", rows, ", ",
            cols, "]");
  std::vector<float> out(w.size());
  unpermute_qk_rows(w.data(), out.data(), rows, cols, sizeof(float), n_head);
  return out;
}
std::vector<float> permute_qk(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t n_head) {
  DTR_CHECK(static_cast<int64_t>(w.size()) == rows * cols, "permute_qk: ", w.size(), " values for [", rows, ", ",
            cols, "]");
  std::vector<float> out(w.size());
  permute_qk_rows(w.data(), out.data(), rows, cols, sizeof(float), n_head);
  return out;
}

}  // namespace dtr
