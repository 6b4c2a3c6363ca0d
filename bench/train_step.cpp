// dtr-bench train-step (see train_step.h).
#include "bench/train_step.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "bench/cpu_peak.h"
#include "models/formats/gguf.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/flops.h"
#include "models/transformer/memory_plan.h"
#include "models/lora/inject.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh_context.h"
#include "parallel/model_parallelizer.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/nn/to_device.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/profiler.h"
#include "tensor/random.h"
#ifdef DTR_WITH_CUDA
#include "tensor/cuda/cuda_context.h"
#endif

namespace dtr::bench {
namespace {

/// The Llama of the shape flags.
LlamaConfig llama_config(const TrainStepConfig& c) {
  LlamaConfig l;
  l.vocab_size = c.vocab;
  l.hidden_size = c.hidden;
  l.intermediate_size = c.intermediate;
  l.num_hidden_layers = c.layers;
  l.num_attention_heads = c.heads;
  l.num_key_value_heads = c.kv_heads;
  l.head_dim = c.hidden / c.heads;
  l.max_position_embeddings = std::max<int64_t>(2048, c.seq);
  l.rope_theta = 100000.0;
  l.rms_norm_eps = 1e-5;
  l.tie_word_embeddings = true;
  return l;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Peak resident set of this process in MiB (getrusage ru_maxrss, KiB on Linux).
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

/// Coarse family of an op name for the per-family table.
std::string op_family(const std::string& n) {
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("attention") || has("sdpa")) return "attention";
  if (has("matmul") || has("mm") || has("linear") || has("gemm")) return "gemm";
  if (has("cross_entropy") || has("nll") || has("softmax")) return "softmax/loss";
  if (has("norm")) return "norm";
  if (has("rope") || has("rotary")) return "rope";
  if (has("embedding")) return "embedding";
  if (has("adam") || has("optim")) return "optimizer";
  if (has("sum") || has("mean") || has("max") || has("reduce")) return "reduction";
  if (has("copy") || has("contiguous") || has("cat") || has("to_dtype") || has("transpose") || has("permute") ||
      has("slice") || has("index") || has("gather") || has("scatter") || has("fill") || has("zeros") ||
      has("empty") || has("full"))
    return "copy/layout/factory";
  return "pointwise";
}

struct Phases {
  std::vector<double> step, fwd, bwd, opt, comm, other;
  // FSDP: comm split per step into the part of each wait not hidden on any rank (the smallest
  // wait of that collective over the ranks) and rank 0's waiting for a slower rank (the rest).
  std::vector<double> comm_last, comm_skew;
};

constexpr const char* kHelp =
    "dtr-bench train-step [--layers 30] [--hidden 576] [--intermediate 1536] [--heads 9] [--kv-heads 3]\n"
    "    [--vocab 49152] [--seq 256] [--batch 4] [--lora-rank 8] [--lora-alpha 16] [--steps 10] [--warmup 2]\n"
    "    [--threads T] [--full-ft] [--fsdp] [--device cpu|cuda] [--model CONFIG] [--save-config PATH]\n"
    "Llama (SmolLM2-135M shape by default, tied embeddings), random init, random token ids and labels\n"
    "(fixed seed, labels unshifted), LoRA on q,k,v,o,gate,up,down (--full-ft: all weights trainable),\n"
    "AdamW lr 1e-4; --fsdp under mpirun: fully_shard per decoder layer + root over the world.\n"
    "--device cuda: model, step and optimizer on the GPU of each rank's local rank (the batch is copied\n"
    "in once, the loss read back each step; phases are timed after a device synchronisation; no MFU).\n"
    "Model FLOPs per step (T = batch*seq tokens, N = weights entering a matmul: all decoder Linears +\n"
    "lm_head hidden*vocab, embedding lookup 0; attention counts the full SxS square like PaLM/torchtitan):\n"
    "  attention = 12*L*H*D*S*T\n"
    "  full FT   = 6*N*T + attention\n"
    "  LoRA      = 4*N*T + 6*T*sum_adapters r*(in+out) + attention   (frozen base: no weight grads)\n"
    "--model CONFIG: the model of a config.json (or HF directory), a .gguf (metadata only) or a built-in\n"
    "shape name, any family (Qwen3, Gemma 3, ...), random init; --layers then cuts it to its first layers\n"
    "and the other shape flags are unused. --save-config PATH writes the resolved config.json.\n"
    "Op profile: per op family ms, bytes moved (reads + writes of each op's tensors, from their sizes;\n"
    "views 0) and GB/s against the STREAM triad bandwidth (measured before the model is built, 384 MiB,\n"
    "all ranks at once), GEMM / attention FLOPs and GFLOP/s against the SGEMM peak. Floor step time =\n"
    "(GEMM + attention FLOPs) / SGEMM peak + sum over the other families of bytes / triad bandwidth\n"
    "(autograd / hooks outside ops: 0; the CPU optimizer = the optimizer phase, 28 bytes per local\n"
    "trainable parameter), and the MFU it implies.\n"
    "Last stdout line: one JSON object (step_ms_median, tokens_per_s, model_flops_per_step, peak_rss_mib,\n"
    "phases{forward_ms, backward_ms, optimizer_ms, comm_exposed_ms, other_ms; --fsdp: comm_exposed_last_rank_ms,\n"
    "comm_waiting_for_slower_rank_ms: per collective the smallest wait over the ranks, and rank 0's\n"
    "wait beyond it, summed per step; medians over steps}, op_families{ms, bytes,\n"
    "flops}, floor{step_ms, mfu, ...}, ...).\n";

/// 0: parsed; 1: help printed; 2: bad arguments (message printed).
int parse(int argc, char** argv, TrainStepConfig& c) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      if (rank() == 0) std::printf("%s", kHelp);
      return 1;
    }
    auto next_i = [&](int64_t& v, int64_t lo) {
      if (i + 1 >= argc) return false;
      v = std::atoll(argv[++i]);
      return v >= lo;
    };
    auto next_int = [&](int& v, int lo) {
      int64_t x = 0;
      if (!next_i(x, lo)) return false;
      v = static_cast<int>(x);
      return true;
    };
    bool ok = true;
    if (a == "--layers") {
      ok = next_i(c.layers, 1);
      c.layers_given = true;
    } else if (a == "--model" || a == "--save-config") {
      ok = i + 1 < argc;
      if (ok) (a == "--model" ? c.model : c.save_config) = argv[++i];
    } else if (a == "--hidden") ok = next_i(c.hidden, 1);
    else if (a == "--intermediate") ok = next_i(c.intermediate, 1);
    else if (a == "--heads") ok = next_i(c.heads, 1);
    else if (a == "--kv-heads") ok = next_i(c.kv_heads, 1);
    else if (a == "--vocab") ok = next_i(c.vocab, 2);
    else if (a == "--seq") ok = next_i(c.seq, 1);
    else if (a == "--batch") ok = next_i(c.batch, 1);
    else if (a == "--lora-rank") ok = next_i(c.lora_rank, 1);
    else if (a == "--lora-alpha") {
      ok = i + 1 < argc;
      if (ok) c.lora_alpha = std::atof(argv[++i]);
      ok = ok && c.lora_alpha > 0;
    } else if (a == "--steps") ok = next_int(c.steps, 1);
    else if (a == "--warmup") ok = next_int(c.warmup, 0);
    else if (a == "--threads") ok = next_int(c.threads, 1);
    else if (a == "--full-ft") c.full_ft = true;
    else if (a == "--fsdp") c.fsdp = true;
    else if (a == "--device") {
      ok = i + 1 < argc;
      if (ok) c.device = argv[++i];
      ok = ok && (c.device == "cpu" || c.device == "cuda");
    } else ok = false;
    if (!ok) {
      if (rank() == 0) std::fprintf(stderr, "dtr-bench train-step: bad argument '%s'\n%s", a.c_str(), kHelp);
      return 2;
    }
  }
  if (c.device == "cuda" && cuda_device() < 0) {
    if (rank() == 0)
      std::fprintf(stderr, "dtr-bench train-step: --device cuda: no CUDA device visible to this rank%s\n",
#ifdef DTR_WITH_CUDA
                   ""
#else
                   " (dtr was built without CUDA)"
#endif
      );
    return 2;
  }
  if (c.model.empty() && (c.hidden % c.heads != 0 || c.heads % c.kv_heads != 0)) {
    if (rank() == 0)
      std::fprintf(stderr, "dtr-bench train-step: heads (%lld) must divide hidden (%lld) and kv-heads (%lld) heads\n",
                   static_cast<long long>(c.heads), static_cast<long long>(c.hidden),
                   static_cast<long long>(c.kv_heads));
    return 2;
  }
  return 0;
}

}  // namespace

