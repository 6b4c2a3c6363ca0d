// dtr-bench fsdp (see fsdp.h).
#include "bench/fsdp.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "parallel/fsdp/fully_shard.h"
#include "runtime/env.h"
#include "tensor/allocator.h"
#include "tensor/nn/embedding.h"
#include "tensor/nn/linear.h"
#include "tensor/nn/module_list.h"
#include "tensor/nn/rms_norm.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/random.h"

namespace dtr::bench {
namespace {

struct Config {
  int64_t layers = 4, dim = 256, hidden = 704, vocab = 2048, seq = 64, batch = 8;
  int steps = 4;
  bool reshard = true;
};

struct Block : nn::Module {
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> up, down;
  Block(int64_t d, int64_t h) {
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(d));
    up = register_module("up", std::make_shared<nn::Linear>(d, h, false));
    down = register_module("down", std::make_shared<nn::Linear>(h, d, false));
  }
  Tensor forward(const Tensor& x) override { return add(x, down->call(silu(up->call(norm->call(x))))); }
};

struct Net : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;
  explicit Net(const Config& c) {
    emb = register_module("emb", std::make_shared<nn::Embedding>(c.vocab, c.dim));
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < c.layers; ++i) layers->push_back(std::make_shared<Block>(c.dim, c.hidden));
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(c.dim));
    head = register_module("head", std::make_shared<nn::Linear>(c.dim, c.vocab, false));
  }
  Tensor forward(const Tensor& ids) override {
    Tensor h = emb->call(ids);
    for (auto& l : layers->children()) h = l->call(h);
    return head->call(norm->call(h));
  }
};

struct Result {
  double step_s = 0, exposed = 0;
  int64_t bytes = 0, peak = 0;
};

/// Padded per-rank shard elements of a unit.
int64_t padded(const std::vector<Tensor>& ps, int64_t n) {
  int64_t e = 0;
  for (const Tensor& p : ps) e += (p.size(0) + n - 1) / n * (p.numel() / p.size(0));
  return e;
}

