#pragma once
// llama.cpp's Q/K row permutation and its inverse.
// llama.cpp's convert_hf_to_gguf.py stores q_proj / k_proj weights with the rows of every
// head interleaved for its "normal" RoPE (pairs (x[2i], x[2i+1])), while Hugging Face Llama
// rotates halves (pairs (x[i], x[i + d/2])). Per head of `head_dim` = rows / n_head rows:
//   permute:   gguf_row[h*d + 2*i + j] = hf_row[h*d + j*(d/2) + i]   (i < d/2, j in {0, 1})
//   unpermute: hf_row[h*d + j*(d/2) + i] = gguf_row[h*d + 2*i + j]
// Use n_head = num_attention_heads for q_proj and num_key_value_heads for k_proj.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

/// Undoes llama.cpp's permutation on a row-major [rows, cols] matrix of `elem_bytes`-sized
/// elements (cols = 1 for a bias). Errors: rows not divisible by 2 * n_head.
void unpermute_qk_rows(const void* src, void* dst, int64_t rows, int64_t cols, size_t elem_bytes, int64_t n_head);
/// Applies llama.cpp's permutation (HF -> GGUF order), the inverse of unpermute_qk_rows.
void permute_qk_rows(const void* src, void* dst, int64_t rows, int64_t cols, size_t elem_bytes, int64_t n_head);

/// HF order of a GGUF q/k weight [out, in] (or bias [out]); any dtype; returns a new
/// contiguous tensor. Errors: dim 0 not divisible by 2 * n_head, more than 2 dims.
Tensor unpermute_qk(const Tensor& w, int64_t n_head);
/// GGUF order of an HF q/k weight (inverse of unpermute_qk).
Tensor permute_qk(const Tensor& w, int64_t n_head);

/// f32 vector forms (row-major [rows, cols]).
std::vector<float> unpermute_qk(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t n_head);
std::vector<float> permute_qk(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t n_head);

}  // namespace dtr