/// Best FLOP/s of dtr's f32 matmul at 1024^3 (the SGEMM peak MFU is measured against).
double sgemm_peak_flops() {
  NoGradGuard ng;
  const int64_t n = 1024;
  Tensor a = randn({n, n}), b = randn({n, n});
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const double t0 = now_s();
    Tensor c = matmul(a, b);
    const double s = now_s() - t0;
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

ModelConfig train_step_model_config(const TrainStepConfig& c) {
  if (c.model.empty()) return llama_config(c);
  ModelConfig m;
  const std::string& p = c.model;
  const bool gguf_file = p.size() > 5 && p.compare(p.size() - 5, 5, ".gguf") == 0;
  const std::vector<std::string> names = builtin_model_names();
  if (gguf_file) m = model_config_from_gguf(gguf::GGUFFile::open(p));
  else if (std::find(names.begin(), names.end(), p) != names.end()) m = builtin_model_config(p);
  else m = load_model_config(p);
  if (c.layers_given) {
    m.num_hidden_layers = c.layers;
    const std::vector<std::string> types = m.layer_types;  // cut, or repeated (Gemma 3: period 6)
    m.layer_types.clear();
    for (int64_t l = 0; l < c.layers && !types.empty(); ++l) m.layer_types.push_back(types[l % types.size()]);
  }
  m.max_position_embeddings = std::max(m.max_position_embeddings, c.seq);
  m.validate("dtr-bench train-step --model " + p);
  return m;
}

double train_step_model_flops(const TrainStepConfig& c) {
  // The formula lives with the model (models/transformer/flops.h); dtr-train uses it too.
  const ModelConfig m = train_step_model_config(c);
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.intermediate_size);
  const double D = static_cast<double>(llama_head_dim(m));
  const double q = static_cast<double>(m.num_attention_heads) * D, kv = static_cast<double>(m.num_key_value_heads) * D;
  const double r = static_cast<double>(c.lora_rank);
  // Adapters: (in, out) of q, k, v, o, gate, up, down.
  const double adapters =
      static_cast<double>(m.num_hidden_layers) * r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h));
  return llama_train_flops_per_token(m, !c.full_ft, adapters, static_cast<double>(c.seq)) *
         static_cast<double>(c.batch * c.seq);
}

