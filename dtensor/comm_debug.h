#pragma once
// CommDebugMode: counts the collectives the DTensor layer issues while it is alive (like
// PyTorch's torch.distributed.tensor.debug.CommDebugMode), so tests can assert e.g. that a
// Partial -> Shard redistribution issued exactly one reduce_scatter.
#include <array>
#include <cstdint>
#include <string>

#include "runtime/process_group.h"

namespace dtr {

class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;
  /// Collectives of `kind` issued since construction (on this rank).
  int64_t count(CommKind kind) const { return counts_[static_cast<int>(kind)]; }
  int64_t total() const;
  std::string str() const;

 private:
  friend void comm_debug_note(CommKind kind);
  std::array<int64_t, kNumCommKinds> counts_{};
  CommDebugMode* prev_;
};

/// Called by the DTensor layer for each collective it issues.
void comm_debug_note(CommKind kind);

/// True when DTR_DTENSOR_DEBUG=1: every implicit redistribution is logged to stderr with the
/// op name and the placements before and after.
bool dtensor_debug_enabled();

}  // namespace dtr
