// Sequence packing through the model (set_attention_documents: per-document RoPE positions and a
// block-diagonal causal mask in every attention layer):
//  - single process: a packed batch gives the loss and every parameter gradient of the same
//    samples run one by one unpadded, token-weighted (sum_i mean_i * n_i / N), f64; the debug Llama
//    (GQA 4 / 2) and the tiny Gemma 3 (sliding window 5, q/k norm, sandwich norms); without the
//    documents the packed loss differs (the test can fail);
//  - on 2, 3 and 4 ranks: 3 AdamW steps of packed training with the trainer's weighting (each dp
//    rank's token mean x its label tokens x dp / the global batch's label tokens) equal the single
//    process: 2 ranks FSDP 2, DDP 2, TP 2, TP 2 + sequence parallel; 3: FSDP 3; 4: FSDP 2 x TP 2,
//    FSDP 4.
#include <catch2/catch.hpp>

#include "dtensor/api.h"
#include "gradcheck.h"
#include "models/data/packing.h"
#include "models/transformer/load.h"
#include "parallel/model_parallelizer.h"
#include "parallel/train_compare.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

/// f64 models: packed and unpacked (and the meshes) sum in other orders only, ~1e-15 relative;
/// AdamW over 5 steps keeps such noise below 1e-12 (see mpi_test_families_parallel).
constexpr double kLossRelTol = 1e-11;
constexpr double kGradTol = 1e-11;
constexpr double kParamTol = 1e-9;
constexpr int64_t kPack = 24;       // packed_sequence_size
constexpr int64_t kRowsPerStep = 12;  // global batch in packed rows: split over dp 1..4
constexpr int64_t kSteps = 3;        // AdamW steps

std::shared_ptr<CausalLM> make_model(const std::string& family) {
  if (family == "llama") {
    manual_seed(7);
    return std::make_shared<CausalLM>(llama_debug_config(), DType::f64);
  }
  return load_model_hf("tests/golden/" + family + "_debug", DType::f64);
}

/// Chat-like samples of 3..20 tokens: a prompt of 1..5 tokens without loss, then the labels.
std::vector<data::Sample> make_samples(int64_t n) {
  std::vector<data::Sample> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 3 + (i * 7) % 18, prompt = 1 + i % 5;
    data::Sample s;
    for (int64_t t = 0; t < len; ++t) {
      s.input_ids.push_back(static_cast<int32_t>((i * 31 + t * 17 + (i * t) % 13) % 128));
      s.labels.push_back(t < prompt ? data::kIgnoreIndex : static_cast<int32_t>((i * 5 + t * 11) % 128));
    }
    out.push_back(s);
  }
  return out;
}

data::Batch packed_batch(const std::vector<data::Sample>& rows) {
  data::CollateOptions o;
  o.documents = true;
  return data::collate(rows, o);
}

Tensor local_loss(CausalLM& m, const data::Batch& b) {
  set_attention_documents(m, b.position_ids, b.document_ids);
  return causal_lm_loss(m.call(b.input_ids), b.labels, /*shift=*/false);
}

double value(const Tensor& t) { return (t.is_distributed() ? full_tensor(t.detach()) : t.detach()).item<double>(); }

/// kSteps AdamW steps on packed rows [s * kRowsPerStep, (s + 1) * kRowsPerStep) (this dp rank's share
/// of them), loss weighted as dtr-train does; losses are the global token means.
testing::TrainRun train_packed(CausalLM& m, const std::vector<data::Sample>& packs, const MeshContext* ctx) {
  std::vector<Tensor> ps;
  for (auto& p : m.parameters())
    if (p.requires_grad()) ps.push_back(p);
  optim::AdamW adam(ps, optim::AdamWOptions{1e-3});
  const int64_t dp = ctx ? ctx->dp_size : 1, dpr = ctx ? ctx->dp_rank() : 0, share = kRowsPerStep / dp;
  auto world = DeviceMesh::world("loss").group(0);
  testing::TrainRun r;
  for (int64_t s = 0; s < kSteps; ++s) {
    std::vector<data::Sample> all(packs.begin() + s * kRowsPerStep, packs.begin() + (s + 1) * kRowsPerStep);
    const int64_t n_global = packed_batch(all).num_label_tokens;
    data::Batch b = packed_batch(std::vector<data::Sample>(all.begin() + dpr * share, all.begin() + (dpr + 1) * share));
    const double w = static_cast<double>(b.num_label_tokens) * static_cast<double>(dp) / static_cast<double>(n_global);
    Tensor loss = local_loss(m, b);
    mul(loss, w).backward();
    adam.step();
    adam.zero_grad();
    // sum over dp of mean_r * n_r / N = the global token mean; tp ranks hold equal values.
    Tensor l = from_vector<double>({value(loss) * static_cast<double>(b.num_label_tokens) / n_global}, {1});
    if (ctx) world->all_reduce(l, ReduceOp::SUM)->wait();
    r.losses.push_back(l.item<double>() / static_cast<double>(ctx ? ctx->tp_size : 1));
  }
  set_attention_documents(m, Tensor(), Tensor());
  for (auto& [name, p] : m.named_parameters())
    r.params[name] = p.is_distributed() ? full_tensor(p.detach()) : p.detach().clone();
  return r;
}

}  // namespace

