// Context parallelism on the debug Llama (GQA: 4 query / 2 kv heads): every rank holds the
// load-balanced slice (chunks r and 2cp-1-r) of every sequence; RoPE on global positions,
// attention over the all-gathered K/V. Checked against the single process:
//  - cp = world (1-4 ranks), wired by hand (apply_context_parallel, gradients summed over cp):
//    the unsharded logits, the token-mean loss and every parameter gradient, on the debug Llama
//    and the tiny Gemma 3 (sliding window 5, q/k norm), rows unpacked and packed;
//  - through parallelize_model (FSDP over dp_shard_cp; TP on its own dim): cp 2, 3, 4 alone,
//    dp 2 x cp 2 (also with full activation checkpointing), cp 2 x tp 2 (also with sequence
//    parallelism and selective AC), HSDP dp_replicate 2 x cp 2: 5 AdamW steps (losses and every
//    parameter) equal the single-process run.
//  - packed rows (3 documents per row: per-document RoPE positions and document mask, no target
//    across a document end) under cp alone, dp 2 x cp 2 and cp 2 x tp 2: the same, against the
//    single process on the same packed rows.
#include <catch2/catch.hpp>

#include <map>

#include "dtensor/api.h"
#include "llama_test_util.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/load.h"
#include "parallel/context_parallel.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/model_parallelizer.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "train_compare.h"

using namespace dtr;

namespace {

/// Batch 4 of 48 tokens: 48 % (2 cp) == 0 for cp 1-4.
constexpr int64_t kBatch = 4, kSeq = 48;
/// f32: cp changes the order of the key blocks in the online softmax (prefixes), FSDP / TP the
/// order of the gradient sums (~1 ulp per op). As the FSDP + TP Llama test: 2e-5 is 2% of one
/// AdamW step (lr 1e-3); a wrong mask, position or gradient moves parameters by whole steps.
constexpr double kParamTol = 2e-5;
constexpr double kLossRelTol = 1e-6;
/// Logits and gradients of one forward / backward: f32 sums in another order.
constexpr double kForwardTol = 2e-5;

/// Targets of global rows b0..b1 (already shifted: labels[t] = ids[t + 1]); the last position and
/// every (b + t) % 7 == 3 are ignored, so the cp slices hold different numbers of label tokens.
/// Packed rows: global row b holds documents of 5 + b, 11 and T - 16 - b tokens.
int64_t document_of(int64_t b, int64_t t) { return t < 5 + b ? 0 : t < 16 + b ? 1 : 2; }

/// position_ids and document_ids [B, T] of packed global rows b0..b0+B (sample.h's Batch layout).
std::pair<Tensor, Tensor> documents_of(int64_t b0, int64_t B, int64_t T) {
  std::vector<int64_t> pos(B * T), doc(B * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      doc[b * T + t] = document_of(b0 + b, t);
      pos[b * T + t] = t == 0 || doc[b * T + t] != doc[b * T + t - 1] ? 0 : pos[b * T + t - 1] + 1;
    }
  return {from_vector<int64_t>(pos, {B, T}), from_vector<int64_t>(doc, {B, T})};
}

/// Targets of rows b0.. (packed: no target across a document end).
Tensor labels_of(const Tensor& ids, int64_t b0, bool packed) {
  const int64_t B = ids.size(0), T = ids.size(1);
  const std::vector<int64_t> v = ids.to_vector<int64_t>();
  std::vector<int64_t> l(B * T, -100);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t)
      if ((b0 + b + t) % 7 != 3 && (!packed || document_of(b0 + b, t) == document_of(b0 + b, t + 1)))
        l[b * T + t] = v[b * T + t + 1];
  return from_vector<int64_t>(l, {B, T});
}

int64_t count_labels(const Tensor& labels) {
  int64_t n = 0;
  for (int64_t x : labels.to_vector<int64_t>()) n += x != -100;
  return n;
}

