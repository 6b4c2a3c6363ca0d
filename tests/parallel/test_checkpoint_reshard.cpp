// parallel/checkpoint/reshard.h used directly (no dtr-train): blocks saved under one sharding
// (3 uneven row chunks plus a replicated copy) assemble into this rank's shard of another
// (Shard(1) over the world, uneven columns; Shard(0) x Shard(1) on a 2 x 2 mesh), equal to
// distribute_tensor's local shard bit for bit; a missing block is a one-line error.
#include <catch2/catch.hpp>

#include "dtensor/api.h"
#include "parallel/checkpoint/reshard.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace dtr;

namespace {

/// The 7 x 5 global tensor 0, 1, ..., 34.
Tensor global_tensor() { return reshape(arange(0, 35, 1, TensorOptions(DType::f32)), {7, 5}); }

/// Row chunks of `g` as torch.chunk(g, 3) saves them: rows 0-2, 3-5, 6.
std::vector<TensorBlock> saved_row_chunks(const Tensor& g) {
  return {{g.narrow(0, 0, 3).contiguous(), {0, 0}}, {g.narrow(0, 3, 3).contiguous(), {3, 0}},
          {g.narrow(0, 6, 1).contiguous(), {6, 0}}};
}

void check_assembles(const Tensor& dt) {
  const Tensor g = global_tensor();
  Shape global;
  const TensorBlock mine = local_block(dt, &global);
  CHECK(global == g.sizes());
  std::vector<TensorBlock> saved = saved_row_chunks(g);
  saved.push_back({g.narrow(0, 2, 3).contiguous(), {2, 0}});  // a replicated copy overlapping two chunks
  TensorBlock dst{zeros(mine.tensor.sizes()), mine.offset};
  assemble_block(saved, dst, "test");
  CHECK(dst.tensor.to_vector<float>() == local_tensor(dt).contiguous().to_vector<float>());
}

}  // namespace

TEST_CASE("assemble_block reshards saved row chunks onto column shards", "[checkpoint]") {
  const int w = world_size();
  DeviceMesh mesh({w}, {"dp"});
  check_assembles(distribute_tensor(global_tensor(), mesh, {Shard(1)}));
  if (w == 4) {
    DeviceMesh m2({2, 2}, {"dp_shard", "tp"});
    check_assembles(distribute_tensor(global_tensor(), m2, {Shard(0), Shard(1)}));
  }
  // A plain tensor is its own block at offset 0.
  const TensorBlock plain = local_block(global_tensor());
  CHECK(plain.offset == Shape{0, 0});
}

TEST_CASE("assemble_block names the uncovered elements", "[checkpoint]") {
  const Tensor g = global_tensor();
  std::vector<TensorBlock> saved = saved_row_chunks(g);
  saved.pop_back();  // row 6 missing
  TensorBlock dst{zeros({2, 5}), {5, 0}};
  CHECK_THROWS_WITH(assemble_block(saved, dst, "shards of w"),
                    "shards of w cover 5 of 10 elements of this rank's block (offset [5, 0], shape [2, 5])");
  // Disjoint blocks copy nothing; overlapping ones copy the overlap only.
  TensorBlock d2{zeros({2, 2}), {2, 3}};
  CHECK(copy_overlap(saved[0], d2) == 2);  // row 2, columns 3-4
  CHECK(d2.tensor.to_vector<float>() == std::vector<float>{13, 14, 0, 0});
  CHECK(copy_overlap({g.narrow(0, 0, 1).contiguous(), {0, 0}}, d2) == 0);
}

TEST_CASE("assemble_block counts a block of more than 2^24 elements exactly", "[checkpoint]") {
  // 2^24 + 1 elements: a float coverage count rounds it to 2^24 and reports a full block as
  // missing one element (u8, 16 MiB; rank 0 only, no collective).
  if (rank() != 0) return;
  const int64_t n = (int64_t{1} << 24) + 1;
  Tensor src = full({n}, 7.0, TensorOptions(DType::u8));
  TensorBlock dst{zeros({n}, TensorOptions(DType::u8)), {0}};
  assemble_block({{src, {0}}}, dst, "big");
  CHECK(dst.tensor.narrow(0, n - 1, 1).item<double>() == 7.0);
  // The count of a partly covered block is exact too.
  CHECK_THROWS_WITH(assemble_block({{src.narrow(0, 0, n - 2), {0}}}, dst, "big"),
                    "big cover 16777215 of 16777217 elements of this rank's block (offset [0], shape [16777217])");
}