int bench_train_step(int argc, char** argv) {
  if (!is_initialized()) init(argc, argv);
  TrainStepConfig c;
  if (const int rc = parse(argc, argv, c); rc != 0) return rc == 1 ? 0 : 2;
  if (c.threads > 0) set_num_threads(c.threads);
  const int world = world_size();
  const bool root = rank() == 0;

  MeshContext ctx;
  ctx.world_size = world;
  ctx.dp_size = world;
  const Device dev = c.device == "cuda" ? Device::cuda(cuda_device()) : Device::cpu();
  if (c.fsdp) {
    ctx.validate("dtr-bench train-step");
    ctx.build_mesh(dev);
  }

  // Memory bandwidth for the floor, before the model exists (its 384 MiB are freed again);
  // under dp all ranks at once, so each sees its share of the bus.
  if (c.fsdp) (void)all_ranks_max(0);
  const double triad = dev.is_cuda() ? 0.0 : triad_bytes_per_s(num_threads());
  ModelConfig mc;
  try {
    mc = train_step_model_config(c);
    if (!c.save_config.empty() && root) save_model_config(mc, c.save_config);
  } catch (const Error& e) {
    if (root) std::fprintf(stderr, "dtr-bench train-step: %s\n", e.what());
    return 2;
  }
  manual_seed(1234);
  auto model = std::make_shared<CausalLM>(mc);
  if (!c.full_ft) {
    LoraConfig lc;
    lc.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    lc.options.r = c.lora_rank;
    lc.options.alpha = c.lora_alpha;
    apply_lora(*model, lc);
  }
  nn::module_to_device(*model, dev);
  int64_t total = 0, trainable = 0;
  for (const auto& [n, p] : model->named_parameters()) {
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  if (c.fsdp) parallelize_model(*model, ctx);
  std::vector<Tensor> params;
  for (const Tensor& p : model->parameters())
    if (p.requires_grad()) params.push_back(p);
  optim::AdamWOptions ao;
  ao.lr = 1e-4;
  optim::AdamW optimizer(params, ao);

  // Random token ids and labels from a fixed seed (per rank), labels used as given (no shift).
  std::mt19937_64 gen(42 + static_cast<uint64_t>(rank()));
  std::uniform_int_distribution<int64_t> tok(0, mc.vocab_size - 1);
  std::vector<int64_t> ids_v(static_cast<size_t>(c.batch * c.seq)), lab_v(ids_v.size());
  for (auto& x : ids_v) x = tok(gen);
  for (auto& x : lab_v) x = tok(gen);
  const Tensor ids = from_vector<int64_t>(ids_v, {c.batch, c.seq}).to(dev);
  const Tensor labels = from_vector<int64_t>(lab_v, {c.batch, c.seq}).to(dev);

  const bool gpu = dev.is_cuda();
  const double peak = gpu ? 0.0 : sgemm_peak_flops();  // MFU against the CPU SGEMM peak only
  // CUDA: kernels run asynchronously; a phase ends when its work on the device ended.
  auto sync = [gpu] {
#ifdef DTR_WITH_CUDA
    if (gpu) cuda::synchronize();
#else
    (void)gpu;
#endif
  };
  Phases ph;
  std::vector<std::vector<double>> step_waits;  // --fsdp: this rank's FSDP waits per timed step, in order
  set_fsdp_wait_log(c.fsdp);
  double loss_v = 0, initial_loss = NAN;
  auto step = [&](bool record) {
    const double c0 = fsdp_exposed_comm_seconds(), t0 = now_s();
    Tensor loss = causal_lm_loss(*model, ids, labels, false);  // fused head: no [tokens, vocab] logits
    sync();
    const double c1 = fsdp_exposed_comm_seconds(), t1 = now_s();
    loss.backward();
    sync();
    const double c2 = fsdp_exposed_comm_seconds(), t2 = now_s();
    optimizer.step();
    optimizer.zero_grad();
    sync();
    const double c3 = fsdp_exposed_comm_seconds(), t3 = now_s();
    loss_v = static_cast<double>(loss.detach().item<float>());
    const double t4 = now_s();
    if (std::isnan(initial_loss)) initial_loss = loss_v;
    std::vector<double> waits = take_fsdp_wait_log();
    if (!record) return;
    if (c.fsdp) step_waits.push_back(std::move(waits));
    const double comm = c3 - c0;
    ph.step.push_back(t4 - t0);
    ph.fwd.push_back((t1 - t0) - (c1 - c0));
    ph.bwd.push_back((t2 - t1) - (c2 - c1));
    ph.opt.push_back((t3 - t2) - (c3 - c2));
    ph.comm.push_back(comm);
    ph.other.push_back(t4 - t3);
  };
  for (int i = 0; i < c.warmup; ++i) step(false);
  if (c.fsdp) (void)all_ranks_max(0);  // start the timed steps together
  reset_op_profile();
  const double cpu0 = cpu_seconds();
  {
    OpProfilerScope prof;
    for (int i = 0; i < c.steps; ++i) step(true);
  }
  // CPU time per step: on a shared, oversubscribed machine wall time mostly measures the
  // scheduler; CPU time (best with --threads 1, where no thread spins at a barrier) measures
  // the work.
  const double cpu_step = (cpu_seconds() - cpu0) / c.steps;
  set_fsdp_wait_log(false);
  // Each collective's smallest wait over the ranks (all ranks wait for the same collectives in
  // the same order; the counts are compared first).
  for (const std::vector<double>& w : step_waits) {
    const int64_t n = static_cast<int64_t>(w.size());
    if (all_ranks_max(n) != -all_ranks_max(-n)) {  // every rank takes the same branch
      ph.comm_last.clear();
      ph.comm_skew.clear();
      break;
    }
    double last = 0, mine = 0;
    for (double x : w) {
      last += static_cast<double>(-all_ranks_max(-static_cast<int64_t>(x * 1e9))) * 1e-9;
      mine += x;
    }
    ph.comm_last.push_back(last);
    ph.comm_skew.push_back(mine - last);
  }
  const std::vector<OpProfileEntry> ops = op_profile();

  const double step_s = median(ph.step);
  const double tokens = static_cast<double>(c.batch * c.seq * world);
  const double flops = train_step_model_flops(c) * world;
  const double rss = static_cast<double>(all_ranks_max(static_cast<int64_t>(peak_rss_mib() * 1024.0))) / 1024.0;
  const double ms = 1e3;
  if (root) {
    std::printf("dtr-bench train-step: %s on %s, %lld layers hidden %lld inter %lld heads %lld/%lld vocab %lld, "
                "batch %lld x seq %lld per rank, world %d, %d threads/rank; %lld params, %lld trainable; "
                "%d timed steps after %d warm-up; loss %.4f\n",
                c.full_ft ? "full fine-tune" : "LoRA", dev.str().c_str(), static_cast<long long>(mc.num_hidden_layers),
                static_cast<long long>(mc.hidden_size), static_cast<long long>(mc.intermediate_size),
                static_cast<long long>(mc.num_attention_heads), static_cast<long long>(mc.num_key_value_heads),
                static_cast<long long>(mc.vocab_size),
                static_cast<long long>(c.batch), static_cast<long long>(c.seq), world, num_threads(),
                static_cast<long long>(total), static_cast<long long>(trainable), c.steps, c.warmup, loss_v);
    std::printf("\nphase (median over steps, rank 0)  ms       %% of step\n");
    auto row = [&](const char* n, const std::vector<double>& v) {
      const double m = median(v);
      std::printf("  %-30s %9.2f %8.1f%%\n", n, m * ms, step_s > 0 ? 100.0 * m / step_s : 0.0);
    };
    row("forward (incl. loss)", ph.fwd);
    row("backward", ph.bwd);
    row("optimizer (step + zero_grad)", ph.opt);
    row("communication exposed", ph.comm);
    if (!ph.comm_last.empty()) {
      row("  not hidden on any rank", ph.comm_last);
      row("  waiting for a slower rank", ph.comm_skew);
    }
    row("other", ph.other);
    row("step", ph.step);
    const double n_steps = static_cast<double>(c.steps);
    double in_ops = 0;
    std::map<std::string, OpProfileEntry> fam;  // per family: calls, seconds, bytes, flops (all steps)
    for (const auto& e : ops) {
      in_ops += e.seconds;
      OpProfileEntry& f = fam[op_family(e.name)];
      f.calls += e.calls;
      f.seconds += e.seconds;
      f.bytes += e.bytes;
      f.flops += e.flops;
    }
    double sum_steps = 0;  // the op table's % are of the total time of the timed steps
    for (double t : ph.step) sum_steps += t;
    if (!gpu) {
      // The CPU AdamW update runs its kernel directly (no dispatch): its family is the optimizer
      // phase, moving 28 bytes per local trainable f32 parameter (p, m, v read + written, g read;
      // trainable / world under FSDP).
      OpProfileEntry& o = fam["optimizer"];
      for (double t : ph.opt) o.seconds += t, in_ops += t;
      o.calls += c.steps;
      o.bytes += 28.0 * static_cast<double>(trainable) / world * n_steps;
    }
    std::vector<std::pair<std::string, OpProfileEntry>> fams(fam.begin(), fam.end());
    std::sort(fams.begin(), fams.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
    // Floor: a compute family (GEMM FLOPs, attention FLOPs) at the SGEMM peak, every other family
    // at the triad bandwidth; autograd / hooks outside ops at 0.
    auto compute_family = [](const std::string& n) { return n == "gemm" || n == "attention"; };
    auto floor_s = [&](const std::string& n, const OpProfileEntry& f) {
      if (compute_family(n)) return peak > 0 ? f.flops / n_steps / peak : 0.0;
      return triad > 0 ? f.bytes / n_steps / triad : 0.0;
    };
    double floor_step = 0;
    for (const auto& [n, f] : fams) floor_step += floor_s(n, f);
    std::printf("\nop family (outermost dispatch, per step)  calls     ms   %% of step      MB   GB/s %%triad"
                "  GFLOP  GFLOP/s %%peak  floor ms  x floor\n");
    for (const auto& [n, f] : fams) {
      const double t = f.seconds / n_steps, fl = floor_s(n, f);
      std::printf("  %-36s %7.0f %8.2f %8.1f%% %8.1f %6.1f %5.1f%% %6.2f %8.1f %5.1f%% %9.2f %7.1f\n", n.c_str(),
                  static_cast<double>(f.calls) / n_steps, t * ms, 100.0 * f.seconds / sum_steps, f.bytes / n_steps * 1e-6,
                  t > 0 ? f.bytes / n_steps / t * 1e-9 : 0.0, t > 0 && triad > 0 ? 100.0 * f.bytes / n_steps / t / triad : 0.0,
                  f.flops / n_steps * 1e-9, t > 0 ? f.flops / n_steps / t * 1e-9 : 0.0,
                  t > 0 && peak > 0 ? 100.0 * f.flops / n_steps / t / peak : 0.0, fl * ms, fl > 0 ? t / fl : 0.0);
    }
    std::printf("  %-36s %7s %8.2f %8.1f%%\n", "(outside ops: autograd, hooks, comm)", "",
                (sum_steps - in_ops) / n_steps * ms, 100.0 * (sum_steps - in_ops) / sum_steps);
    const double floor_mfu = floor_step > 0 && peak > 0 ? flops / world / floor_step / peak : 0.0;
    std::printf("floor: %.2f ms/step = (GEMM + attention FLOPs) / SGEMM peak %.2f GFLOP/s + bytes of the other "
                "families / triad %.2f GB/s; MFU at the floor %.1f%% (measured step %.2f ms = x%.2f the floor)\n",
                floor_step * ms, peak * 1e-9, triad * 1e-9, 100.0 * floor_mfu, step_s * ms,
                floor_step > 0 ? step_s / floor_step : 0.0);
    std::printf("\nop (per step)                            calls     ms   %% of step      MB   GB/s  GFLOP/s\n");
    for (const auto& e : ops)
      std::printf("  %-36s %7.0f %8.2f %8.1f%% %8.1f %6.1f %8.1f\n", e.name.c_str(), static_cast<double>(e.calls) / n_steps,
                  e.seconds / n_steps * ms, 100.0 * e.seconds / sum_steps, e.bytes / n_steps * 1e-6,
                  e.seconds > 0 ? e.bytes / e.seconds * 1e-9 : 0.0, e.seconds > 0 ? e.flops / e.seconds * 1e-9 : 0.0);
    char mfu_pct[32];
    std::snprintf(mfu_pct, sizeof mfu_pct, "%.1f%%", 100.0 * flops / step_s / (peak * world));
    const std::string mfu = gpu ? std::string("n/a on cuda") : std::string(mfu_pct);
    std::printf("\nmodel FLOPs/step %.4g (%s; see bench/train_step.h), %.2f GFLOP/s, SGEMM peak %.2f GFLOP/s/rank, "
                "MFU %s, %.1f tokens/s, peak RSS %.1f MiB (max over ranks), CPU %.1f ms/step (rank 0)\n",
                flops, c.full_ft ? "6NT + attention" : "4NT + LoRA + attention", flops / step_s * 1e-9,
                peak * 1e-9, mfu.c_str(), tokens / step_s, rss, cpu_step * ms);
    nlohmann::json j;
    j["bench"] = "train-step";
    j["framework"] = "dtr";
    j["step_ms_median"] = step_s * ms;
    j["tokens_per_s"] = tokens / step_s;
    j["model_flops_per_step"] = flops;
    j["model_flops_per_s"] = flops / step_s;
    j["sgemm_peak_flops"] = peak;
    j["mfu"] = gpu ? nlohmann::json() : nlohmann::json(flops / step_s / (peak * world));
    j["device"] = dev.str();
    j["peak_rss_mib"] = rss;
    j["cpu_ms_per_step"] = cpu_step * ms;  // rank 0, all its threads
    j["loss"] = loss_v;
    j["phases"] = {{"forward_ms", median(ph.fwd) * ms},
                   {"backward_ms", median(ph.bwd) * ms},
                   {"optimizer_ms", median(ph.opt) * ms},
                   {"comm_exposed_ms", median(ph.comm) * ms},
                   {"other_ms", median(ph.other) * ms}};
    if (!ph.comm_last.empty()) {
      j["phases"]["comm_exposed_last_rank_ms"] = median(ph.comm_last) * ms;
      j["phases"]["comm_waiting_for_slower_rank_ms"] = median(ph.comm_skew) * ms;
    }
    // Per-step ms of each op family (the table above; "(outside ops)" = autograd, hooks, comm):
    // bench/compare's report reads attention's share from it.
    nlohmann::json fj = nlohmann::json::object(), fd = nlohmann::json::object();
    for (const auto& [n, f] : fams) {
      fj[n] = f.seconds / n_steps * ms;
      // Per step: bytes moved, FLOPs (gemm / attention), floor ms (rank 0).
      fd[n] = {{"ms", f.seconds / n_steps * ms}, {"calls", static_cast<double>(f.calls) / n_steps},
               {"bytes", f.bytes / n_steps}, {"flops", f.flops / n_steps}, {"floor_ms", floor_s(n, f) * ms},
               {"bound", compute_family(n) ? "sgemm_peak" : "triad"}};
    }
    fj["(outside ops)"] = (sum_steps - in_ops) / n_steps * ms;
    j["op_families_ms"] = fj;
    j["op_families"] = fd;
    j["floor"] = {{"step_ms", floor_step * ms}, {"mfu", floor_mfu}, {"sgemm_peak_flops", peak},
                  {"triad_bytes_per_s", triad}, {"step_over_floor", floor_step > 0 ? step_s / floor_step : 0.0}};
    j["initial_loss"] = initial_loss;
    j["config"] = {{"model_type", mc.model_type}, {"model", c.model},
                   {"layers", mc.num_hidden_layers}, {"hidden", mc.hidden_size}, {"intermediate", mc.intermediate_size},
                   {"heads", mc.num_attention_heads}, {"kv_heads", mc.num_key_value_heads},
                   {"head_dim", llama_head_dim(mc)}, {"vocab", mc.vocab_size},
                   {"seq", c.seq},       {"batch", c.batch},        {"lora_rank", c.lora_rank},
                   {"lora_alpha", c.lora_alpha}, {"full_ft", c.full_ft}, {"fsdp", c.fsdp},
                   {"world", world},     {"threads", num_threads()}, {"steps", c.steps},
                   {"warmup", c.warmup}, {"params", total},         {"trainable_params", trainable}};
    std::printf("\n%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dtr::bench
