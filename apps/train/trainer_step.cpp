// One optimizer step of dtr-train: batches (collate, context-parallel slices, device copy),
// micro-batches (forward + backward of the weighted loss), clipping, the health check, AdamW.
#include <cmath>
#include <limits>
#include <numeric>

#include "apps/train/trainer_impl.h"
#include "dtensor/api.h"
#include "parallel/clip_grad.h"
#include "parallel/context_parallel.h"
#include "parallel/model_parallelizer.h"
#include "tensor/nn/moe.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace dtr::train::detail {
namespace {

int64_t count_labels(const std::vector<data::Sample>& all, const std::vector<int64_t>& idx) {
  int64_t n = 0;
  for (int64_t i : idx)
    for (int32_t l : all[i].labels) n += l != data::kIgnoreIndex;
  return n;
}

}  // namespace

double scalar_value(const Tensor& t) {
  Tensor x = t.detach();
  if (x.is_distributed()) x = full_tensor(x);
  return x.item<double>();
}

double dp_sum(const MeshContext& ctx, double v) {
  if (ctx.dp_size * ctx.cp_size <= 1) return v;
  Tensor t = full({1}, v, TensorOptions(DType::f64));
  ctx.dp_cp_mesh().group(0)->all_reduce(t)->wait();
  return t.item<double>();
}

std::vector<data::Sample> gather(const std::vector<data::Sample>& all, const std::vector<int64_t>& idx, size_t begin,
                                 size_t count) {
  std::vector<data::Sample> out;
  for (size_t i = begin; i < begin + count; ++i) out.push_back(all[idx[i]]);
  return out;
}

data::Batch Trainer::make_batch(const DatasetRecipe& d, std::vector<data::Sample> samples) const {
  data::CollateOptions o;
  o.pad_id = pad_id;
  o.pad_seq_len_divisible = std::lcm(d.pad_seq_len_divisible, 2 * ctx().cp_size);
  o.max_length = d.seq_len;
  o.documents = d.packed_sequence_size > 0;
  data::Batch b = data::collate(samples, o);
  if (ctx().cp_size > 1) {
    const int64_t r = ctx().cp_mesh().coordinate(0);
    for (Tensor* t : {&b.input_ids, &b.labels, &b.position_ids, &b.document_ids})  // packed rows: their documents
      if (t->defined()) *t = context_parallel_shard(*t, 1, ctx().cp_size, r).contiguous();
    b.num_label_tokens = 0;
    for (int64_t l : b.labels.to_vector<int64_t>()) b.num_label_tokens += l != data::kIgnoreIndex;
  }
  b = batch_to_device(std::move(b));
  if (model) set_attention_documents(*model, b.position_ids, b.document_ids);  // undefined: none
  return b;
}

Device Trainer::device() const { return r.model.device == "cuda" ? Device::cuda(cuda_device()) : Device::cpu(); }

data::Batch Trainer::batch_to_device(data::Batch b) const {
  const Device dev = device();
  if (dev.is_cpu()) return b;
  for (Tensor* t : {&b.input_ids, &b.labels, &b.position_ids, &b.document_ids})
    if (t->defined()) *t = t->to(dev);
  return b;
}

double Trainer::micro_batch(const data::Batch& batch, int64_t n_global) {
  if (batch.num_label_tokens == 0) {
    // Nothing to learn here, but FSDP still needs the collective forward/backward.
    Tensor logits = model->call(batch.input_ids);
    Tensor zero = mul(sum(logits), 0.0);
    zero.backward();
    return 0;
  }
  // The fused head (CausalLM::forward_list): the [tokens, vocab] logits are never formed.
  Tensor loss = causal_lm_loss(*model, batch.input_ids, batch.labels, false);
  const double w = static_cast<double>(batch.num_label_tokens) * plan.dp_size * ctx().cp_size / n_global;
  Tensor objective = mul(loss, w);
  // MoE: + router_aux_loss_coef * the load-balancing loss of this micro-batch, averaged over
  // micro-batches (and, by the gradient averaging, over dp ranks).
  // (Added as plain tensors: under loss parallelism the loss is a DTensor, the aux loss is not.)
  if (Tensor aux = nn::moe_auxiliary_loss(*model, plan.config.router_aux_loss_coef, 0.0); aux.defined())
    objective = add(objective.is_distributed() ? full_tensor(objective) : objective,
                    mul(aux.to(objective.dtype()), 1.0 / static_cast<double>(plan.grad_accum)));
  objective.backward();
  return scalar_value(loss) * batch.num_label_tokens;
}

StepResult Trainer::train_step(TrainingHealth& health) {
  const auto t0 = Clock::now();
  const auto& st = r.step_scheduler;
  StepResult s;
  if (ep_group) ep_group->counters().reset();
  const data::SamplerState ss = sampler->state();
  s.epoch = ss.epoch;
  s.label_tokens = count_labels(train_set, sampler->global_batch(ss.epoch, ss.batch));
  DTR_CHECK(s.label_tokens > 0, "dataset: global batch ", ss.batch, " of epoch ", ss.epoch, " has no label tokens");
  const std::vector<int64_t> mine = sampler->next();
  double loss_sum = 0, rows_tokens = 0;
  if (pipe) {
    // The step's rows as micro-batches of pp_microbatch_size rows through the schedule.
    const int64_t rows = plan.pp_microbatch_rows;
    std::vector<data::Batch> mbs;
    std::vector<double> weights;
    for (int64_t k = 0; k * rows < plan.grad_accum * st.local_batch_size; ++k) {
      mbs.push_back(make_batch(r.dataset, gather(train_set, mine, k * rows, rows)));
      rows_tokens += static_cast<double>(mbs.back().input_ids.numel());
      weights.push_back(static_cast<double>(mbs.back().num_label_tokens) * plan.dp_size / s.label_tokens);
    }
    loss_sum = pipe->step(mbs, weights);
  }
  for (int64_t m = 0; m < (pipe ? 0 : plan.grad_accum); ++m) {
    set_model_gradient_sync(*model, ctx(), m + 1 == plan.grad_accum);
    data::Batch batch = make_batch(r.dataset, gather(train_set, mine, m * st.local_batch_size, st.local_batch_size));
    rows_tokens += static_cast<double>(batch.input_ids.numel());
    loss_sum += micro_batch(batch, s.label_tokens);
  }
  const double max_norm = r.optimizer.max_grad_norm > 0 ? r.optimizer.max_grad_norm
                                                         : std::numeric_limits<double>::infinity();
  s.grad_norm = pipe ? pipe->clip_grad_norm(plist, max_norm) : clip_grad_norm(plist, max_norm);
  s.loss = dp_sum(ctx(), loss_sum) / s.label_tokens;
  s.step_tokens = dp_sum(ctx(), rows_tokens);
  // Summed over the dp ranks (one tp coordinate): counts, dispatch and combine, forward,
  // backward and activation-checkpoint recomputation.
  if (ep_group) s.dispatch_bytes = dp_sum(ctx(), static_cast<double>(ep_group->counters().nbytes(CommKind::all_to_all)));
  // The same loss and global norm on every rank: the same decision everywhere.
  s.updated = health.admit(step + 1, s.loss, s.grad_norm);
  s.lr = optimizer->lr();  // the lr this step used (the scheduler moves on below)
  if (s.updated) optimizer->step();
  optimizer->zero_grad();
  sched->step();
  ++step;
  if (s.updated) last_loss = s.loss;
  s.seconds = seconds_since(t0);
  return s;
}
}  // namespace dtr::train::detail
