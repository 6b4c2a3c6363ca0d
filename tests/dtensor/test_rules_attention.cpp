// scaled_dot_product_attention sharding: batch or head sharding (MHA with uneven head chunks,
// GQA when both head counts divide) equals the single process forward and backward; sequence
// or head-dim shards are gathered; GQA heads that do not divide raise naming both counts.
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Fn attn(bool causal) {
  return [causal](const std::vector<Tensor>& v) { return scaled_dot_product_attention(v[0], v[1], v[2], causal); };
}
}  // namespace

TEST_CASE("sdpa with q, k, v sharded alike", "[rules][attention]") {
  manual_seed(61);
  Tensor q = rnd({2, 3, 5, 4}), k = rnd({2, 3, 6, 4}), v = rnd({2, 3, 6, 2});
  for (bool causal : {false, true})
    for (const DeviceMesh& mesh : test_meshes())
      for (const auto& p : all_placements(mesh, 4, true)) {
        const std::string r = compare_with_single(attn(causal), {q, k, v}, mesh, {p, p, p});
        INFO(r);
        CHECK(r.empty());
      }
}

TEST_CASE("sdpa with mixed placements follows the first sharded operand", "[rules][attention]") {
  manual_seed(62);
  Tensor q = rnd({2, 3, 5, 4}), k = rnd({2, 3, 5, 4}), v = rnd({2, 3, 5, 4});
  check_all(attn(true), {q, k, v},
            {each_of({Shard(1), Replicate(), Shard(2)}), each_of({Replicate(), Shard(0)}),
             each_of({Shard(1), Replicate()})});
}

TEST_CASE("sdpa with grouped-query heads", "[rules][attention][gqa]") {
  manual_seed(63);
  Tensor q = rnd({2, 4, 5, 3}), k = rnd({2, 2, 5, 3}), v = rnd({2, 2, 5, 3});
  for (const DeviceMesh& mesh : test_meshes()) {
    int64_t n = 1;
    for (int i = 0; i < mesh.ndim(); ++i) n *= mesh.size(i);
    const Placements heads(mesh.ndim(), Shard(1));
    if (2 % n == 0) {
      const std::string r = compare_with_single(attn(true), {q, k, v}, mesh, {heads, heads, heads});
      INFO(r);
      CHECK(r.empty());
    } else {
      Tensor dq = distribute_tensor(q, mesh, heads), dk = distribute_tensor(k, mesh, heads),
             dv = distribute_tensor(v, mesh, heads);
      CHECK_THROWS_WITH(scaled_dot_product_attention(dq, dk, dv, true),
                        Catch::Contains("Hq=4") && Catch::Contains("Hkv=2") &&
                            Catch::Contains("divisible by " + std::to_string(n)));
    }
    // Batch sharding works for any head counts.
    const Placements batch(mesh.ndim(), Shard(0));
    const std::string r = compare_with_single(attn(false), {q, k, v}, mesh, {batch, batch, batch});
    INFO(r);
    CHECK(r.empty());
  }
}

TEST_CASE("head-sharded sdpa needs no communication", "[rules][attention][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor q = rnd({1, 4, 3, 2}), k = rnd({1, 4, 3, 2}), v = rnd({1, 4, 3, 2});
  Tensor dq = distribute_tensor(q, mesh, {Shard(1)}), dk = distribute_tensor(k, mesh, {Shard(1)}),
         dv = distribute_tensor(v, mesh, {Shard(1)});
  CommDebugMode m;
  Tensor o = scaled_dot_product_attention(dq, dk, dv, true);
  CHECK(m.total() == 0);
  CHECK(placements(o)[0] == Shard(1));
  CHECK(max_abs_diff(full_tensor(o), scaled_dot_product_attention(q, k, v, true)) < kDistTol);
}

TEST_CASE("tensor-parallel attention block (colwise qkv, rope, sdpa, rowwise out)", "[rules][attention][tp]") {
  manual_seed(64);
  const int64_t B = 2, T = 5, H = 4, Hkv = 2, D = 2, E = H * D;
  auto [c, s] = rope_tables(T, D, 10000.0, 0, DType::f64);
  Tensor x = rnd({B, T, E}), wq = rnd({E, E}), wk = rnd({Hkv * D, E}), wv = rnd({Hkv * D, E}), wo = rnd({E, E});
  const Fn block = [=](const std::vector<Tensor>& a) {
    auto heads = [&](const Tensor& y, int64_t h) { return transpose(reshape(y, {B, T, h, D}), 1, 2); };
    Tensor q = rotary_embedding(heads(linear(a[0], a[1]), H), a[5], a[6]);
    Tensor k = rotary_embedding(heads(linear(a[0], a[2]), Hkv), a[5], a[6]);
    Tensor v = heads(linear(a[0], a[3]), Hkv);
    Tensor o = scaled_dot_product_attention(q, k, v, true);
    return linear(reshape(transpose(o, 1, 2), {B, T, E}), a[4]);
  };
  for (const DeviceMesh& mesh : test_meshes()) {
    const int tp_dim = mesh.ndim() - 1;
    if (Hkv % mesh.size(tp_dim) != 0) continue;  // GQA heads must divide (tested above)
    Placements R(mesh.ndim(), Replicate()), col = R, row = R, seq = R;
    col[tp_dim] = Shard(0);
    row[tp_dim] = Shard(1);
    seq[tp_dim] = Shard(1);
    for (const Placements& px : {R, seq}) {
      const std::string r = compare_with_single(block, {x, wq, wk, wv, wo, c, s}, mesh, {px, col, col, col, row, R, R});
      INFO(r);
      CHECK(r.empty());
    }
    // Replicated input: heads stay sharded end to end, the output is Partial, no communication.
    std::vector<Tensor> in{make_input(x, mesh, R),  make_input(wq, mesh, col), make_input(wk, mesh, col),
                           make_input(wv, mesh, col), make_input(wo, mesh, row), c, s};
    CommDebugMode m;
    Tensor out = block(in);
    CHECK(m.total() == 0);
    if (mesh.size(tp_dim) > 1) CHECK(placements(out)[tp_dim].is_partial());
  }
}

TEST_CASE("sdpa with document ids and offsets, q, k, v sharded alike", "[rules][attention][packing]") {
  // Document ids are plain tensors (replicated): they take the batch shards of q, k, v.
  manual_seed(64);
  Tensor q = rnd({3, 4, 7, 4}), k = rnd({3, 2, 7, 4}), v = rnd({3, 2, 7, 4});
  SdpaMask mask;
  mask.q_document_ids = from_vector<int64_t>({0, 0, 1, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 0, 1, 2, 3, 4, 5, 5}, {3, 7});
  mask.q_offset = 1;  // the diagonal moves one key right
  Fn f = [mask](const std::vector<Tensor>& x) {
    return scaled_dot_product_attention(x[0], x[1], x[2], true, std::nullopt, 0, mask);
  };
  for (const DeviceMesh& mesh : test_meshes())
    for (const Placement& p : {Placement(Shard(0)), Placement(Shard(1)), Placement(Replicate())}) {
      int64_t n = 1;
      for (int i = 0; i < mesh.ndim(); ++i) n *= mesh.size(i);
      if (p.is_shard(1) && 2 % n != 0) continue;  // GQA heads must divide (tested above)
      const Placements pl(mesh.ndim(), p);
      const std::string r = compare_with_single(f, {q, k, v}, mesh, {pl, pl, pl});
      INFO(r);
      CHECK(r.empty());
    }
}
