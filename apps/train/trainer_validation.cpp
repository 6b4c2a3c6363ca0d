// dtr-train's validation: the token-mean loss over the validation batches, when it is due, and
// its metrics line outside a training step.
#include <algorithm>

#include "apps/train/trainer_impl.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr::train::detail {

double Trainer::validate() {
  const int64_t per = r.step_scheduler.local_batch_size * plan.dp_size;
  int64_t vb = std::min<int64_t>(r.step_scheduler.global_batch_size, val_set.size());
  vb = vb / per * per;
  if (vb == 0) return -1;
  int64_t nb = static_cast<int64_t>(val_set.size()) / vb;
  if (r.step_scheduler.val_batches > 0) nb = std::min(nb, r.step_scheduler.val_batches);
  const int64_t share = vb / plan.dp_size, dpr = ctx().dp_rank();
  model->eval();
  NoGradGuard no_grad;
  double sum = 0, tokens = 0;
  for (int64_t b = 0; b < nb; ++b) {
    std::vector<int64_t> idx(share);
    for (int64_t i = 0; i < share; ++i) idx[i] = b * vb + dpr * share + i;
    if (pipe) {  // the rows of this validation batch as micro-batches through the stages
      std::vector<data::Batch> mbs;
      for (int64_t m = 0; m < share; m += r.step_scheduler.local_batch_size)
        mbs.push_back(make_batch(r.validation_dataset, gather(val_set, idx, m, r.step_scheduler.local_batch_size)));
      auto [s, n] = pipe->evaluate(mbs);
      sum += s;
      tokens += n;
      continue;
    }
    for (int64_t m = 0; m < share; m += r.step_scheduler.local_batch_size) {
      data::Batch batch = make_batch(r.validation_dataset, gather(val_set, idx, m, r.step_scheduler.local_batch_size));
      // Every rank runs the forward (FSDP's all-gathers, cp's K/V all-gather are collective),
      // also when its rows (its cp slice) hold no label token.
      if (batch.num_label_tokens == 0) {
        model->call(batch.input_ids);
        continue;
      }
      sum += scalar_value(causal_lm_loss(*model, batch.input_ids, batch.labels, false)) * batch.num_label_tokens;
      tokens += batch.num_label_tokens;
    }
  }
  model->train();
  sum = dp_sum(ctx(), sum);
  tokens = dp_sum(ctx(), tokens);
  return tokens > 0 ? sum / tokens : -1;
}

double Trainer::validate_and_log(int64_t at_step) {
  const double val = validate();
  if (rank == 0 && val >= 0) {
    metrics->write({{"step", at_step}, {"val_loss", val}});
    progress->note(strformat("step %lld: validation loss %.4f", (long long)at_step, val));
  }
  return val;
}

bool Trainer::validation_due(bool ckpt_step) const {
  const int64_t every = r.step_scheduler.val_every_steps;
  return has_val() && ((every > 0 && step % every == 0) || ckpt_step);
}
}  // namespace dtr::train::detail
