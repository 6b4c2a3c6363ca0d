// Pipeline schedules (see schedule.h).
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "tensor/error.h"

namespace dtr {

PipelineScheduleKind parse_pipeline_schedule(const std::string& name, const std::string& where) {
  std::string n;
  for (char c : name)
    if (c != '_' && c != '-') n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "gpipe") return PipelineScheduleKind::GPipe;
  if (n == "1f1b") return PipelineScheduleKind::OneFOneB;
  if (n == "interleaved1f1b") return PipelineScheduleKind::Interleaved1F1B;
  DTR_ERROR(where, ": unknown pipeline schedule \"", name, "\" (expected gpipe, 1f1b or interleaved1f1b)");
}

const char* pipeline_schedule_name(PipelineScheduleKind k) {
  switch (k) {
    case PipelineScheduleKind::GPipe: return "GPipe";
    case PipelineScheduleKind::OneFOneB: return "1F1B";
    case PipelineScheduleKind::Interleaved1F1B: return "Interleaved1F1B";
  }
  return "?";
}

std::string PipelineAction::str() const {
  return std::string(type == Forward ? "F" : "B") + std::to_string(microbatch) + "s" + std::to_string(stage);
}

namespace {

/// warmup forwards, then (forward, backward) pairs, then the remaining backwards.
std::vector<PipelineAction> one_f_one_b(const std::vector<PipelineAction>& fwd, const std::vector<PipelineAction>& bwd,
                                        size_t warmup) {
  std::vector<PipelineAction> out;
  const size_t n = fwd.size();
  warmup = std::min(warmup, n);
  for (size_t k = 0; k < warmup; ++k) out.push_back(fwd[k]);
  for (size_t k = 0; k + warmup < n; ++k) {
    out.push_back(fwd[k + warmup]);
    out.push_back(bwd[k]);
  }
  for (size_t k = n - warmup; k < n; ++k) out.push_back(bwd[k]);
  return out;
}

}  // namespace

std::vector<PipelineAction> pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& s, int rank) {
  const int pp = s.pp, v = s.stages_per_rank, m = s.microbatches;
  DTR_CHECK(pp >= 1 && v >= 1 && m >= 1, "pipeline_schedule: pp, stages per rank and micro-batches must be >= 1, got ",
            pp, ", ", v, ", ", m);
  DTR_CHECK(rank >= 0 && rank < pp, "pipeline_schedule: rank ", rank, " out of [0, ", pp, ")");
  using A = PipelineAction;
  std::vector<A> fwd, bwd;
  if (kind != PipelineScheduleKind::Interleaved1F1B) {
    DTR_CHECK(v == 1, "pipeline_schedule: ", pipeline_schedule_name(kind), " runs one stage per rank, got ", v,
              " (use interleaved1f1b for virtual stages)");
    for (int i = 0; i < m; ++i) {
      fwd.push_back({A::Forward, rank, i});
      bwd.push_back({A::Backward, rank, i});
    }
    const size_t warmup = kind == PipelineScheduleKind::GPipe ? fwd.size() : static_cast<size_t>(pp - rank - 1);
    return one_f_one_b(fwd, bwd, warmup);
  }
  DTR_CHECK(m % pp == 0, "pipeline_schedule: Interleaved1F1B needs the number of micro-batches (", m,
            ") to be a multiple of pp_size (", pp, ")");
  const int total = m * v;
  for (int k = 0; k < total; ++k) {
    const int group = k / (pp * v), chunk = (k % (pp * v)) / pp;
    const int mb = group * pp + k % pp;
    fwd.push_back({A::Forward, chunk * pp + rank, mb});
    bwd.push_back({A::Backward, (v - 1 - chunk) * pp + rank, mb});
  }
  const size_t warmup = static_cast<size_t>(2 * (pp - rank - 1) + (v - 1) * pp);
  return one_f_one_b(fwd, bwd, warmup);
}

double simulate_pipeline_bubble(const std::vector<std::vector<PipelineAction>>& per_rank, const PipelineShape& s,
                                double tf, double tb) {
  const int pp = s.pp, S = s.num_stages();
  DTR_CHECK(static_cast<int>(per_rank.size()) == pp, "simulate_pipeline_bubble: ", per_rank.size(),
            " rank lists for pp ", pp);
  // done[(type, stage, mb)] = finish time.
  std::map<std::tuple<int, int, int>, double> done;
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0.0);
  double busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      while (next[r] < per_rank[r].size()) {
        const PipelineAction& a = per_rank[r][next[r]];
        double ready = free_at[r];
        bool ok = true;
        auto need = [&](int type, int stage, int mb) {
          auto it = done.find({type, stage, mb});
          if (it == done.end()) ok = false;
          else ready = std::max(ready, it->second);
        };
        if (a.type == PipelineAction::Forward && a.stage > 0) need(PipelineAction::Forward, a.stage - 1, a.microbatch);
        if (a.type == PipelineAction::Backward) {
          need(PipelineAction::Forward, a.stage, a.microbatch);
          if (a.stage + 1 < S) need(PipelineAction::Backward, a.stage + 1, a.microbatch);
        }
        if (!ok) break;
        const double t = a.type == PipelineAction::Forward ? tf : tb;
        free_at[r] = ready + t;
        busy += t;
        done[{a.type, a.stage, a.microbatch}] = free_at[r];
        ++next[r];
        progress = true;
      }
    }
  }
  std::string blocked;
  for (int r = 0; r < pp; ++r)
    if (next[r] < per_rank[r].size()) blocked += " rank " + std::to_string(r) + " at " + per_rank[r][next[r]].str();
  DTR_CHECK(blocked.empty(), "simulate_pipeline_bubble: the schedule deadlocks:", blocked);
  const double makespan = *std::max_element(free_at.begin(), free_at.end());
  return makespan > 0 ? 1.0 - busy / (pp * makespan) : 0.0;
}

}  // namespace dtr
