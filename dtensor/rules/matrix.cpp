// Sharding rules of mm and bmm (einsum-style): per mesh dim, all replicated; batch sharded on
// all three; m sharded (lhs rows, output rows); n sharded (rhs cols, output cols); k sharded
// on both -> Partial(sum) output with no communication; a Partial operand times a replicated
// one stays Partial. The cheapest combination over mesh dims wins.
// Source: PyTorch torch.distributed.tensor._ops._matrix_ops / _einsum_strategy.
#include "dtensor/rules/common.h"

namespace dtr::rules {
namespace {

ShardingDecision rule_mm(const OpSchema& s) {
  const Shape& a = s.spec(0).shape;
  const Shape& b = s.spec(1).shape;
  const Placement P = Partial(ReduceOp::SUM);
  const std::vector<DimOption> options = {
      {{Replicate(), Replicate()}, {Replicate()}}, {{Shard(0), Replicate()}, {Shard(0)}},
      {{Replicate(), Shard(1)}, {Shard(1)}},       {{Shard(1), Shard(0)}, {P}},
      {{P, Replicate()}, {P}},                     {{Replicate(), P}, {P}}};
  std::vector<std::vector<DimOption>> per(s.mesh.ndim(), options);
  return decide(s, expand_strategies(per, 2, 1), {{a[0], b[1]}});
}

ShardingDecision rule_bmm(const OpSchema& s) {
  const Shape& a = s.spec(0).shape;
  const Shape& b = s.spec(1).shape;
  const Placement P = Partial(ReduceOp::SUM);
  const std::vector<DimOption> options = {
      {{Replicate(), Replicate()}, {Replicate()}}, {{Shard(0), Shard(0)}, {Shard(0)}},
      {{Shard(1), Replicate()}, {Shard(1)}},       {{Replicate(), Shard(2)}, {Shard(2)}},
      {{Shard(2), Shard(1)}, {P}},                 {{P, Replicate()}, {P}},
      {{Replicate(), P}, {P}}};
  std::vector<std::vector<DimOption>> per(s.mesh.ndim(), options);
  return decide(s, expand_strategies(per, 2, 1), {{a[0], a[1], b[2]}});
}

DTR_REGISTER_SHARDING_RULE("mm", rule_mm);
DTR_REGISTER_SHARDING_RULE("bmm", rule_bmm);

}  // namespace
}  // namespace dtr::rules
