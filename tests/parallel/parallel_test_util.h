#pragma once
// Helpers of the parallel/ tests: a tiny model with uneven parameter sizes built from the nn
// modules (embedding -> 2 x (rms_norm, Linear, silu, Linear, residual) -> rms_norm -> Linear head),
// a deterministic global batch split over data-parallel ranks, and a training loop.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dtensor/api.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/tensor_parallel/style.h"
#include "runtime/env.h"
#include "tensor/nn/embedding.h"
#include "tensor/nn/linear.h"
#include "tensor/nn/module_list.h"
#include "tensor/nn/rms_norm.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/optim/sgd.h"
#include "tensor/random.h"

namespace dtr::testing {

/// Vocabulary 11, width 5, hidden 7: rows 11 / 5 / 7 split unevenly over 2-4 ranks (5 rows on
/// 4 ranks: 2, 2, 1, 0).
constexpr int64_t kVocab = 11, kDim = 5, kHidden = 7, kSeq = 4;
/// Global batch: divisible by dp (1-4) x micro-steps (4).
constexpr int64_t kBatch = 48;

struct Block : nn::Module {
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  Block() {
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(kDim));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kDim, kHidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kDim));
  }
  std::string type_name() const override { return "Block"; }
  Tensor forward(const Tensor& x) override { return add(x, fc2->call(silu(fc1->call(norm->call(x))))); }
};

struct TinyNet : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;
  explicit TinyNet(int n_layers = 2) {
    emb = register_module("emb", std::make_shared<nn::Embedding>(kVocab, kDim));
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < n_layers; ++i) layers->push_back(std::make_shared<Block>());
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(kDim));
    head = register_module("head", std::make_shared<nn::Linear>(kDim, kVocab));
  }
  std::string type_name() const override { return "TinyNet"; }
  Tensor forward(const Tensor& ids) override {
    Tensor h = emb->call(ids);
    for (auto& l : layers->children()) h = l->call(h);
    return head->call(norm->call(h));
  }
};

/// The same initial model on every rank (seeded Philox).
inline std::shared_ptr<TinyNet> make_net(uint64_t seed = 1234, int n_layers = 2) {
  manual_seed(seed);
  return std::make_shared<TinyNet>(n_layers);
}

/// The TP plan of the tiny model: embedding rowwise (vocab rows), fc1 colwise, fc2 rowwise,
/// head colwise with replicated logits. Norm weights stay plain (replicated over tp).
inline ParallelizePlan tiny_tp_plan() {
  return {{"emb", std::make_shared<RowwiseParallel>(Replicate(), Replicate())},
          {"layers.*.fc1", std::make_shared<ColwiseParallel>()},
          {"layers.*.fc2", std::make_shared<RowwiseParallel>()},
          {"head", std::make_shared<ColwiseParallel>(Replicate(), Replicate(), true)}};
}

/// Rows [begin, end) of the global batch of `step`: ids [rows, kSeq] and targets [rows * kSeq].
inline std::pair<Tensor, Tensor> batch_rows(int step, int64_t begin, int64_t end) {
  std::vector<int64_t> ids, tg;
  for (int64_t b = begin; b < end; ++b)
    for (int64_t t = 0; t < kSeq; ++t) {
      const int64_t v = (b * 7 + t * 3 + step * 5 + (b * t) % 5) % kVocab;
      ids.push_back(v);
      tg.push_back((v * 2 + b + 1) % kVocab);
    }
  return {from_vector<int64_t>(ids, {end - begin, kSeq}), from_vector<int64_t>(tg, {(end - begin) * kSeq})};
}

inline Tensor loss_of(nn::Module& m, const Tensor& ids, const Tensor& tg) {
  Tensor logits = m.call(ids);
  return cross_entropy(logits.reshape({-1, kVocab}).to(DType::f32), tg);
}

/// What a run produced: the loss per step (global mean) and the full parameters by FQN.
struct RunResult {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
};

/// Full copies of the parameters (full_tensor for DTensors).
inline std::map<std::string, Tensor> full_params(nn::Module& m) {
  std::map<std::string, Tensor> out;
  for (auto& [n, p] : m.named_parameters()) out[n] = p.is_distributed() ? full_tensor(p.detach()) : p.detach().clone();
  return out;
}

/// Trains `steps` steps on the rows of data-parallel rank `dp_rank` of `dp_size`, with
/// `micro` micro-steps per step (loss / micro each); `sync` toggles gradient sync on the
/// last micro-step only (when set), `after_backward` runs after each step's last backward.
struct TrainSpec {
  int steps = 5;
  int micro = 1;
  int64_t dp_rank = 0, dp_size = 1;
  std::function<void(nn::Module&, bool)> set_sync;     // may be empty
  std::function<void(nn::Module&)> after_backward;      // may be empty
  std::shared_ptr<ProcessGroup> loss_pg;                // averages the loss (may be null)
};

inline std::vector<double> train(nn::Module& m, optim::Optimizer& opt, const TrainSpec& s) {
  std::vector<double> losses;
  const int64_t rows = kBatch / s.dp_size, begin = s.dp_rank * rows, mrows = rows / s.micro;
  for (int step = 0; step < s.steps; ++step) {
    double loss_sum = 0;
    for (int k = 0; k < s.micro; ++k) {
      if (s.set_sync) s.set_sync(m, k == s.micro - 1);
      auto [ids, tg] = batch_rows(step, begin + k * mrows, begin + (k + 1) * mrows);
      Tensor loss = div(loss_of(m, ids, tg), static_cast<double>(s.micro));
      loss.backward();
      loss_sum += loss.item<double>();
    }
    if (s.after_backward) s.after_backward(m);
    opt.step();
    opt.zero_grad();
    if (s.loss_pg) {
      Tensor l = from_vector<double>({loss_sum}, {1});
      s.loss_pg->all_reduce(l, ReduceOp::AVG)->wait();
      loss_sum = l.item<double>();
    }
    losses.push_back(loss_sum);
  }
  return losses;
}

/// Single-process reference run on the whole batch.
inline RunResult reference_run(const std::function<void(TinyNet&)>& prepare, bool sgd, int steps = 5) {
  auto net = make_net();
  if (prepare) prepare(*net);
  std::vector<Tensor> ps;
  for (auto& p : net->parameters())
    if (p.requires_grad()) ps.push_back(p);
  std::unique_ptr<optim::Optimizer> opt;
  if (sgd) opt = std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.1});
  else opt = std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{1e-2});
  TrainSpec s;
  s.steps = steps;
  RunResult r;
  r.losses = train(*net, *opt, s);
  r.params = full_params(*net);
  return r;
}

/// Largest |a - b| over all parameters and the name where it occurs.
inline std::pair<double, std::string> max_param_diff(const std::map<std::string, Tensor>& a,
                                                     const std::map<std::string, Tensor>& b) {
  double worst = 0;
  std::string where;
  for (auto& [n, t] : a) {
    auto it = b.find(n);
    REQUIRE(it != b.end());
    REQUIRE(t.sizes() == it->second.sizes());
    const double d = amax(abs(sub(t.to(DType::f64), it->second.to(DType::f64)))).item<double>();
    if (d > worst) {
      worst = d;
      where = n;
    }
  }
  return {worst, where};
}

}  // namespace dtr::testing
