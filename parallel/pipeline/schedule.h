#pragma once
// Pipeline schedules as data: the ordered list of forward / backward micro-steps each pipeline
// rank runs in one optimizer step, for GPipe, 1F1B and interleaved 1F1B (virtual stages). The
// executor (executor.h) runs such a list; tests compare the order a rank actually ran with it.
// Stages are placed in a loop: stage s runs on pp rank s % pp (rank r holds stages r, r + pp,
// r + 2 pp, ...), so the first stage is on rank 0 and the last on rank pp - 1.
// Source: GPipe (Huang et al. 2019); 1F1B = PipeDream-Flush (Narayanan et al. 2021), PyTorch
// torch.distributed.pipelining Schedule1F1B; interleaved 1F1B = Megatron-LM's
// forward_backward_pipelining_with_interleaving (Narayanan et al. 2021, section 2.2), PyTorch's
// ScheduleInterleaved1F1B.
#include <cstdint>
#include <string>
#include <vector>

namespace dtr {

enum class PipelineScheduleKind { GPipe, OneFOneB, Interleaved1F1B };

/// Parses a schedule name as Automodel's `distributed.pipeline.pp_schedule` / PyTorch's
/// get_schedule_class take it, case-insensitively: "gpipe", "1f1b", "interleaved1f1b".
/// Errors: any other name (the message lists the accepted ones and names `where`).
PipelineScheduleKind parse_pipeline_schedule(const std::string& name, const std::string& where);
/// "GPipe", "1F1B", "Interleaved1F1B".
const char* pipeline_schedule_name(PipelineScheduleKind k);

/// One compute micro-step: the forward or backward of micro-batch `microbatch` through
/// stage `stage` (global stage index). The executor adds the receives before and the sends after.
struct PipelineAction {
  enum Type : uint8_t { Forward, Backward };
  Type type = Forward;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const PipelineAction& o) const {
    return type == o.type && stage == o.stage && microbatch == o.microbatch;
  }
  /// "F3s1" / "B3s1" (micro-batch 3, stage 1).
  std::string str() const;
};

/// The shape of a pipeline: pp ranks, `stages_per_rank` stages on each (1 for GPipe and 1F1B,
/// v >= 1 for interleaved), `microbatches` per optimizer step.
struct PipelineShape {
  int pp = 1;
  int stages_per_rank = 1;
  int microbatches = 1;
  int num_stages() const { return pp * stages_per_rank; }
};

/// The micro-steps pp rank `rank` runs, in order:
///  GPipe: F0 .. F(m-1), then B0 .. B(m-1).
///  1F1B: min(pp - rank - 1, m) warm-up forwards, then alternately one forward and one backward
///    (oldest first), then the remaining backwards: at most pp - rank micro-batches in flight.
///  Interleaved 1F1B (v stages per rank): forward k (k = 0 .. m v - 1) is micro-batch
///    (k / (pp v)) pp + k % pp on the rank's local stage (k / pp) % v; backward k the same with
///    the local stage reversed (v - 1 - (k / pp) % v); warm-up min(2 (pp - rank - 1) + (v - 1) pp,
///    m v) forwards, then 1F1B, then the remaining backwards.
/// Errors: pp < 1, m < 1, rank out of range, stages_per_rank != 1 for GPipe / 1F1B, interleaved
/// with m % pp != 0 (Megatron's condition; the message names m and pp).
std::vector<PipelineAction> pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& shape, int rank);

/// Runs every rank's list on an ideal machine (a forward takes `forward_time`, a backward
/// `backward_time`, communication is free; a micro-step starts when its rank is free and its
/// input arrived: the previous stage's forward, the next stage's backward) and returns the
/// fraction of rank-time spent idle between a rank's first and the last micro-step of the step:
/// 1 - sum(busy) / (pp x makespan). GPipe and 1F1B give (pp - 1) / (m + pp - 1).
/// Errors: a list that deadlocks (a micro-step whose input never arrives) names the blocked steps.
double simulate_pipeline_bubble(const std::vector<std::vector<PipelineAction>>& per_rank, const PipelineShape& shape,
                                double forward_time = 1.0, double backward_time = 2.0);

}  // namespace dtr
