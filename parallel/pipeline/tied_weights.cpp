// Tied weights across pipeline stages (see tied_weights.h).
#include "parallel/pipeline/tied_weights.h"

#include "dtensor/api.h"
#include "parallel/pipeline/p2p.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {

void sum_tied_gradients(ProcessGroup& pg, const Tensor& param, int peer) {
  // A frozen table (LoRA) has no gradient to sum: giving it a zero .grad would keep a whole
  // [vocab, hidden] table alive on both ranks from the first step on and send it every step.
  if (peer == pg.rank() || !param.requires_grad()) return;
  NoGradGuard ng;
  if (!param.grad().defined()) param.set_grad(zeros_like(param));
  Tensor g = param.grad();
  Tensor local = g.is_distributed() ? to_local(g) : g;
  // One tag for the exchange (the activation tags are 0 .. 2 x stages - 1).
  constexpr int kTag = 30000;
  PendingSend s = send_tensor(pg, local, peer, kTag);
  Tensor other = recv_tensor(pg, peer, kTag);
  s.wait();
  DTR_CHECK(other.sizes() == local.sizes() && other.dtype() == local.dtype(), "sum_tied_gradients: this rank's copy ",
            local.sizes(), " ", local.dtype(), " vs pp rank ", peer, "'s ", other.sizes(), " ", other.dtype());
  add_(local, other);
}

}  // namespace dtr
