#pragma once
// The row loop of the CPU swiglu_weighted kernel (nn_swiglu_kernels.cpp), for grouped_mm_swiglu's
// kernel (grouped_mm_kernels.cpp), which runs it on each row block right after its GEMM.
#include <cstdint>

namespace dtr::cpu {

/// h[r] = w[r] * silu(gu[r, 0:I]) * gu[r, I:2I] for rows r in [r0, r1) of a contiguous gu
/// [R, 2I] (h [R, I], w [R]); T = float (Eigen packet math) or double. The swiglu_weighted
/// kernel's own loop: the same bits.
template <class T>
void swiglu_weighted_rows(const T* gu, const T* w, T* h, int64_t r0, int64_t r1, int64_t I);

}  // namespace dtr::cpu
