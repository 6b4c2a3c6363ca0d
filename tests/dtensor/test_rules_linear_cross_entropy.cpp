// linear_cross_entropy on DTensors equals the single process (loss and the gradients of input
// and weight) over every placement of input and weight; the loss-parallel head (weight
// Shard(0) over an uneven vocabulary, input Replicate) never gathers logits or weight.
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("linear_cross_entropy over every placement of input and weight", "[rules][loss][fused]") {
  manual_seed(241);
  // N = 5 tokens in chunks of 2 (the last one short), vocabulary 7: uneven over 2-4 ranks.
  Tensor x = rnd({5, 4}), w = rnd({7, 4});
  Tensor t = from_vector<int64_t>({2, -100, 6, 0, 3}, {5});
  const Fn f = [](const std::vector<Tensor>& v) { return linear_cross_entropy(v[0], v[1], v[2], -100, 2); };
  check_all(f, {x, w, t}, {any_placement(2, false), any_placement(2, false), replicated()});
}

TEST_CASE("loss-parallel linear_cross_entropy gathers neither logits nor weight", "[rules][loss][fused][comm]") {
  manual_seed(242);
  const int64_t N = 9, H = 5, V = 11;  // 11 classes over 2, 3, 4 ranks: uneven shards
  Tensor x = rnd({N, H}), w = rnd({V, H});
  Tensor t = from_vector<int64_t>({10, 0, -100, 4, 7, -100, 1, 9, 5}, {N});
  for (const DeviceMesh& mesh : test_meshes()) {
    Placements R(mesh.ndim(), Replicate()), col = R;
    col.back() = Shard(0);
    Tensor dx = make_input(x, mesh, R).set_requires_grad(true), dw = make_input(w, mesh, col).set_requires_grad(true);
    CommDebugMode m;
    Tensor loss = linear_cross_entropy(dx, dw, t, -100, 4);  // chunks of 4, 4, 1 tokens
    loss.backward();
    CHECK(m.count(CommKind::all_gather) == 0);
    CHECK(placements(loss) == R);
    CHECK(placements(dw.grad()) == col);
    Tensor rx = x.clone().set_requires_grad(true), rw = w.clone().set_requires_grad(true);
    Tensor ref = cross_entropy(linear(rx, rw), t);
    ref.backward();
    CHECK(std::abs(to_local(loss).item<double>() - ref.item<double>()) < kDistTol);
    CHECK(max_abs_diff(full_tensor(dx.grad()), rx.grad()) < kDistTol);
    CHECK(max_abs_diff(full_tensor(dw.grad()), rw.grad()) < kDistTol);
  }
}
