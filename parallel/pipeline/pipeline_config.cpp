// distributed.pipeline (see pipeline_config.h).
#include "parallel/pipeline/pipeline_config.h"

#include <yaml-cpp/yaml.h>

#include "tensor/error.h"

namespace dtr {

int PipelineConfig::stages_per_rank(int64_t num_layers, int64_t pp, const std::string& where) const {
  int64_t stages = schedule == PipelineScheduleKind::Interleaved1F1B ? 2 * pp : pp;
  if (!layer_counts.empty()) stages = static_cast<int64_t>(layer_counts.size());
  else if (layers_per_stage > 0) stages = (num_layers + layers_per_stage - 1) / layers_per_stage;
  DTR_CHECK(stages % pp == 0, where, ": ", stages, " pipeline stages are not a multiple of pp_size=", pp);
  DTR_CHECK(schedule == PipelineScheduleKind::Interleaved1F1B || stages == pp, where, ": pp_schedule ",
            pipeline_schedule_name(schedule), " runs one stage per rank, got ", stages, " stages for pp_size=", pp,
            " (use interleaved1f1b)");
  return static_cast<int>(stages / pp);
}

PipelineConfig parse_pipeline_config(const YAML::Node& node, const std::string& where) {
  PipelineConfig c;
  if (!node || node.IsNull()) return c;
  const std::string w = where + ".pipeline";
  DTR_CHECK(node.IsMap(), w, ": expected a map (pp_schedule, pp_microbatch_size, layers_per_stage)");
  auto get_int = [&](const YAML::Node& v, const std::string& k) {
    int64_t x = 0;
    try {
      x = v.as<int64_t>();
    } catch (const YAML::Exception&) {
      DTR_ERROR(w, ".", k, ": expected an integer, got '", YAML::Dump(v), "'");
    }
    DTR_CHECK(x >= 1, w, ".", k, "=", x, ": must be >= 1");
    return x;
  };
  for (const auto& kv : node) {
    const std::string k = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (k == "pp_schedule") {
      DTR_CHECK(v.IsScalar(), w, ".pp_schedule: expected a name (gpipe, 1f1b, interleaved1f1b)");
      c.schedule = parse_pipeline_schedule(v.as<std::string>(), w + ".pp_schedule");
    } else if (k == "pp_microbatch_size") {
      c.microbatch_size = get_int(v, k);
    } else if (k == "layers_per_stage") {
      if (v.IsNull()) continue;
      if (v.IsSequence()) {
        for (const auto& e : v) c.layer_counts.push_back(get_int(e, k));
      } else {
        c.layers_per_stage = get_int(v, k);
      }
    } else {
      DTR_ERROR(w, ": unknown key '", k, "' (expected pp_schedule, pp_microbatch_size, layers_per_stage)");
    }
  }
  return c;
}

}  // namespace dtr
