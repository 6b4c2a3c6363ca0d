// dtr-bench cp-memory (see cp_memory.h).
#include "bench/cp_memory.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "models/transformer/causal_lm.h"
#include "parallel/context_parallel.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/allocator.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr::bench {
namespace {

struct CpMemoryConfig {
  std::vector<int64_t> seqs{4096, 8192, 16384};
  int64_t layers = 2, hidden = 128, intermediate = 256, heads = 4, kv_heads = 2, vocab = 1024;
  int threads = 0;
};

CpMemoryConfig parse(int argc, char** argv) {
  CpMemoryConfig c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    DTR_CHECK(i + 1 < argc, "dtr-bench cp-memory: ", a, " needs a value");
    const std::string v = argv[++i];
    auto num = [&](const std::string& s) {
      char* end = nullptr;
      const long long x = std::strtoll(s.c_str(), &end, 10);
      DTR_CHECK(end && *end == '\0' && x >= 1, "dtr-bench cp-memory: ", a, "=", v, ": expected integers >= 1");
      return static_cast<int64_t>(x);
    };
    if (a == "--seq") {
      c.seqs.clear();
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) c.seqs.push_back(num(t));
    } else if (a == "--layers") c.layers = num(v);
    else if (a == "--hidden") c.hidden = num(v);
    else if (a == "--intermediate") c.intermediate = num(v);
    else if (a == "--heads") c.heads = num(v);
    else if (a == "--kv-heads") c.kv_heads = num(v);
    else if (a == "--vocab") c.vocab = num(v);
    else if (a == "--threads") c.threads = static_cast<int>(num(v));
    else DTR_ERROR("dtr-bench cp-memory: unknown argument '", a,
                   "' (expected --seq --layers --hidden --intermediate --heads --kv-heads --vocab --threads)");
  }
  return c;
}

}  // namespace

int bench_cp_memory(int argc, char** argv) {
  const CpMemoryConfig cfg = parse(argc, argv);
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  DeviceMesh cp_mesh = DeviceMesh::world("cp");
  const int64_t cp = cp_mesh.size(), r = cp_mesh.coordinate(0);
  for (int64_t s : cfg.seqs)
    DTR_CHECK(s % (2 * cp) == 0, "dtr-bench cp-memory: --seq ", s, " is not divisible by 2 * cp = ", 2 * cp,
              " (cp = the world size)");
  ModelConfig mc = llama_debug_config();
  mc.vocab_size = cfg.vocab;
  mc.hidden_size = cfg.hidden;
  mc.intermediate_size = cfg.intermediate;
  mc.num_hidden_layers = cfg.layers;
  mc.num_attention_heads = cfg.heads;
  mc.num_key_value_heads = cfg.kv_heads;
  mc.head_dim = cfg.hidden / cfg.heads;
  int64_t max_seq = 0;
  for (int64_t s : cfg.seqs) max_seq = std::max(max_seq, s);
  mc.max_position_embeddings = max_seq;
  mc.layer_types.assign(mc.num_hidden_layers, "full_attention");
  manual_seed(1);
  CausalLM model(mc);
  apply_context_parallel(model, cp_mesh);
  if (rank() == 0)
    std::printf("cp-memory: cp %lld, %lld layers, hidden %lld, intermediate %lld, heads %lld/%lld, vocab %lld, f32\n",
                (long long)cp, (long long)cfg.layers, (long long)cfg.hidden, (long long)cfg.intermediate,
                (long long)cfg.heads, (long long)cfg.kv_heads, (long long)cfg.vocab);
  if (rank() == 0)
    std::printf("%8s %4s %10s %14s %14s %9s\n", "seq", "cp", "local_tok", "step_peak_MiB", "total_peak_MiB", "step_s");
  std::ostringstream json;
  json << "{\"cp\": " << cp << ", \"rows\": [";
  const double mib = 1024.0 * 1024.0;
  for (size_t i = 0; i < cfg.seqs.size(); ++i) {
    const int64_t T = cfg.seqs[i];
    std::vector<int64_t> ids(T), labels(T, -100);
    for (int64_t t = 0; t < T; ++t) ids[t] = (t * 7 + (t * t) % 13) % cfg.vocab;
    for (int64_t t = 0; t + 1 < T; ++t) labels[t] = ids[t + 1];
    const Tensor ids_l = context_parallel_shard(from_vector<int64_t>(ids, {1, T}), 1, cp, r).contiguous();
    const Tensor lab_l = context_parallel_shard(from_vector<int64_t>(labels, {1, T}), 1, cp, r).contiguous();
    for (auto& p : model.parameters()) p.set_grad(Tensor());
    // Parameters and (after the first step) nothing else are held here; the step's peak above
    // them is activations + gradients.
    const int64_t before = memory_stats().current;
    reset_peak_memory();
    const double t0 = now_s();
    Tensor loss = causal_lm_loss(model.call(ids_l), lab_l, false);
    loss.backward();
    const double dt = now_s() - t0;
    const int64_t step_peak = all_ranks_max(memory_stats().peak - before);
    const int64_t total_peak = all_ranks_max(memory_stats().peak);
    loss = Tensor();
    if (rank() == 0) {
      std::printf("%8lld %4lld %10lld %14.1f %14.1f %9.2f\n", (long long)T, (long long)cp, (long long)(T / cp),
                  step_peak / mib, total_peak / mib, dt);
      std::fflush(stdout);
    }
    json << (i ? ", " : "") << "{\"seq\": " << T << ", \"local_tokens\": " << T / cp
         << ", \"step_peak_bytes\": " << step_peak << ", \"total_peak_bytes\": " << total_peak
         << ", \"step_s\": " << dt << "}";
  }
  json << "]}";
  if (rank() == 0) std::printf("%s\n", json.str().c_str());
  return 0;
}

}  // namespace dtr::bench