struct Layout {
  int64_t dp_rank = 0, dp = 1, cp_rank = 0, cp = 1, tp = 1;
  bool packed = false;  // rows of 3 documents (set_attention_documents)
};

/// One step's objective on this rank: the local token-mean loss scaled by n_local * dp * cp /
/// n_global, so that the dp x cp mean of the gradients (FSDP over dp_shard_cp) is the gradient
/// of the global token mean. Returns {objective, this rank's share of the global loss}.
std::pair<Tensor, double> objective(CausalLM& m, int step, const Layout& l) {
  const int64_t n = kBatch / l.dp;
  Tensor ids_all = testing::debug_token_rows(step, 0, kBatch, kSeq);
  const int64_t n_global = count_labels(labels_of(ids_all, 0, l.packed));
  Tensor ids = testing::debug_token_rows(step, l.dp_rank * n, (l.dp_rank + 1) * n, kSeq);
  Tensor labels = labels_of(ids, l.dp_rank * n, l.packed);
  auto shard = [&](const Tensor& t) { return context_parallel_shard(t, 1, l.cp, l.cp_rank).contiguous(); };
  ids = shard(ids);
  labels = shard(labels);
  if (l.packed) {
    auto [pos, doc] = documents_of(l.dp_rank * n, n, kSeq);
    set_attention_documents(m, shard(pos), shard(doc));
  }
  const int64_t n_local = count_labels(labels);
  Tensor logits = m.call(ids);
  Tensor loss = causal_lm_loss(logits, labels, false);
  if (loss.is_distributed()) loss = full_tensor(loss);
  const double share = loss.item<double>() * n_local / n_global;
  return {mul(loss, static_cast<double>(n_local * l.dp * l.cp) / n_global), share};
}

/// 5 AdamW steps (lr 1e-3); `finish` completes the backward (FSDP).
testing::TrainRun train(CausalLM& m, const Layout& l, const std::function<void()>& finish) {
  std::vector<Tensor> ps;
  for (auto& p : m.parameters())
    if (p.requires_grad()) ps.push_back(p);
  optim::AdamW adam(ps, optim::AdamWOptions{1e-3});
  auto world = DeviceMesh::world("loss").group(0);
  testing::TrainRun r;
  for (int step = 0; step < 5; ++step) {
    auto [obj, share] = objective(m, step, l);
    obj.backward();
    if (finish) finish();
    adam.step();
    adam.zero_grad();
    Tensor s = from_vector<double>({share / l.tp}, {1});  // tp ranks repeat their share
    if (l.dp * l.cp * l.tp > 1) world->all_reduce(s)->wait();  // the single process holds all
    r.losses.push_back(s.item<double>());
  }
  for (auto& [name, p] : m.named_parameters())
    r.params[name] = p.is_distributed() ? full_tensor(p.detach()) : p.detach().clone();
  return r;
}

double max_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return amax(abs(sub(a, b))).item<double>();
}

}  // namespace

