// MoE block (see moe.h).
#include "tensor/nn/moe.h"

#include <algorithm>
#include <cmath>

#include "tensor/autograd/checkpoint.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/ops/moe_permute.h"
#include "tensor/ops/nn_swiglu.h"

namespace dtr::nn {
namespace {

/// int64 tensor of `v` on `device`.
Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  Tensor t = from_vector<int64_t>(v, {static_cast<int64_t>(v.size())});
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace

/// Routing of N tokens: the top-k experts of each (ties: lower index first) and the sorted
/// position of each token copy.
struct MoERouting {
  std::vector<int64_t> score_index;  // [N*k]: t * E + e of slot t*k + j (into the flat scores)
  std::vector<int64_t> slot_position;  // [N*k]: sorted position of slot s
  Shape counts;                        // [E]
};

namespace {

/// The top-k of each row of s [N, E] into r (score_index, counts): one pass over the row keeping
/// the best k in descending order; a score enters only when strictly greater than the one it
/// passes, so among equal scores the lower expert index comes first (the order of a stable sort
/// by descending score).
template <class T>
void top_k_rows(const T* s, int64_t N, int64_t E, int64_t k, MoERouting& r) {
  std::vector<T> best_v(k);
  std::vector<int64_t> best_e(k);
  for (int64_t t = 0; t < N; ++t) {
    const T* row = s + t * E;
    int64_t n = 0;
    for (int64_t e = 0; e < E; ++e) {
      const T v = row[e];
      if (n == k && !(v > best_v[k - 1])) continue;
      int64_t i = n < k ? n++ : k - 1;
      for (; i > 0 && v > best_v[i - 1]; --i) {
        best_v[i] = best_v[i - 1];
        best_e[i] = best_e[i - 1];
      }
      best_v[i] = v;
      best_e[i] = e;
    }
    for (int64_t j = 0; j < k; ++j) {
      r.score_index[t * k + j] = t * E + best_e[j];
      ++r.counts[best_e[j]];
    }
  }
}

MoERouting route_on_host(const Tensor& scores, int64_t k) {
  const int64_t N = scores.size(0), E = scores.size(1);
  Tensor s = scores.detach().to(Device::cpu());
  if (s.dtype() != DType::f32 && s.dtype() != DType::f64) s = to_dtype(s, DType::f64);
  s = s.contiguous();
  MoERouting r;
  r.score_index.resize(N * k);
  r.counts.assign(E, 0);
  if (s.dtype() == DType::f32)
    top_k_rows(static_cast<const float*>(s.data_ptr()), N, E, k, r);
  else
    top_k_rows(static_cast<const double*>(s.data_ptr()), N, E, k, r);
  // Stable counting sort of the slots by expert.
  std::vector<int64_t> next(E, 0);
  for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + r.counts[e - 1];
  r.slot_position.resize(N * k);
  for (int64_t slot = 0; slot < N * k; ++slot) {
    const int64_t e = r.score_index[slot] % E;
    const int64_t p = next[e]++;
    r.slot_position[slot] = p;
  }
  return r;
}

/// The experts' weights as the grouped GEMMs use them (local experts under expert parallelism).
struct ExpertWeights {
  Tensor w1, w2;          // [G, 2I, H], [G, H, I]
  Tensor a1, b1, a2, b2;  // LoRA (undefined without): [G, r, H], [G, 2I, r], [G, r, I], [G, H, r]
  double scale = 0;
};

/// x W_g^T per group (+ scale * (x A_g^T) B_g^T with LoRA).
Tensor grouped_linear(const Tensor& x, const Shape& counts, const Tensor& w, const Tensor& a, const Tensor& b,
                      double scale) {
  Tensor y = grouped_mm(x, w.transpose(1, 2), counts);
  if (!a.defined()) return y;
  return add(y, mul(grouped_mm(grouped_mm(x, a.transpose(1, 2), counts), b.transpose(1, 2), counts), scale));
}

/// Experts' SwiGLU MLP on rows sorted by expert; row_weights (undefined: none) scale each row's
/// hidden activations before the down projection.
Tensor expert_mlp(const Tensor& x, const Shape& counts, const ExpertWeights& w, const Tensor& row_weights) {
  // Without LoRA the gate_up GEMM and the weighted SwiGLU are one op (each row block's SwiGLU
  // right after its GEMM, while it is in the cache; the same values and backward).
  if (row_weights.defined() && !w.a1.defined())
    return grouped_linear(grouped_mm_swiglu(x, w.w1.transpose(1, 2), counts, row_weights), counts, w.w2, w.a2, w.b2,
                          w.scale);
  const Tensor gu = grouped_linear(x, counts, w.w1, w.a1, w.b1, w.scale);
  return grouped_linear(row_weights.defined() ? swiglu_weighted(gu, row_weights) : swiglu(gu), counts, w.w2, w.a2, w.b2,
                        w.scale);
}

}  // namespace

void MoEConfig::validate() const {
  DTR_CHECK(hidden_size > 0 && moe_intermediate_size > 0, "MoE: hidden_size=", hidden_size,
            " and moe_intermediate_size=", moe_intermediate_size, " must be > 0");
  DTR_CHECK(num_experts > 0, "MoE: num_experts=", num_experts, " must be > 0");
  DTR_CHECK(num_experts_per_tok > 0 && num_experts_per_tok <= num_experts, "MoE: num_experts_per_tok=",
            num_experts_per_tok, " must be in [1, num_experts=", num_experts, "]");
  DTR_CHECK(score_func == "softmax" || score_func == "sigmoid", "MoE: score_func='", score_func,
            "': expected softmax or sigmoid");
  DTR_CHECK(hidden_act == "silu", "MoE: hidden_act='", hidden_act, "': only silu (SwiGLU experts) is built");
}

TopKRouter::TopKRouter(int64_t num_experts, int64_t hidden_size, DType dtype) {
  register_parameter("weight", zeros({num_experts, hidden_size}, TensorOptions(dtype)));
}

GroupedExperts::GroupedExperts(int64_t E, int64_t H, int64_t I, DType dtype, bool init)
    : num_experts(E), hidden_size(H), intermediate_size(I) {
  DTR_CHECK(E > 0 && H > 0 && I > 0, "GroupedExperts: sizes must be > 0 (experts ", E, ", hidden ", H,
            ", intermediate ", I, ")");
  const TensorOptions opt(dtype);
  if (init) {
    const double b1 = 1.0 / std::sqrt(static_cast<double>(H)), b2 = 1.0 / std::sqrt(static_cast<double>(I));
    register_parameter("gate_up_proj", uniform({E, 2 * I, H}, -b1, b1, opt));
    register_parameter("down_proj", uniform({E, H, I}, -b2, b2, opt));
  } else {
    register_parameter("gate_up_proj", zeros({E, 2 * I, H}, opt));
    register_parameter("down_proj", zeros({E, H, I}, opt));
  }
}

std::vector<Tensor> GroupedExperts::forward_list(const std::vector<Tensor>& in) {
  DTR_CHECK((in.size() == 2 || in.size() == 3) && in[1].dtype() == DType::i64 && in[1].device().is_cpu() &&
                in[1].dim() == 1,
            "GroupedExperts: expected inputs {x [M, hidden], counts (int64 CPU [num_experts])[, row_weights [M]]}");
  const Tensor& x = in[0];
  DTR_CHECK(x.dim() == 2 && x.size(1) == hidden_size, "GroupedExperts: x ", x.sizes(), " (expected [M, ", hidden_size,
            "])");
  const Tensor row_weights = in.size() == 3 ? in[2] : Tensor();
  DTR_CHECK(!row_weights.defined() || (row_weights.dim() == 1 && row_weights.size(0) == x.size(0)),
            "GroupedExperts: row_weights ", row_weights.sizes(), " (expected [", x.size(0), "])");
  DTR_CHECK(!row_weights.defined() || !dispatcher_,
            "GroupedExperts: row_weights with a token dispatcher (expert parallelism) are not built; the MoE block ",
            "applies the routing weights in the combine there");
  const Shape counts = in[1].contiguous().to_vector<int64_t>();
  DTR_CHECK(static_cast<int64_t>(counts.size()) == num_experts, "GroupedExperts: ", counts.size(),
            " counts for ", num_experts, " experts");
  ExpertWeights w{parameter("gate_up_proj"), parameter("down_proj")};
  if (has_lora()) {
    w.a1 = parameter("gate_up_proj_lora_A");
    w.b1 = parameter("gate_up_proj_lora_B");
    w.a2 = parameter("down_proj_lora_A");
    w.b2 = parameter("down_proj_lora_B");
    w.scale = lora_scale_;
  }
  if (!dispatcher_) return {expert_mlp(x, counts, w, row_weights)};
  auto [xl, local_counts] = dispatcher_->dispatch(x, counts);
  for (Tensor* t : {&w.w1, &w.w2, &w.a1, &w.b1, &w.a2, &w.b2})
    if (t->defined()) *t = dispatcher_->local_experts(*t);
  return {dispatcher_->combine(expert_mlp(xl, local_counts, w, Tensor()))};
}

void GroupedExperts::enable_lora(const LoraOptions& o) {
  DTR_CHECK(!has_lora(), "GroupedExperts: LoRA is already enabled");
  DTR_CHECK(o.dropout == 0.0, "GroupedExperts: LoRA dropout on experts is not built (got dropout=", o.dropout,
            "; use 0)");
  const double scale = lora_scale(o);
  const int64_t E = num_experts, r = o.r;
  const DType dt = parameter("gate_up_proj").dtype();
  auto make_a = [&](int64_t in) {
    if (o.init == LoraInit::kaiming) {
      const double b = 1.0 / std::sqrt(static_cast<double>(in));
      return uniform({E, r, in}, -b, b, TensorOptions(dt));
    }
    return normal({E, r, in}, 0.0, std::sqrt(2.0 / static_cast<double>(in + r)), TensorOptions(dt));
  };
  for (const char* n : {"gate_up_proj", "down_proj"}) parameter(n).set_requires_grad(false);
  register_parameter("gate_up_proj_lora_A", make_a(hidden_size));
  register_parameter("gate_up_proj_lora_B", zeros({E, 2 * intermediate_size, r}, TensorOptions(dt)));
  register_parameter("down_proj_lora_A", make_a(intermediate_size));
  register_parameter("down_proj_lora_B", zeros({E, hidden_size, r}, TensorOptions(dt)));
  lora_ = o;
  lora_scale_ = scale;
}

MoE::MoE(const MoEConfig& c, DType dtype, bool init, std::shared_ptr<Module> shared_expert, bool shared_expert_gate)
    : config_(c) {
  c.validate();
  register_module("gate", std::make_shared<TopKRouter>(c.num_experts, c.hidden_size, dtype));
  register_module("experts",
                  std::make_shared<GroupedExperts>(c.num_experts, c.hidden_size, c.moe_intermediate_size, dtype, init));
  if (shared_expert) register_module("shared_expert", shared_expert);
  if (shared_expert_gate) {
    DTR_CHECK(shared_expert != nullptr, "MoE: shared_expert_gate without a shared_expert");
    register_module("shared_expert_gate", std::make_shared<Linear>(c.hidden_size, 1, false, dtype, init));
  }
}

std::shared_ptr<GroupedExperts> MoE::experts() const {
  for (auto& [n, m] : named_children())
    if (n == "experts") return std::static_pointer_cast<GroupedExperts>(m);
  DTR_ERROR("MoE: no experts module");
}

std::shared_ptr<TopKRouter> MoE::gate() const {
  for (auto& [n, m] : named_children())
    if (n == "gate") return std::static_pointer_cast<TopKRouter>(m);
  DTR_ERROR("MoE: no gate module");
}

Tensor MoE::forward(const Tensor& x) {
  const MoEConfig& c = config_;
  DTR_CHECK(!x.is_distributed(), "MoE: the input is a distributed tensor; the MoE block runs on local tokens ",
            "(a tensor-parallel plan must hand it a plain tensor)");
  DTR_CHECK(x.dim() >= 1 && x.size(-1) == c.hidden_size, "MoE: input ", x.sizes(), " (expected [..., ", c.hidden_size,
            "])");
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, H = c.hidden_size;
  const Tensor x2 = reshape(x, {-1, H});
  const int64_t N = x2.size(0);

  const Tensor logits = linear(x2, gate()->weight());  // [N, E]
  const Tensor lf = is_low_precision(logits.dtype()) ? logits.to(DType::f32) : logits;
  const Tensor scores = c.score_func == "softmax" ? softmax(lf, -1) : sigmoid(lf);
  if (!(checkpoint_recomputing() && routing_ && static_cast<int64_t>(routing_->slot_position.size()) == N * k)) {
    routing_ = std::make_shared<const MoERouting>(route_on_host(scores, k));
    ++routings_;
  }
  const MoERouting& r = *routing_;

  // Router statistics for the auxiliary losses.
  stats_.tokens_per_expert = r.counts;
  stats_.num_tokens = N;
  stats_.prob_sum = sum(c.score_func == "softmax" ? scores : div(scores, sum(scores, {1}, true)), {0});
  {
    Tensor m;
    {
      NoGradGuard ng;
      m = amax(lf, {1}, true);
    }
    const Tensor lse = add(log(sum(exp(sub(lf, m)), {1})), reshape(m, {N}));
    stats_.z_sum = sum(mul(lse, lse));
  }

  // Top-k weights gathered from the scores (a row gather of the flat scores, differentiable).
  Tensor w = reshape(embedding(index_tensor(r.score_index, x.device()), reshape(scores, {N * E, 1})), {N, k});
  if (c.norm_topk_prob) w = div(w, sum(w, {1}, true));
  if (w.dtype() != x.dtype()) w = w.to(x.dtype());

  // Token copies sorted by expert -> experts -> back to (token, slot) order, weighted sum. Without
  // expert parallelism the weights scale the experts' hidden rows (swiglu_weighted(gate_up, weights), in
  // sorted order) and the combine is a plain sum: its backward is a gather, with no read of the
  // expert outputs for the weights' gradient (that comes out of the SwiGLU backward, which reads
  // its rows anyway). A dispatcher moves only the token rows, so there the combine weights them.
  const Tensor slot_position = index_tensor(r.slot_position, x.device());
  const Tensor xs = moe_permute(x2, slot_position, k);
  const Tensor counts = from_vector<int64_t>(r.counts, {E});
  Tensor out;
  if (experts()->dispatcher()) {
    out = moe_unpermute(experts()->call_list({xs, counts}).at(0), slot_position, w);
  } else {
    // The weights in sorted order: moe_permute of the [N k] slots with k = 1 (a permutation both
    // ways: its backward is a gather too, no zero-filled scatter).
    const Tensor ws = reshape(moe_permute(reshape(w, {N * k, 1}), slot_position, 1), {N * k});
    out = moe_unpermute(experts()->call_list({xs, counts, ws}).at(0), slot_position, k);
  }

  if (has_module("shared_expert")) {
    Tensor s = get_submodule("shared_expert")->call(x2);
    if (has_module("shared_expert_gate")) s = mul(sigmoid(get_submodule("shared_expert_gate")->call(x2)), s);
    out = add(out, s);
  }
  return reshape(out, x.sizes());
}

std::vector<std::shared_ptr<MoE>> moe_modules(Module& model) {
  std::vector<std::shared_ptr<MoE>> out;
  for (auto& [fqn, m] : model.named_modules())
    if (auto p = std::dynamic_pointer_cast<MoE>(m)) out.push_back(p);
  return out;
}

Tensor load_balancing_loss(const std::vector<RouterStats>& stats) {
  DTR_CHECK(!stats.empty(), "load_balancing_loss: no router statistics (run the model forward first)");
  const size_t E = stats[0].tokens_per_expert.size();
  std::vector<double> f(E, 0.0);
  int64_t n = 0;
  Tensor p;
  for (const RouterStats& s : stats) {
    DTR_CHECK(s.tokens_per_expert.size() == E && s.prob_sum.defined(), "load_balancing_loss: router stats of ",
              s.tokens_per_expert.size(), " experts beside ", E, " (or a router that did not run)");
    for (size_t e = 0; e < E; ++e) f[e] += static_cast<double>(s.tokens_per_expert[e]);
    n += s.num_tokens;
    p = p.defined() ? add(p, s.prob_sum) : s.prob_sum;
  }
  const double scale = static_cast<double>(E) / (static_cast<double>(n) * static_cast<double>(n));
  const Tensor fe = from_vector<double>(f, {static_cast<int64_t>(E)}).to(p.dtype());
  return mul(sum(mul(fe.device() == p.device() ? fe : fe.to(p.device()), p)), scale);
}

Tensor router_z_loss(const std::vector<RouterStats>& stats) {
  DTR_CHECK(!stats.empty(), "router_z_loss: no router statistics (run the model forward first)");
  Tensor z;
  int64_t n = 0;
  for (const RouterStats& s : stats) {
    DTR_CHECK(s.z_sum.defined(), "router_z_loss: a router that did not run");
    z = z.defined() ? add(z, s.z_sum) : s.z_sum;
    n += s.num_tokens;
  }
  return div(z, static_cast<double>(n));
}

Tensor moe_auxiliary_loss(Module& model, double aux_coef, double z_coef) {
  std::vector<RouterStats> stats;
  for (const auto& m : moe_modules(model)) {
    stats.push_back(m->last_router_stats());
    DTR_CHECK(!grad_enabled() || !stats.back().prob_sum.defined() || stats.back().prob_sum.requires_grad() ||
                  !m->gate()->weight().requires_grad() || (aux_coef == 0.0 && z_coef == 0.0),
              "moe_auxiliary_loss: a MoE block's router statistics carry no autograd graph (it ran under no_grad or ",
              "inside a fully checkpointed layer); an auxiliary loss with activation checkpointing is not built");
  }
  if (stats.empty() || (aux_coef == 0.0 && z_coef == 0.0)) return Tensor();
  Tensor loss;
  if (aux_coef != 0.0) loss = mul(load_balancing_loss(stats), aux_coef);
  if (z_coef != 0.0) {
    const Tensor z = mul(router_z_loss(stats), z_coef);
    loss = loss.defined() ? add(loss, z) : z;
  }
  return loss;
}

}  // namespace dtr::nn
