#pragma once
// Shared by the model tests that compare a parallelised causal LM with the single process: a few
// AdamW steps on rows of a global batch, and the comparison of losses and every parameter.
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "dtensor/api.h"
#include "models/transformer/causal_lm.h"
#include "runtime/device_mesh.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"

namespace dtr::testing {

struct TrainRun {
  std::vector<double> losses;           // per step, averaged over the ranks (equal token counts)
  std::map<std::string, Tensor> params;  // full tensors after the last step
};

/// `steps` AdamW steps (lr 1e-3) of causal_lm_loss on rows(step, b0, b1) = this data-parallel
/// rank's rows [dp_rank * batch / dp, (dp_rank + 1) * batch / dp) of each global batch; `finish`
/// completes the backward (FSDP / DDP) when given.
inline TrainRun train_adamw(CausalLM& m, const std::function<Tensor(int, int64_t, int64_t)>& rows, int64_t batch,
                            int64_t dp_rank, int64_t dp, const std::function<void()>& finish, int steps = 5) {
  std::vector<Tensor> ps;
  for (auto& p : m.parameters())
    if (p.requires_grad()) ps.push_back(p);
  optim::AdamW adam(ps, optim::AdamWOptions{1e-3});
  auto loss_pg = DeviceMesh::world("loss").group(0);
  TrainRun r;
  const int64_t n = batch / dp;
  for (int step = 0; step < steps; ++step) {
    Tensor ids = rows(step, dp_rank * n, (dp_rank + 1) * n);
    Tensor loss = causal_lm_loss(m.call(ids), ids);
    loss.backward();
    if (finish) finish();
    adam.step();
    adam.zero_grad();
    Tensor l = from_vector<double>({(loss.is_distributed() ? full_tensor(loss.detach()) : loss).item<double>()}, {1});
    loss_pg->all_reduce(l, ReduceOp::AVG)->wait();  // tp ranks hold equal losses, dp ranks the mean of theirs
    r.losses.push_back(l.item<double>());
  }
  for (auto& [name, p] : m.named_parameters())
    r.params[name] = p.is_distributed() ? full_tensor(p.detach()) : p.detach().clone();
  return r;
}

/// Losses within loss_rel_tol (relative) and every parameter within param_tol (max abs).
inline void check_same_run(const TrainRun& ref, const TrainRun& got, double loss_rel_tol, double param_tol) {
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i << " single " << ref.losses[i] << " parallel " << got.losses[i]);
    CHECK(std::abs(ref.losses[i] - got.losses[i]) <= loss_rel_tol * ref.losses[i]);
  }
  double worst = 0;
  std::string where;
  for (auto& [n, t] : ref.params) {
    REQUIRE(got.params.count(n));
    REQUIRE(got.params.at(n).sizes() == t.sizes());
    const double d = amax(abs(sub(t, got.params.at(n)))).item<double>();
    if (d > worst) worst = d, where = n;
  }
  INFO("max |param diff| " << worst << " at " << where);
  CHECK(worst <= param_tol);
}

}  // namespace dtr::testing