TEST_CASE("context parallel debug Llama: logits, loss and gradients equal the single process", "[cp][llama]") {
  auto pg = DeviceMesh::world("cp").group(0);
  // The tiny Gemma 3 adds sliding windows (5 tokens, across chunk boundaries), q/k norms and
  // per-layer RoPE bases.
  auto make = [](const std::string& family) -> std::shared_ptr<CausalLM> {
    if (family == "llama") return testing::make_debug_llama(false);
    return load_model_hf("tests/golden/" + family + "_debug", DType::f32);
  };
  for (const std::string family : {"llama", "gemma3"})
  for (bool packed : {false, true}) {
  INFO(family << " packed " << packed);
  const Layout l{0, 1, pg->rank(), pg->size(), 1, packed};
  auto ref = make(family);
  Tensor ids = testing::debug_token_rows(0, 0, kBatch, kSeq);
  auto [ref_obj, ref_loss] = objective(*ref, 0, Layout{0, 1, 0, 1, 1, packed});
  ref_obj.backward();
  Tensor ref_logits = ref->call(ids).detach();  // with the documents objective() set

  auto m = make(family);
  REQUIRE(apply_context_parallel(*m, DeviceMesh::world("cp")) == m->config().num_hidden_layers);
  auto [obj, share] = objective(*m, 0, l);
  Tensor local = m->call(context_parallel_shard(ids, 1, l.cp, l.cp_rank).contiguous());
  CHECK(max_diff(context_parallel_unshard(local.detach(), 1, pg), ref_logits) <= kForwardTol);
  obj.backward();
  Tensor s = from_vector<double>({share}, {1});
  pg->all_reduce(s)->wait();
  CHECK(std::abs(s.item<double>() - ref_loss) <= kLossRelTol * ref_loss);
  for (auto& [name, p] : m->named_parameters()) {
    INFO(name);
    Tensor g = p.grad().contiguous();  // this rank's tokens' part: the mean over cp is the gradient
    pg->all_reduce(g, ReduceOp::AVG)->wait();
    // Relative to the gradient's largest entry: the tiny Gemma 3's embedding row 0 (its pad id,
    // scaled by sqrt(hidden), tied to lm_head) has gradients of ~1e11.
    const Tensor rg = ref->get_parameter(name).grad();
    CHECK(max_diff(g, rg) <= kForwardTol * std::max(1.0, amax(abs(rg)).item<double>()));
  }
  }
}

TEST_CASE("context parallel through parallelize_model: 5 AdamW steps equal the single process", "[cp][llama]") {
  const int64_t w = world_size();
  struct Mesh {
    int64_t dp, dp_replicate, cp, tp;
    std::string ac = "none";
    bool sp = false, packed = false;
  };
  std::vector<Mesh> meshes;
  if (w >= 2) meshes.insert(meshes.end(), {{1, 1, w, 1}, {1, 1, w, 1, "none", false, true}});  // cp alone: FSDP over dp_shard_cp = cp
  if (w == 4)
    meshes.insert(meshes.end(), {{2, 1, 2, 1}, {1, 1, 2, 2}, {2, 2, 2, 1}, {2, 1, 2, 1, "full"}, {1, 1, 2, 2, "selective", true},
                                 {2, 1, 2, 1, "none", false, true}, {1, 1, 2, 2, "none", false, true}});
  if (meshes.empty()) return;
  std::map<bool, testing::TrainRun> ref;  // by packed
  for (bool packed : {false, true}) {
    auto ref_model = testing::make_debug_llama(false);
    ref[packed] = train(*ref_model, Layout{0, 1, 0, 1, 1, packed}, nullptr);
  }
  for (const Mesh& mm : meshes) {
    INFO("dp " << mm.dp << " (replicate " << mm.dp_replicate << ") cp " << mm.cp << " tp " << mm.tp << " AC " << mm.ac
               << " sequence_parallel " << mm.sp << " packed " << mm.packed);
    MeshContext ctx;
    ctx.world_size = w;
    ctx.dp_size = mm.dp;
    ctx.dp_replicate_size = mm.dp_replicate;
    ctx.cp_size = mm.cp;
    ctx.tp_size = mm.tp;
    if (mm.ac != "none") ctx.activation_checkpointing = checkpoint_policy_from_name(mm.ac);
    ctx.sequence_parallel = mm.sp;
    ctx.validate("test");
    ctx.build_mesh();
    auto m = testing::make_debug_llama(false);
    parallelize_model(*m, ctx);
    REQUIRE(fsdp_param_group(*m) != nullptr);
    const Layout l{ctx.dp_rank(), mm.dp, ctx.cp_mesh().coordinate(0), mm.cp, mm.tp, mm.packed};
    testing::check_same_run(ref.at(mm.packed), train(*m, l, {}), kLossRelTol, kParamTol);
  }
}
