// CUDA kernel of the fused AdamW update ("adamw_update", CUDA only: the CPU runs the same
// loop inline in tensor/optim/adamw.cpp). One thread per element, the CPU loop's math
// operation by operation (f64 for f64 parameters, f32 otherwise; state in that math dtype):
//   p  = p * decay
//   m  = lerp(m, g, w)               (torch.lerp's two-sided formula, w = 1 - beta1)
//   v  = v * beta2 + (1 - beta2) * g * g
//   p  = p + neg_step * (m / (sqrt(v) / bc2_sqrt + eps))
// nvcc may contract a * b + c into one FMA where the host compiler does not, so results can
// differ from the CPU in the last bit; tests compare with a tolerance.
// inputs {param, grad, exp_avg, exp_avg_sq} (contiguous, same shape, one CUDA device),
// attrs {decay, w, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step} (doubles, computed on the
// host exactly as the CPU step computes them). Updates param, exp_avg, exp_avg_sq in place.
#include <cmath>

#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

template <class C>
struct AdamWScalars {
  C decay, w, b2, one_minus_b2, bc2_sqrt, eps, neg_step;
  bool low_w;
};

template <class P, class G, class C>
__global__ void adamw_kernel(P* p, const G* g, C* m, C* v, int64_t n, AdamWScalars<C> k) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    const C gi = static_cast<C>(load(g[i]));
    C pi = static_cast<C>(load(p[i])) * k.decay;
    const C mi = k.low_w ? m[i] + k.w * (gi - m[i]) : gi - (gi - m[i]) * (C(1) - k.w);
    const C vi = v[i] * k.b2 + k.one_minus_b2 * gi * gi;
    const C denom = sqrt(vi) / k.bc2_sqrt + k.eps;
    pi = pi + k.neg_step * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    p[i] = store<P>(pi);
  }
}

std::vector<Tensor> k_adamw_update(const OpCall& c) {
  const Tensor& p = c.inputs[0];
  const Tensor& g = c.inputs[1];
  const Tensor& m = c.inputs[2];
  const Tensor& v = c.inputs[3];
  const DType math = p.dtype() == DType::f64 ? DType::f64 : DType::f32;
  DTR_CHECK(g.sizes() == p.sizes() && m.sizes() == p.sizes() && v.sizes() == p.sizes(),
            "adamw_update: shapes differ: param ", p.sizes(), ", grad ", g.sizes(), ", exp_avg ", m.sizes(),
            ", exp_avg_sq ", v.sizes());
  DTR_CHECK(p.is_contiguous() && g.is_contiguous() && m.is_contiguous() && v.is_contiguous(),
            "adamw_update: expected contiguous param, grad and state of shape ", p.sizes());
  DTR_CHECK(m.dtype() == math && v.dtype() == math, "adamw_update: state must be ", math, " for a ", p.dtype(),
            " parameter, got ", m.dtype(), " / ", v.dtype());
  const int64_t n = p.numel();
  if (n == 0) return {};
  DeviceGuard guard(p.device());
  cudaStream_t s = cuda::current_stream();
  auto with_types = [&](auto ptag, auto gtag) {
    using P = decltype(ptag);
    using G = decltype(gtag);
    using C = std::conditional_t<std::is_same_v<P, double>, double, float>;
    AdamWScalars<C> k{static_cast<C>(c.f(0)), static_cast<C>(c.f(1)), static_cast<C>(c.f(2)),
                      static_cast<C>(c.f(3)), static_cast<C>(c.f(4)), static_cast<C>(c.f(5)),
                      static_cast<C>(c.f(6)), std::abs(c.f(1)) < 0.5};
    adamw_kernel<P, G, C><<<blocks_for(n), kThreads, 0, s>>>(static_cast<P*>(p.data_ptr()),
                                                             static_cast<const G*>(g.data_ptr()),
                                                             static_cast<C*>(m.data_ptr()),
                                                             static_cast<C*>(v.data_ptr()), n, k);
  };
  dispatch_floating(p.dtype(), "adamw_update", [&](auto ptag) {
    dispatch_floating(g.dtype(), "adamw_update", [&](auto gtag) { with_types(ptag, gtag); });
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {};
}

// EXACT: the kernel updates its inputs in place, an upcast copy would drop the update.
DTR_REGISTER_KERNEL_EXACT("adamw_update", DeviceType::CUDA, k_adamw_update);

}  // namespace
}  // namespace dtr::cuda_ops
