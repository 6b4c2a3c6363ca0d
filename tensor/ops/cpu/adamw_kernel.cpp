#include "tensor/ops/cpu/adamw_kernel.h"

#include <cmath>

#include "tensor/dtype.h"

namespace dtr::cpu {
namespace {

/// One loop per lerp branch so that the loop vectorises; pointers and scalars are restrict
/// locals (through captured references the vectoriser could not prove them invariant and
/// distinct and fell back to scatters).
template <class P, class G, class C, class Lerp>
void run(P* __restrict pw, const G* __restrict gr, C* __restrict mp, C* __restrict vp, int64_t n,
         const AdamWScalars<C> s, Lerp lerp) {
  const C kd = s.decay, kb2 = s.b2, k1b2 = s.one_minus_b2, kbc2 = s.bc2_sqrt, keps = s.eps, kstep = s.neg_step;
#pragma omp parallel for simd schedule(static) if (n >= 32768)
  for (int64_t i = 0; i < n; ++i) {
    const C gi = elem::load<C>(gr[i]);
    C pi = elem::load<C>(pw[i]) * kd;
    const C mi = lerp(mp[i], gi);
    const C vi = vp[i] * kb2 + k1b2 * gi * gi;
    const C denom = std::sqrt(vi) / kbc2 + keps;
    pi = pi + kstep * (mi / denom);
    mp[i] = mi;
    vp[i] = vi;
    pw[i] = elem::store<P>(pi);
  }
}

}  // namespace

template <class P, class G, class C>
void adamw_update(P* p, const G* g, C* m, C* v, int64_t n, const AdamWScalars<C>& s) {
  const C w = s.w;
  // torch.lerp's two-sided formula (exact at both ends): m + w (g - m) for |w| < 0.5, else
  // g - (g - m)(1 - w).
  if (std::abs(w) < C(0.5)) run(p, g, m, v, n, s, [w](C mo, C gi) { return mo + w * (gi - mo); });
  else run(p, g, m, v, n, s, [w](C mo, C gi) { return gi - (gi - mo) * (C(1) - w); });
}

#define DTR_ADAMW_FOR_GRADS(P, C)                                                          \
  template void adamw_update<P, double, C>(P*, const double*, C*, C*, int64_t, const AdamWScalars<C>&); \
  template void adamw_update<P, float, C>(P*, const float*, C*, C*, int64_t, const AdamWScalars<C>&);   \
  template void adamw_update<P, bf16, C>(P*, const bf16*, C*, C*, int64_t, const AdamWScalars<C>&);     \
  template void adamw_update<P, f16, C>(P*, const f16*, C*, C*, int64_t, const AdamWScalars<C>&);
DTR_ADAMW_FOR_GRADS(double, double)
DTR_ADAMW_FOR_GRADS(float, float)
DTR_ADAMW_FOR_GRADS(bf16, float)
DTR_ADAMW_FOR_GRADS(f16, float)
#undef DTR_ADAMW_FOR_GRADS

}  // namespace dtr::cpu
