#include "models/data/sampler.h"

#include "tensor/error.h"

namespace dtr::data {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch, bool shuffle) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  if (!shuffle) return p;
  // One stream per (seed, epoch): mix the epoch in through a first splitmix64 step.
  SplitMix64 mix(seed);
  SplitMix64 rng(mix.next() ^ (epoch * 0xD1B54A32D192ED03ull));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

DistributedSampler::DistributedSampler(int64_t num_samples, int64_t global_batch_size, int dp_rank, int dp_size,
                                       uint64_t seed, bool shuffle)
    : num_samples_(num_samples), global_batch_(global_batch_size), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed),
      shuffle_(shuffle) {
  DTR_CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "DistributedSampler: dp_rank ", dp_rank,
            " outside [0, dp_size = ", dp_size, ")");
  DTR_CHECK(global_batch_size > 0 && global_batch_size % dp_size == 0, "DistributedSampler: global_batch_size ",
            global_batch_size, " is not divisible by dp_size ", dp_size);
  DTR_CHECK(num_samples >= global_batch_size, "DistributedSampler: ", num_samples,
            " samples are fewer than one global batch of ", global_batch_size);
}

const std::vector<int64_t>& DistributedSampler::perm(uint64_t epoch) const {
  if (cached_epoch_ != epoch) {
    cached_perm_ = epoch_permutation(num_samples_, seed_, epoch, shuffle_);
    cached_epoch_ = epoch;
  }
  return cached_perm_;
}

std::vector<int64_t> DistributedSampler::global_batch(uint64_t epoch, int64_t b) const {
  DTR_CHECK(b >= 0 && b < batches_per_epoch(), "DistributedSampler: batch ", b, " outside [0, ", batches_per_epoch(), ")");
  const auto& p = perm(epoch);
  return std::vector<int64_t>(p.begin() + b * global_batch_, p.begin() + (b + 1) * global_batch_);
}

std::vector<int64_t> DistributedSampler::next() {
  const auto& p = perm(state_.epoch);
  const int64_t start = state_.batch * global_batch_ + dp_rank_ * local_batch_size();
  std::vector<int64_t> out(p.begin() + start, p.begin() + start + local_batch_size());
  if (++state_.batch == batches_per_epoch()) state_ = {state_.epoch + 1, 0};
  return out;
}

void DistributedSampler::load_state(const SamplerState& s) {
  DTR_CHECK(s.batch >= 0 && s.batch <= batches_per_epoch(), "DistributedSampler: saved batch ", s.batch,
            " outside [0, ", batches_per_epoch(), "]");
  state_ = s.batch == batches_per_epoch() ? SamplerState{s.epoch + 1, 0} : s;
}

nlohmann::json DistributedSampler::state_dict() const {
  return {{"epoch", state_.epoch}, {"batch", state_.batch}, {"seed", seed_}, {"num_samples", num_samples_},
          {"global_batch_size", global_batch_}};
}

void DistributedSampler::load_state_dict(const nlohmann::json& j) {
  try {
    DTR_CHECK(j.at("seed").get<uint64_t>() == seed_, "DistributedSampler: saved seed ", j.at("seed").get<uint64_t>(),
              " differs from ", seed_);
    DTR_CHECK(j.at("num_samples").get<int64_t>() == num_samples_, "DistributedSampler: saved num_samples ",
              j.at("num_samples").get<int64_t>(), " differs from ", num_samples_);
    DTR_CHECK(j.at("global_batch_size").get<int64_t>() == global_batch_, "DistributedSampler: saved global_batch_size ",
              j.at("global_batch_size").get<int64_t>(), " differs from ", global_batch_);
    load_state({j.at("epoch").get<uint64_t>(), j.at("batch").get<int64_t>()});
  } catch (const nlohmann::json::exception& e) {
    DTR_ERROR("DistributedSampler: bad state: ", e.what());
  }
}

}  // namespace dtr::data
