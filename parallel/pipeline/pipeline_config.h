#pragma once
// The recipe's `distributed.pipeline` section (NeMo Automodel's AutoPipeline keys where they
// exist): pp_schedule (default 1f1b, Automodel's), pp_microbatch_size (rows per micro-batch;
// default: step_scheduler.local_batch_size, i.e. the gradient-accumulation split),
// layers_per_stage (Automodel: an int, the stage count is ceil(layers / it); dtr also takes a
// list: the layer count of each stage, in stage order).
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace YAML {
class Node;
}

namespace dtr {

struct PipelineConfig {
  PipelineScheduleKind schedule = PipelineScheduleKind::OneFOneB;
  int64_t microbatch_size = 0;         // 0: local_batch_size
  int64_t layers_per_stage = 0;        // 0: one stage per rank (two for interleaved1f1b)
  std::vector<int64_t> layer_counts;   // per stage (overrides layers_per_stage)

  /// Stages per pp rank for a model of `num_layers` layers on `pp` ranks. Errors (naming
  /// `where`): a stage count that pp does not divide, or != pp for GPipe / 1F1B.
  int stages_per_rank(int64_t num_layers, int64_t pp, const std::string& where) const;
};

/// Parses `distributed.pipeline`. Errors: unknown key (the message lists the known ones), wrong
/// types, values < 1, an unknown schedule.
PipelineConfig parse_pipeline_config(const YAML::Node& node, const std::string& where);

}  // namespace dtr
