// AdamW (see adamw.h).
#include "tensor/optim/adamw.h"

#include <cmath>

#include "tensor/autograd/grad_mode.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/adamw_kernel.h"
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
        C* m = static_cast<C*>(m_t.data_ptr());
        C* v = static_cast<C*>(v_t.data_ptr());
        const cpu::AdamWScalars<C> sc{static_cast<C>(decay),    static_cast<C>(w),   static_cast<C>(b2),
                                      static_cast<C>(one_minus_b2), static_cast<C>(bc2_sqrt), static_cast<C>(eps),
                                      static_cast<C>(-step_size)};
        cpu::adamw_update(pp, gp, m, v, n, sc);
      });
      u.param.bump_version();
    }
  }
}

}  // namespace dtr::optim
