#pragma once
// The CPU loop of one fused AdamW step over a contiguous parameter (tensor/optim/adamw.cpp calls
// it). It lives with the CPU kernels so that it is compiled for DTR_KERNEL_ARCH (AVX-512 on this
// project's machines) while the optimizer classes stay on the host -march.
#include <cstdint>

namespace dtr::cpu {

/// Scalars of one AdamW step in the math type C (f64 for f64 parameters, f32 otherwise):
/// decay = 1 - lr * weight_decay, w = 1 - beta1, b2 = beta2, one_minus_b2 = 1 - beta2,
/// bc2_sqrt = sqrt(1 - beta2^t), eps, neg_step = -lr / (1 - beta1^t).
template <class C>
struct AdamWScalars {
  C decay, w, b2, one_minus_b2, bc2_sqrt, eps, neg_step;
};

/// In place over n elements (torch.optim.AdamW's formula with torch.lerp's two-sided
/// interpolation, each operation rounded separately as in PyTorch's fused CPU AdamW):
///   p *= decay;  m = lerp(m, g, w);  v = b2 v + (1 - b2) g^2;
///   p += neg_step * m / (sqrt(v) / bc2_sqrt + eps)
/// P: parameter element type (double, float, bf16, f16); G: gradient element type (same set);
/// C: math type, double when P is double, float otherwise. m and v hold C. Parallel (OpenMP)
/// and vectorised; each element is independent, so the result does not depend on the threads.
template <class P, class G, class C>
void adamw_update(P* p, const G* g, C* m, C* v, int64_t n, const AdamWScalars<C>& s);

}  // namespace dtr::cpu
