// Sharding rules of pointwise ops (unary, binary with broadcasting, scalar ops, where,
// comparisons, the fused swiglu / geglu and their backwards) and of copies / casts / in-place
// updates.
// The output follows one input's sharding (each input is tried; the cheapest wins); other
// inputs are mapped through broadcasting. Partial survives only ops linear in it: to_dtype,
// clone, neg, mul/div by a scalar, add/sub of operands that are all Partial, mul by a
// replicated factor, div of a Partial numerator, maximum with Partial(max); not integer division
// (it truncates each rank's term) nor a cast to an integer / bool dtype (it rounds each term). Adding a replicated
// operand to a Partial one scales the replicated operand by 1/n locally (R -> P), no reduction.
// A scalar added to a Partial tensor forces a reduction first, so it is added once.
// StridedShard inputs (FSDP + TP parameters) are followed like shards: no communication.
// Source: PyTorch torch.distributed.tensor._ops._pointwise_ops.
#include "dtensor/rules/common.h"

namespace dtr::rules {
namespace {

enum class Linearity { None, Unary, Additive, Multiplicative, Divide, Max };

/// False when op `s` on a Partial(sum) input `x` is not the op of the pending sum even though it
/// is linear over the reals: integer division truncates each rank's term (1/2 + 1/2 is 0, 2/2 is
/// 1) and a cast to an integer or bool dtype rounds each term; such inputs are reduced first.
bool exact_on_partial(const OpSchema& s, const DTensorSpec& x) {
  const std::string& op = s.call.op->name;
  if (op == "to_dtype") return is_floating(s.call.dtype(0));
  if (op == "div" || op == "div_scalar") return is_floating(x.dtype);
  return true;
}

/// Strategy where the output follows input `k`.
Strategy follow(const OpSchema& s, size_t k, const Shape& out, Linearity lin) {
  const DTensorSpec& fk = s.spec(k);
  const bool exact = exact_on_partial(s, fk);
  const int nd = s.mesh.ndim();
  Placements out_pl(nd, Replicate());
  const int64_t lead = static_cast<int64_t>(out.size()) - static_cast<int64_t>(fk.shape.size());
  for (int i = 0; i < nd; ++i) {
    const Placement& p = fk.placements[i];
    if (p.shards()) {
      out_pl[i] = p;  // Shard or StridedShard: same rows, the dim shifted past new leading dims
      out_pl[i].dim = p.dim + lead;
    } else if (p.is_partial()) {
      const bool sum_like = p.reduce == ReduceOp::SUM || p.reduce == ReduceOp::AVG;
      bool keep = false;
      switch (lin) {
        case Linearity::Unary: keep = sum_like && exact; break;
        case Linearity::Additive: {
          // Every operand Partial alike, or Replicate (turned into Partial by the local
          // R -> P scale, so e.g. a bias is added once overall: PyTorch's rule).
          keep = sum_like;
          for (size_t j = 0; j < s.specs.size(); ++j)
            if (s.specs[j] && s.specs[j]->placements[i] != p && !s.specs[j]->placements[i].is_replicate()) keep = false;
          break;
        }
        case Linearity::Multiplicative: keep = p.reduce == ReduceOp::SUM; break;
        case Linearity::Divide: keep = p.reduce == ReduceOp::SUM && k == 0 && exact; break;
        case Linearity::Max: keep = p.reduce == ReduceOp::MAX; break;
        case Linearity::None: keep = false; break;
      }
      if (keep) out_pl[i] = p;
    }
  }
  Strategy st;
  st.outputs = {out_pl};
  for (size_t j = 0; j < s.specs.size(); ++j) {
    if (!s.specs[j]) {
      st.inputs.emplace_back();
      continue;
    }
    Placements in = map_to_input(out_pl, out, s.specs[j]->shape);
    for (int i = 0; i < nd; ++i) {
      if (!out_pl[i].is_partial()) continue;
      // Additive: every operand Partial. Others: only the followed operand is Partial.
      in[i] = (lin == Linearity::Additive || j == k) ? out_pl[i] : Replicate();
    }
    st.inputs.push_back(std::move(in));
  }
  return st;
}

ShardingDecision pointwise_rule(const OpSchema& s, Linearity lin, size_t n_out = 1) {
  Shape out;
  bool first = true;
  for (const DTensorSpec* sp : s.specs) {
    if (!sp) continue;
    out = first ? sp->shape : broadcast_shapes(out, sp->shape, s.call.name());
    first = false;
  }
  std::vector<Strategy> cands;
  for (size_t k = 0; k < s.specs.size(); ++k)
    if (s.specs[k] && s.specs[k]->shape.size() == out.size()) cands.push_back(follow(s, k, out, lin));
  Strategy all_r;
  all_r.outputs = {replicate_all(s.mesh.ndim())};
  for (const DTensorSpec* sp : s.specs)
    all_r.inputs.push_back(sp ? replicate_all(s.mesh.ndim()) : Placements{});
  cands.push_back(all_r);
  ShardingDecision d = decide(s, cands, {out});
  while (d.output_placements.size() < n_out) {
    d.output_placements.push_back(d.output_placements[0]);
    d.output_shapes.push_back(out);
  }
  return d;
}

ShardingDecision rule_none(const OpSchema& s) { return pointwise_rule(s, Linearity::None); }
ShardingDecision rule_unary_linear(const OpSchema& s) { return pointwise_rule(s, Linearity::Unary); }
ShardingDecision rule_additive(const OpSchema& s) { return pointwise_rule(s, Linearity::Additive); }
ShardingDecision rule_mul(const OpSchema& s) { return pointwise_rule(s, Linearity::Multiplicative); }
ShardingDecision rule_div(const OpSchema& s) { return pointwise_rule(s, Linearity::Divide); }
ShardingDecision rule_max(const OpSchema& s) { return pointwise_rule(s, Linearity::Max); }
/// swiglu_backward {g, gate, up} -> {dgate, dup}: nonlinear in gate, both outputs follow the inputs.
ShardingDecision rule_none_2out(const OpSchema& s) { return pointwise_rule(s, Linearity::None, 2); }

/// In-place ops: input 0 keeps its placements; the other operand is brought to them.
ShardingDecision rule_inplace(const OpSchema& s) {
  const DTensorSpec& dst = s.spec(0);
  for (const auto& p : dst.placements)
    DTR_CHECK(!p.is_partial() || s.call.op->name == "fill_" || s.call.op->name == "mul_", s.call.name(),
              ": in-place update of a Partial tensor ", placements_str(dst.placements), " is not supported");
  ShardingDecision d;
  d.input_placements.push_back(dst.placements);
  for (size_t j = 1; j < s.specs.size(); ++j)
    d.input_placements.push_back(s.specs[j] ? map_to_input(dst.placements, dst.shape, s.specs[j]->shape) : Placements{});
  d.output_placements = {dst.placements};
  d.output_shapes = {dst.shape};
  d.inplace = true;
  return d;
}

/// full_like: the local kernel fills the input's local shape; placements kept, Partial -> R.
ShardingDecision rule_full_like(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  ShardingDecision d;
  d.input_placements = {x.placements};
  d.output_placements = {without_partial(x.placements)};
  d.output_shapes = {x.shape};
  return d;
}

DTR_REGISTER_STRIDED_SHARDING_RULE("full_like", rule_full_like);
DTR_REGISTER_STRIDED_SHARDING_RULE("to_dtype", rule_unary_linear);
DTR_REGISTER_STRIDED_SHARDING_RULE("clone", rule_unary_linear);
DTR_REGISTER_STRIDED_SHARDING_RULE("to_device", rule_unary_linear);
DTR_REGISTER_STRIDED_SHARDING_RULE("neg", rule_unary_linear);
DTR_REGISTER_STRIDED_SHARDING_RULE("mul_scalar", rule_unary_linear);
DTR_REGISTER_STRIDED_SHARDING_RULE("div_scalar", rule_unary_linear);
DTR_REGISTER_STRIDED_SHARDING_RULE("add", rule_additive);
DTR_REGISTER_STRIDED_SHARDING_RULE("sub", rule_additive);
DTR_REGISTER_STRIDED_SHARDING_RULE("mul", rule_mul);
DTR_REGISTER_STRIDED_SHARDING_RULE("div", rule_div);
DTR_REGISTER_STRIDED_SHARDING_RULE("maximum", rule_max);
DTR_REGISTER_STRIDED_SHARDING_RULE("copy_", rule_inplace);
DTR_REGISTER_STRIDED_SHARDING_RULE("fill_", rule_inplace);
DTR_REGISTER_STRIDED_SHARDING_RULE("add_", rule_inplace);
DTR_REGISTER_STRIDED_SHARDING_RULE("mul_", rule_inplace);
DTR_REGISTER_STRIDED_SHARDING_RULE("swiglu_backward", rule_none_2out);
DTR_REGISTER_STRIDED_SHARDING_RULE("geglu_backward", rule_none_2out);

[[maybe_unused]] const bool registered_nonlinear = [] {
  for (const char* n : {"add_scalar", "sub_scalar", "rsub_scalar", "pow_scalar", "exp", "log", "sqrt", "rsqrt", "abs",
                        "sigmoid", "tanh", "relu", "silu", "gelu_erf", "gelu_tanh", "sign", "eq", "gt_scalar",
                        "lt_scalar", "where", "gelu_backward", "swiglu", "geglu"})
    register_sharding_rule(n, rule_none, StridedInputs::Accept);
  return true;
}();

}  // namespace
}  // namespace dtr::rules
