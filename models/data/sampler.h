#pragma once
// DistributedSampler: every data-parallel rank takes its contiguous slice of the same global
// batch, so the union over ranks (in rank order) is the single-process batch whatever the dp
// size. Each epoch is a permutation of [0, num_samples) by Fisher-Yates driven by splitmix64
// seeded with (seed, epoch); batches are consecutive runs of global_batch_size indices of that
// permutation; the incomplete last batch is dropped. As with PyTorch's DistributedSampler +
// set_epoch, the order of an epoch depends only on (seed, epoch), never on what ran before, so
// every epoch is reshuffled and a resumed run sees the same orders. The position (epoch, batch)
// is always the batch next() returns (after the last batch of epoch e it is (e + 1, 0)); it can
// be saved and restored, and a restored sampler continues with exactly the batches that would
// have come, across epoch boundaries too.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace dtr::data {

/// splitmix64 (Steele, Lea, Flood 2014): next() returns the next 64-bit value.
struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

/// A permutation of [0, n) for (seed, epoch): Fisher-Yates from the back, j = next() mod (i+1)
/// (the modulo bias is below n / 2^64). shuffle=false returns the identity.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch, bool shuffle = true);

struct SamplerState {
  uint64_t epoch = 0;
  int64_t batch = 0;  // next batch index within the epoch, in [0, batches_per_epoch)
  bool operator==(const SamplerState& o) const { return epoch == o.epoch && batch == o.batch; }
};

class DistributedSampler {
 public:
  /// Errors: num_samples < global_batch_size, global_batch_size not divisible by dp_size,
  /// dp_rank outside [0, dp_size) -> dtr::Error naming the numbers.
  DistributedSampler(int64_t num_samples, int64_t global_batch_size, int dp_rank, int dp_size, uint64_t seed,
                     bool shuffle = true);
  int64_t batches_per_epoch() const { return num_samples_ / global_batch_; }
  int64_t local_batch_size() const { return global_batch_ / dp_size_; }
  /// The whole global batch `b` of `epoch` (same on every rank).
  std::vector<int64_t> global_batch(uint64_t epoch, int64_t b) const;
  /// This rank's slice of the global batch at state(); advances, to (epoch + 1, 0) after the
  /// last batch of an epoch.
  std::vector<int64_t> next();
  /// The position of the batch next() returns: global_batch(state().epoch, state().batch) is
  /// the global batch that next() slices.
  SamplerState state() const { return state_; }
  /// Moves to the first batch of `epoch` (PyTorch: DistributedSampler.set_epoch).
  void set_epoch(uint64_t epoch) { state_ = {epoch, 0}; }
  /// Errors: batch outside [0, batches_per_epoch()]; batch == batches_per_epoch() (an epoch
  /// finished, as checkpoints written before states were normalised say) is read as
  /// (epoch + 1, 0).
  void load_state(const SamplerState& s);
  /// {"epoch", "batch", "seed", "num_samples", "global_batch_size"}.
  nlohmann::json state_dict() const;
  /// Errors: seed / num_samples / global_batch_size differ from this sampler's (resuming with a
  /// different dataset or batch size would silently change the data order).
  void load_state_dict(const nlohmann::json& j);

 private:
  const std::vector<int64_t>& perm(uint64_t epoch) const;
  int64_t num_samples_, global_batch_;
  int dp_rank_, dp_size_;
  uint64_t seed_;
  bool shuffle_;
  SamplerState state_;
  mutable uint64_t cached_epoch_ = ~0ull;
  mutable std::vector<int64_t> cached_perm_;
};

}  // namespace dtr::data