TEST_CASE("a packed batch gives the loss and gradients of its samples run alone", "[packing]") {
  const std::vector<data::Sample> samples = make_samples(9);
  const std::vector<data::Sample> packs = data::pack_sequences(samples, 40, 0);
  REQUIRE(packs.size() < samples.size());  // rows really hold several documents
  for (const char* family : {"llama", "gemma3"}) {
    INFO(family);
    auto m = make_model(family);
    // Unpacked: each sample alone (B = 1, no padding), token-weighted.
    int64_t N = 0;
    for (const auto& s : samples) N += packed_batch({s}).num_label_tokens;
    Tensor ref = zeros({}, DType::f64);
    for (const auto& s : samples) {
      data::Batch b = data::collate({s});
      ref = add(ref, mul(causal_lm_loss(m->call(b.input_ids), b.labels, false),
                         static_cast<double>(b.num_label_tokens) / static_cast<double>(N)));
    }
    ref.backward();
    std::map<std::string, Tensor> ref_grads;
    for (auto& [n, p] : m->named_parameters()) ref_grads[n] = p.grad().clone(), p.set_grad(Tensor());
    // Packed: one batch of rows, the plain token mean.
    data::Batch b = packed_batch(packs);
    REQUIRE(b.num_label_tokens == N);
    Tensor loss = local_loss(*m, b);
    loss.backward();
    CHECK(std::abs(loss.item<double>() - ref.item<double>()) <= kLossRelTol * ref.item<double>());
    // Relative to each gradient's largest entry: the tiny Gemma 3's embedding row 0 (its pad id,
    // scaled by sqrt(hidden) and tied to lm_head) has gradients of ~1e11.
    double worst = 0;
    std::string where;
    for (auto& [n, p] : m->named_parameters()) {
      const double scale = std::max(1.0, amax(abs(ref_grads[n])).item<double>());
      const double d = testing::max_abs_diff(p.grad(), ref_grads[n]) / scale;
      if (d > worst) worst = d, where = n;
    }
    INFO("worst relative gradient difference at " << where);
    CHECK(worst < kGradTol);
    // Without the documents the same rows attend across samples and RoPE runs on: another loss.
    set_attention_documents(*m, Tensor(), Tensor());
    NoGradGuard ng;
    CHECK(std::abs(causal_lm_loss(m->call(b.input_ids), b.labels, false).item<double>() - ref.item<double>()) > 1e-4);
  }
}

TEST_CASE("packed training under FSDP, DDP, TP and FSDP + TP equals the single process", "[packing][fsdp][tp]") {
  struct Mesh {
    int64_t dp, tp;
    bool sp;
    DataParallelStrategy strategy;
  };
  const int64_t w = world_size();
  std::vector<Mesh> meshes;
  const auto fsdp = DataParallelStrategy::fsdp2, ddp = DataParallelStrategy::ddp;
  if (w == 2) meshes = {{2, 1, false, fsdp}, {2, 1, false, ddp}, {1, 2, false, fsdp}, {1, 2, true, fsdp}};
  if (w == 3) meshes = {{3, 1, false, fsdp}};
  if (w == 4) meshes = {{2, 2, false, fsdp}, {4, 1, false, fsdp}};
  const std::vector<data::Sample> packs = data::pack_sequences(make_samples(100), kPack, 0);
  REQUIRE(static_cast<int64_t>(packs.size()) >= kSteps * kRowsPerStep);
  for (const char* family : {"llama", "gemma3"}) {
    auto ref_model = make_model(family);
    const auto ref = train_packed(*ref_model, packs, nullptr);
    for (const Mesh& mm : meshes) {
      INFO(family << " " << strategy_name(mm.strategy) << " dp " << mm.dp << " x tp " << mm.tp << " sp " << mm.sp);
      MeshContext ctx;
      ctx.world_size = w;
      ctx.dp_size = mm.dp;
      ctx.tp_size = mm.tp;
      ctx.sequence_parallel = mm.sp;
      ctx.strategy = mm.strategy;
      ctx.validate("test");
      ctx.build_mesh();
      auto m = make_model(family);
      parallelize_model(*m, ctx);
      testing::check_same_run(ref, train_packed(*m, packs, &ctx), kLossRelTol, kParamTol);
    }
  }
}
