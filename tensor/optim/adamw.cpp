// AdamW (see adamw.h).
#include "tensor/optim/adamw.h"

#include <cmath>

#include "tensor/autograd/grad_mode.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/optim/fused_update.h"

namespace dtr::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions opt)
    : Optimizer(std::move(groups), opt.lr, opt.weight_decay), opt_(opt) {
  DTR_CHECK(opt.eps >= 0.0, "AdamW: invalid eps ", opt.eps);
  DTR_CHECK(opt.beta1 >= 0.0 && opt.beta1 < 1.0, "AdamW: invalid beta1 ", opt.beta1, " (expected [0, 1))");
  DTR_CHECK(opt.beta2 >= 0.0 && opt.beta2 < 1.0, "AdamW: invalid beta2 ", opt.beta2, " (expected [0, 1))");
}

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions opt) : AdamW(std::vector<ParamGroup>{ParamGroup{params, std::nullopt, std::nullopt}}, opt) {}

void AdamW::step() {
  NoGradGuard no_grad;
  for (const ParamGroup& group : groups_) {
    const double lr = *group.lr, wd = *group.weight_decay;
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      const detail::UpdateOperands u = detail::prepare(p, g, "AdamW", /*allow_cuda=*/true);
      ParamState& st = state(p);
      if (st.tensors.empty()) {
        const TensorOptions o = TensorOptions(detail::math_dtype(u.param.dtype())).with_device(u.param.device());
        st.tensors["exp_avg"] = zeros(u.param.sizes(), o);
        st.tensors["exp_avg_sq"] = zeros(u.param.sizes(), o);
      }
      st.step += 1;
      // Scalars in double, as torch computes them in Python.
      const double t = static_cast<double>(st.step);
      const double bc1 = 1.0 - std::pow(opt_.beta1, t);
      const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, t));
      const double step_size = lr / bc1;
      const double decay = 1.0 - lr * wd;
      const double w = 1.0 - opt_.beta1;
      const double b2 = opt_.beta2, one_minus_b2 = 1.0 - opt_.beta2, eps = opt_.eps;
      const int64_t n = u.param.numel();
      Tensor m_t = st.tensors.at("exp_avg"), v_t = st.tensors.at("exp_avg_sq");
      if (u.param.device().is_cuda()) {
        // The same math in one CUDA kernel (tensor/ops/cuda/adamw.cu), in place.
        static const OpDef* op = op_def("adamw_update");
        dispatch(OpCall{op, {u.param, u.grad, m_t, v_t}, {decay, w, b2, one_minus_b2, bc2_sqrt, eps, -step_size}});
        u.param.bump_version();
        continue;
      }
      detail::dispatch_update(u, "AdamW", [&](auto* pp, const auto* gp, auto math) {
        using C = decltype(math);
        using P = std::remove_pointer_t<decltype(pp)>;
        C* m = static_cast<C*>(m_t.data_ptr());
        C* v = static_cast<C*>(v_t.data_ptr());
        const C cdecay = static_cast<C>(decay), cw = static_cast<C>(w), cb2 = static_cast<C>(b2),
                c1b2 = static_cast<C>(one_minus_b2), cbc2 = static_cast<C>(bc2_sqrt), ceps = static_cast<C>(eps),
                cstep = static_cast<C>(-step_size);
        // torch.lerp's two-sided formula (exact at both ends): m + w (g - m) for w < 0.5, else
        // g - (g - m)(1 - w). One loop per branch so that the loop vectorises.
        auto update = [&](auto lerp) {
          // Local restrict copies of pointers and scalars: through the lambda's captured
          // references the vectoriser cannot prove them loop-invariant and distinct.
          C* __restrict mp = m;
          C* __restrict vp = v;
          P* __restrict pw = pp;
          const auto* __restrict gr = gp;
          const C kd = cdecay, kb2 = cb2, k1b2 = c1b2, kbc2 = cbc2, keps = ceps, kstep = cstep;
#pragma omp parallel for simd schedule(static) if (n >= 32768)
          for (int64_t i = 0; i < n; ++i) {
            const C gi = detail::load<C>(gr[i]);
            C pi = detail::load<C>(pw[i]) * kd;
            const C mi = lerp(mp[i], gi);
            const C vi = vp[i] * kb2 + k1b2 * gi * gi;
            const C denom = std::sqrt(vi) / kbc2 + keps;
            pi = pi + kstep * (mi / denom);
            mp[i] = mi;
            vp[i] = vi;
            pw[i] = detail::store<P>(pi);
          }
        };
        if (std::abs(w) < 0.5) update([cw](C mo, C g) { return mo + cw * (g - mo); });
        else update([cw](C mo, C g) { return g - (g - mo) * (C(1) - cw); });
      });
      u.param.bump_version();
    }
  }
}

}  // namespace dtr::optim
