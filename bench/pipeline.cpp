// dtr-bench pipeline (see pipeline.h).
#include "bench/pipeline.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "models/transformer/causal_lm.h"
#include "models/transformer/pipeline_stage.h"
#include "parallel/pipeline/executor.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/allocator.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/random.h"

namespace dtr::bench {
namespace {

struct PipelineBenchConfig {
  int64_t layers = 8, hidden = 256, intermediate = 512, heads = 8, kv_heads = 4, vocab = 1024, seq = 128, rows = 2;
  std::vector<int> micro = {4, 8, 16};
  int steps = 3, threads = 0;
};

PipelineBenchConfig parse(int argc, char** argv) {
  PipelineBenchConfig c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    DTR_CHECK(i + 1 < argc, "dtr-bench pipeline: ", a, " needs a value");
    const std::string v = argv[++i];
    auto num = [&](const std::string& s) {
      char* end = nullptr;
      const long long x = std::strtoll(s.c_str(), &end, 10);
      DTR_CHECK(end && *end == '\0' && x >= 1, "dtr-bench pipeline: ", a, "=", s, ": expected an integer >= 1");
      return static_cast<int64_t>(x);
    };
    if (a == "--layers") c.layers = num(v);
    else if (a == "--hidden") c.hidden = num(v);
    else if (a == "--intermediate") c.intermediate = num(v);
    else if (a == "--heads") c.heads = num(v);
    else if (a == "--kv-heads") c.kv_heads = num(v);
    else if (a == "--vocab") c.vocab = num(v);
    else if (a == "--seq") c.seq = num(v);
    else if (a == "--rows") c.rows = num(v);
    else if (a == "--steps") c.steps = static_cast<int>(num(v));
    else if (a == "--threads") c.threads = static_cast<int>(num(v));
    else if (a == "--micro") {
      c.micro.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) c.micro.push_back(static_cast<int>(num(item)));
    } else {
      DTR_ERROR("dtr-bench pipeline: unknown argument '", a,
                "' (expected --layers --hidden --intermediate --heads --kv-heads --vocab --seq --rows --micro --steps "
                "--threads)");
    }
  }
  return c;
}

struct Row {
  std::string schedule;
  int m = 0;
  double bubble = 0, theory = 0, step_s = 0;
  std::vector<double> peak_mib;  // per pp rank
};

}  // namespace

