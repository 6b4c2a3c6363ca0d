// DistributedSampler (models/data/sampler.h): dp-size independent global batches, per-epoch
// reshuffling that depends only on (seed, epoch), positions that stay valid across epoch
// boundaries, resume from a saved state.
#include <catch2/catch.hpp>
#include <algorithm>
#include <set>

#include "models/data/sampler.h"

using namespace dtr::data;
using Catch::Matchers::Contains;

namespace {

/// The first `steps` global batches of a single-process sampler (103 samples, batches of 12:
/// 8 batches per epoch, 7 samples dropped per epoch).
constexpr int64_t kN = 103, kGlobal = 12, kPerEpoch = 8;
std::vector<std::vector<int64_t>> reference_batches(int steps, uint64_t seed = 1234) {
  DistributedSampler single(kN, kGlobal, 0, 1, seed);
  std::vector<std::vector<int64_t>> ref;
  for (int s = 0; s < steps; ++s) ref.push_back(single.next());
  return ref;
}

}  // namespace

TEST_CASE("sampler: dp ranks' slices form the single-process batch for dp 1..4, over 3 epochs", "[data][sampler]") {
  const int steps = 3 * kPerEpoch;
  const auto ref = reference_batches(steps);
  CHECK(DistributedSampler(kN, kGlobal, 0, 1, 1234).batches_per_epoch() == kPerEpoch);
  for (int dp = 1; dp <= 4; ++dp) {
    std::vector<DistributedSampler> ranks;
    for (int r = 0; r < dp; ++r) ranks.emplace_back(kN, kGlobal, r, dp, 1234);
    for (int step = 0; step < steps; ++step) {
      std::vector<int64_t> u;
      for (auto& s : ranks) {
        auto part = s.next();
        CHECK(static_cast<int64_t>(part.size()) == kGlobal / dp);
        u.insert(u.end(), part.begin(), part.end());
      }
      INFO("dp " << dp << " step " << step);
      CHECK(u == ref[static_cast<size_t>(step)]);
    }
  }
  REQUIRE_THROWS_WITH(DistributedSampler(kN, 10, 0, 4, 1), Contains("not divisible by dp_size 4"));
  REQUIRE_THROWS_WITH(DistributedSampler(5, 8, 0, 1, 1), Contains("fewer than one global batch"));
}

// The trainer's pattern: read the position, count the global batch's labels, take this rank's
// slice. At the end of epoch 0 the position used to be (0, 8), outside the epoch, and
// global_batch threw "DistributedSampler: batch 8 outside [0, 8)".
TEST_CASE("sampler: state() is the batch next() returns, across epoch boundaries", "[data][sampler]") {
  for (int dp : {1, 2, 3, 4}) {
    for (int r = 0; r < dp; ++r) {
      DistributedSampler s(kN, kGlobal, r, dp, 1234);
      const int64_t local = kGlobal / dp;
      for (int step = 0; step < 3 * kPerEpoch; ++step) {
        const SamplerState st = s.state();
        INFO("dp " << dp << " rank " << r << " step " << step);
        CHECK(st == SamplerState{static_cast<uint64_t>(step / kPerEpoch), step % kPerEpoch});
        const auto global = s.global_batch(st.epoch, st.batch);
        const auto mine = s.next();
        CHECK(mine == std::vector<int64_t>(global.begin() + r * local, global.begin() + (r + 1) * local));
      }
      CHECK(s.state() == SamplerState{3, 0});
    }
  }
}

// As torch.utils.data.DistributedSampler with set_epoch(e): epoch e's order is a fresh
// permutation seeded by (seed, e), the same however the sampler got there.
TEST_CASE("sampler: every epoch is reshuffled deterministically from (seed, epoch)", "[data][sampler]") {
  const auto ref = reference_batches(3 * kPerEpoch);
  std::vector<std::vector<int64_t>> epoch_order(3);
  for (int e = 0; e < 3; ++e) {
    std::set<int64_t> seen;
    for (int b = 0; b < kPerEpoch; ++b)
      for (auto i : ref[static_cast<size_t>(e * kPerEpoch + b)]) {
        CHECK(seen.insert(i).second);  // no index twice within an epoch
        epoch_order[static_cast<size_t>(e)].push_back(i);
      }
  }
  CHECK(epoch_order[0] != epoch_order[1]);
  CHECK(epoch_order[1] != epoch_order[2]);
  // set_epoch(e) jumps straight to the batches iteration reaches after e epochs
  for (uint64_t e : {2u, 1u, 0u}) {
    DistributedSampler s(kN, kGlobal, 0, 1, 1234);
    s.set_epoch(e);
    CHECK(s.state() == SamplerState{e, 0});
    for (int b = 0; b < kPerEpoch; ++b) CHECK(s.next() == ref[static_cast<size_t>(e * kPerEpoch + b)]);
  }
  // different epochs and seeds give different orders; the same seed gives the same order
  CHECK(reference_batches(kPerEpoch, 99) != reference_batches(kPerEpoch, 1234));
  CHECK(epoch_permutation(50, 1, 0) != epoch_permutation(50, 1, 1));
  CHECK(epoch_permutation(50, 1, 0) != epoch_permutation(50, 2, 0));
  CHECK(epoch_permutation(50, 1, 3) == epoch_permutation(50, 1, 3));
  auto p = epoch_permutation(50, 9, 0);
  std::sort(p.begin(), p.end());
  CHECK(p == epoch_permutation(50, 9, 0, /*shuffle=*/false));
  // shuffle = false: every epoch in index order
  DistributedSampler plain(kN, kGlobal, 0, 1, 1234, /*shuffle=*/false);
  for (int step = 0; step < 2 * kPerEpoch; ++step) {
    const auto b = plain.next();
    CHECK(b.front() == (step % kPerEpoch) * kGlobal);
  }
}

TEST_CASE("sampler: resume continues the same sequence, across epoch boundaries", "[data][sampler]") {
  // 50 samples, batches of 8: 6 per epoch; stops before, at and after the boundaries
  DistributedSampler a(50, 8, 1, 2, 77);
  std::vector<std::vector<int64_t>> seq;
  for (int i = 0; i < 20; ++i) seq.push_back(a.next());
  for (int stop : {0, 3, 5, 6, 7, 11, 12, 13}) {
    DistributedSampler b(50, 8, 1, 2, 77);
    for (int i = 0; i < stop; ++i) b.next();
    const nlohmann::json saved = nlohmann::json::parse(b.state_dict().dump());
    CHECK(saved.at("epoch").get<int>() == stop / 6);
    CHECK(saved.at("batch").get<int>() == stop % 6);
    DistributedSampler c(50, 8, 1, 2, 77);
    c.load_state_dict(saved);
    INFO("stop " << stop);
    for (int i = stop; i < 20; ++i) CHECK(c.next() == seq[static_cast<size_t>(i)]);
  }
  // a position at the end of an epoch (what a finished epoch was saved as before) is the next
  // epoch's first batch
  DistributedSampler d(50, 8, 1, 2, 77);
  d.load_state({0, 6});
  CHECK(d.state() == SamplerState{1, 0});
  CHECK(d.next() == seq[6]);
  REQUIRE_THROWS_WITH(d.load_state({0, 7}), Contains("saved batch 7 outside [0, 6]"));
  DistributedSampler other_seed(50, 8, 1, 2, 78);
  REQUIRE_THROWS_WITH(other_seed.load_state_dict(a.state_dict()), Contains("seed"));
}
