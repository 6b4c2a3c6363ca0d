// dropout sharding: every shard draws exactly its slice of the single-process Philox mask
// (global linear index from the shard's offsets), uneven and nested 2-d shards included;
// Partial inputs are reduced first; the backward reuses the mask.
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Fn drop(double p, GeneratorState st) {
  return [p, st](const std::vector<Tensor>& v) {
    set_generator_state(st);  // same seed and offset for the single and the distributed run
    return dropout(v[0], p, true);
  };
}
}  // namespace

TEST_CASE("dropout draws the single-process mask on every placement", "[rules][dropout]") {
  manual_seed(91);
  const GeneratorState st = generator_state();
  check_all(drop(0.3, st), {rnd({5, 6})}, {any_placement(2, true)});
  check_all(drop(0.5, st), {rnd({3, 5, 4})}, {any_placement(3, false)});
}

TEST_CASE("sharded dropout needs no communication and is not the local mask", "[rules][dropout][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  manual_seed(92);
  Tensor x = full({6, 8}, 1.0, TensorOptions(DType::f64));
  Tensor dx = distribute_tensor(x, mesh, {Shard(1)});
  const GeneratorState st = generator_state();
  CommDebugMode m;
  Tensor y = dropout(dx, 0.5, true);
  CHECK(m.total() == 0);
  set_generator_state(st);
  CHECK(max_abs_diff(full_tensor(y), dropout(x, 0.5, true)) == 0.0);
}