int bench_pipeline(int argc, char** argv) {
  const PipelineBenchConfig cfg = parse(argc, argv);
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  const int P = world_size(), r = rank();
  DeviceMesh mesh = DeviceMesh::world("pp");
  auto pg = mesh.group(0);
  ModelConfig mc = llama_debug_config();
  mc.num_hidden_layers = cfg.layers;
  mc.layer_types.assign(cfg.layers, "full_attention");
  mc.hidden_size = cfg.hidden;
  mc.intermediate_size = cfg.intermediate;
  mc.num_attention_heads = cfg.heads;
  mc.num_key_value_heads = cfg.kv_heads;
  mc.head_dim = cfg.hidden / cfg.heads;
  mc.vocab_size = cfg.vocab;
  mc.max_position_embeddings = std::max<int64_t>(mc.max_position_embeddings, cfg.seq);
  std::vector<Row> rows;
  for (PipelineScheduleKind kind :
       {PipelineScheduleKind::GPipe, PipelineScheduleKind::OneFOneB, PipelineScheduleKind::Interleaved1F1B}) {
    const int v = kind == PipelineScheduleKind::Interleaved1F1B ? 2 : 1;
    for (int m : cfg.micro) {
      if (v > 1 && m % P != 0) continue;
      manual_seed(1);
      auto full_model = std::make_shared<CausalLM>(mc);
      auto stages = make_pipeline_stages(*full_model, P, r, v, {}, "dtr-bench pipeline");
      full_model.reset();
      std::vector<PipelineStage> ps;
      std::vector<Tensor> params;
      for (size_t i = 0; i < stages.size(); ++i) {
        ps.push_back({stages[i], static_cast<int>(i) * P + r});
        for (auto& p : stages[i]->parameters()) params.push_back(p);
      }
      PipelineExecutor ex(kind, ps, P * v, pg);
      optim::AdamW adam(params, optim::AdamWOptions{1e-4});
      std::vector<double> bubbles, times, peaks;
      for (int step = 0; step <= cfg.steps; ++step) {
        std::vector<Tensor> ids;
        for (int k = 0; k < m; ++k) {
          manual_seed(100 + k);
          ids.push_back(to_dtype(mul(rand({cfg.rows, cfg.seq}), static_cast<double>(cfg.vocab - 1)), DType::i64));
        }
        pg->barrier()->wait();
        const int64_t held = memory_stats().current;
        reset_peak_memory();
        ex.step(ids, [&](int k, const Tensor& logits) {
          return div(causal_lm_loss(logits, ids[k]), static_cast<double>(m));
        });
        const double peak = static_cast<double>(memory_stats().peak - held);
        adam.step();
        adam.zero_grad();
        if (step == 0) continue;  // warm-up
        // [compute, total] summed / maxed over the ranks; this rank's peak in its slot.
        Tensor c = from_vector<double>({ex.stats().compute_s}, {1});
        Tensor t = from_vector<double>({ex.stats().total_s}, {1});
        pg->all_reduce(c, ReduceOp::SUM)->wait();
        pg->all_reduce(t, ReduceOp::MAX)->wait();
        bubbles.push_back(1.0 - c.item<double>() / (P * t.item<double>()));
        times.push_back(t.item<double>());
        peaks.push_back(peak);
      }
      std::sort(bubbles.begin(), bubbles.end());
      std::sort(times.begin(), times.end());
      Tensor pk = zeros({P}, DType::f64);
      {
        std::vector<double> mine(P, 0.0);
        mine[r] = *std::max_element(peaks.begin(), peaks.end()) / (1024.0 * 1024.0);
        pk = from_vector<double>(mine, {P});
      }
      pg->all_reduce(pk, ReduceOp::SUM)->wait();
      Row row;
      row.schedule = pipeline_schedule_name(kind);
      row.m = m;
      row.bubble = bubbles[bubbles.size() / 2];
      row.theory = double(P - 1) / (v * m + P - 1);
      row.step_s = times[times.size() / 2];
      row.peak_mib = pk.to_vector<double>();
      rows.push_back(row);
    }
  }
  if (r == 0) {
    std::printf("pipeline bench: pp %d, %lld layers, hidden %lld, seq %lld, %lld rows per micro-batch, %d threads\n", P,
                (long long)cfg.layers, (long long)cfg.hidden, (long long)cfg.seq, (long long)cfg.rows,
                omp_get_max_threads());
    std::printf("%-16s %4s %10s %10s %10s   peak activation MiB per stage\n", "schedule", "m", "bubble", "theory",
                "step s");
    std::string json = "{\"pp\": " + std::to_string(P) + ", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& w = rows[i];
      std::string peaks, jp;
      for (size_t k = 0; k < w.peak_mib.size(); ++k) {
        char b[32];
        std::snprintf(b, sizeof b, "%.1f", w.peak_mib[k]);
        peaks += std::string(k ? " " : "") + b;
        jp += std::string(k ? ", " : "") + b;
      }
      std::printf("%-16s %4d %10.3f %10.3f %10.3f   %s\n", w.schedule.c_str(), w.m, w.bubble, w.theory, w.step_s,
                  peaks.c_str());
      char b[256];
      std::snprintf(b, sizeof b, "%s{\"schedule\": \"%s\", \"m\": %d, \"bubble\": %.4f, \"theory\": %.4f, \"step_s\": %.4f, ",
                    i ? ", " : "", w.schedule.c_str(), w.m, w.bubble, w.theory, w.step_s);
      json += b + std::string("\"peak_mib\": [") + jp + "]}";
    }
    std::printf("%s]}\n", json.c_str());
  }
  return 0;
}

}  // namespace dtr::bench