Result run(const Config& c, int prefetch, const DeviceMesh& mesh) {
  manual_seed(1);
  auto net = std::make_shared<Net>(c);
  FSDPOptions o;
  o.reshard_after_forward = c.reshard;
  o.forward_prefetch_depth = prefetch;
  o.backward_prefetch_depth = prefetch;
  for (auto& l : net->layers->children()) fully_shard(*l, mesh, o);
  fully_shard(*net, mesh, o);
  optim::AdamW adam(net->parameters(), optim::AdamWOptions{1e-3});
  std::vector<int64_t> ids_v(static_cast<size_t>(c.batch * c.seq)), tg_v(ids_v.size());
  for (size_t i = 0; i < ids_v.size(); ++i) {
    ids_v[i] = static_cast<int64_t>((i * 7919 + rank() * 104729) % static_cast<size_t>(c.vocab));
    tg_v[i] = static_cast<int64_t>((i * 31 + 17 + rank()) % static_cast<size_t>(c.vocab));
  }
  const Tensor ids = from_vector<int64_t>(ids_v, {c.batch, c.seq}), tg = from_vector<int64_t>(tg_v, {c.batch * c.seq});
  auto step = [&] {
    Tensor loss = cross_entropy(net->call(ids).reshape({-1, c.vocab}), tg);
    loss.backward();
    adam.step();
    adam.zero_grad();
  };
  step();  // warm-up: optimizer state, forward order for prefetch
  CommCounters& cnt = mesh.group(0)->counters();
  cnt.reset();
  reset_fsdp_exposed_comm_seconds();
  reset_peak_memory();
  mesh.group(0)->barrier()->wait();
  const double t0 = now_s();
  for (int s = 0; s < c.steps; ++s) step();
  const double t = (now_s() - t0) / c.steps;
  Result r;
  r.step_s = t;
  r.exposed = fsdp_exposed_comm_seconds() / c.steps / t;
  r.bytes = (cnt.nbytes(CommKind::all_gather) + cnt.nbytes(CommKind::reduce_scatter)) / c.steps;
  r.peak = memory_stats().peak;
  // Worst over ranks for bytes / peak / exposed fraction.
  r.peak = all_ranks_max(r.peak);
  r.bytes = all_ranks_max(r.bytes);
  r.exposed = static_cast<double>(all_ranks_max(static_cast<int64_t>(r.exposed * 1e6))) * 1e-6;
  return r;
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

int bench_fsdp(int argc, char** argv) {
  if (!is_initialized()) init(argc, argv);
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](int64_t& v) {
      if (i + 1 >= argc) return false;
      v = std::atoll(argv[++i]);
      return v > 0;
    };
    int64_t steps = c.steps;
    bool ok = true;
    if (a == "--layers") ok = next(c.layers);
    else if (a == "--dim") ok = next(c.dim);
    else if (a == "--hidden") ok = next(c.hidden);
    else if (a == "--vocab") ok = next(c.vocab);
    else if (a == "--seq") ok = next(c.seq);
    else if (a == "--batch") ok = next(c.batch);
    else if (a == "--steps") ok = next(steps), c.steps = static_cast<int>(steps);
    else if (a == "--no-reshard") c.reshard = false;
    else ok = false;
    if (!ok) {
      if (rank() == 0) std::fprintf(stderr, "dtr-bench fsdp: bad argument '%s' (see bench/fsdp.h)\n", a.c_str());
      return 2;
    }
  }
  const int64_t n = world_size();
  DeviceMesh mesh = DeviceMesh::world("dp");

  // Theory from the model's shapes (unsharded copy on rank 0 is cheap at these sizes).
  manual_seed(1);
  Net ref(c);
  std::vector<std::vector<Tensor>> units;
  for (auto& l : ref.layers->children()) units.push_back(l->parameters());
  units.push_back({ref.emb->weight(), ref.norm->weight(), ref.head->weight()});
  int64_t ag = 0, rs = 0, state = 0, numel = 0, largest_unit = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t s = padded(units[u], n);
    const bool root = u + 1 == units.size();
    ag += s * (1 + (c.reshard && !root ? 1 : 0));
    rs += n * s;
    state += s * 4;  // param, grad, exp_avg, exp_avg_sq
    int64_t full = 0;
    for (auto& p : units[u]) full += p.numel();
    numel += full;
    if (!root) largest_unit = std::max(largest_unit, full);
  }
  int64_t root_full = 0;
  for (auto& p : units.back()) root_full += p.numel();

  if (rank() == 0) {
    std::printf("dtr-bench fsdp: dp=%lld, %lld blocks dim %lld hidden %lld vocab %lld, batch %lldx%lld per rank, "
                "%lld params (%.2f MiB f32), reshard_after_forward=%d, %d timed steps\n",
                static_cast<long long>(n), static_cast<long long>(c.layers), static_cast<long long>(c.dim),
                static_cast<long long>(c.hidden), static_cast<long long>(c.vocab), static_cast<long long>(c.batch),
                static_cast<long long>(c.seq), static_cast<long long>(numel), mib(numel * 4), c.reshard ? 1 : 0,
                c.steps);
    std::printf("theory per rank: bytes/step %.3f MiB (all-gather %.3f + reduce-scatter %.3f); sharded state "
                "(p+g+adam) %.3f MiB vs dp=1 %.3f MiB; unsharded window root + (1+prefetch) blocks (all with --no-reshard)\n",
                mib((ag + rs) * 4), mib(ag * 4), mib(rs * 4), mib(state * 4), mib(numel * 16));
    std::printf("%-10s %10s %14s %14s %8s %12s %14s %10s\n", "prefetch", "step ms", "bytes/step MiB", "theory MiB",
                "ratio", "peak MiB", "state+window", "exposed");
  }
  for (int prefetch : {1, 0}) {
    const Result r = run(c, prefetch, mesh);
    // Unsharded parameters + the all-gather output buffer: root + (1 + prefetch) blocks when
    // resharding after forward, every block otherwise.
    const int64_t blocks = c.reshard ? std::min<int64_t>(1 + prefetch, c.layers) : c.layers;
    const int64_t window = (root_full + blocks * largest_unit) * 4 * 2;
    if (rank() == 0)
      std::printf("%-10d %10.2f %14.3f %14.3f %8.4f %12.2f %14.2f %9.1f%%\n", prefetch, r.step_s * 1e3, mib(r.bytes),
                  mib((ag + rs) * 4), static_cast<double>(r.bytes) / static_cast<double>((ag + rs) * 4), mib(r.peak),
                  mib(state * 4 + window), r.exposed * 100.0);
  }
  if (rank() == 0)
    std::printf("peak memory includes activations and temporaries (not in the theoretical column); exposed = "
                "time blocked in FSDP waits / step time (max over ranks)\n");
  return 0;
}

}  // namespace dtr::bench
