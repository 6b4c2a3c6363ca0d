// SGD (see sgd.h).
#include "tensor/optim/sgd.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/optim/fused_update.h"

namespace dtr::optim {

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions opt)
    : Optimizer(std::move(groups), opt.lr, opt.weight_decay), opt_(opt) {
  DTR_CHECK(opt.momentum >= 0.0, "SGD: invalid momentum ", opt.momentum);
  DTR_CHECK(!opt.nesterov || (opt.momentum > 0.0 && opt.dampening == 0.0),
            "SGD: nesterov momentum requires a momentum and zero dampening (momentum ", opt.momentum, ", dampening ",
            opt.dampening, ")");
}

SGD::SGD(const std::vector<Tensor>& params, SGDOptions opt) : SGD(std::vector<ParamGroup>{ParamGroup{params, std::nullopt, std::nullopt}}, opt) {}

void SGD::step() {
  NoGradGuard no_grad;
  for (const ParamGroup& group : groups_) {
    const double lr = *group.lr, wd = *group.weight_decay;
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      const detail::UpdateOperands u = detail::prepare(p, g, "SGD");
      ParamState& st = state(p);
      const bool use_momentum = opt_.momentum != 0.0;
      const bool first = st.step == 0;
      if (use_momentum && first)
        st.tensors["momentum_buffer"] = zeros(u.param.sizes(), TensorOptions(detail::math_dtype(u.param.dtype())));
      st.step += 1;
      const int64_t n = u.param.numel();
      Tensor buf_t = use_momentum ? st.tensors.at("momentum_buffer") : Tensor();
      detail::dispatch_update(u, "SGD", [&](auto* pp, const auto* gp, auto math) {
        using C = decltype(math);
        using P = std::remove_pointer_t<decltype(pp)>;
        C* buf = use_momentum ? static_cast<C*>(buf_t.data_ptr()) : nullptr;
        const C cwd = static_cast<C>(wd), cmom = static_cast<C>(opt_.momentum),
                cdamp = static_cast<C>(1.0 - opt_.dampening), clr = static_cast<C>(-lr);
        const bool nesterov = opt_.nesterov;
#pragma omp parallel for schedule(static) if (n >= 32768)
        for (int64_t i = 0; i < n; ++i) {
          const C pi = detail::load<C>(pp[i]);
          C d = detail::load<C>(gp[i]);
          if (cwd != C(0)) d = d + cwd * pi;
          if (buf) {
            buf[i] = first ? d : buf[i] * cmom + cdamp * d;
            d = nesterov ? d + cmom * buf[i] : buf[i];
          }
          pp[i] = detail::store<P>(pi + clr * d);
        }
      });
      u.param.bump_version();
    }
  }
}

}  // namespace dtr::optim
