// FSDPParamGroup (see fsdp_param_group.h).
#include "parallel/fsdp/fsdp_param_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "dtensor/api.h"
#include "parallel/fsdp/fully_shard.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/version_guard.h"
#include "tensor/ops/collective_copy.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

/// An unsharded gradient as a plain tensor of p.shape: under FSDP + TP the TP-local gradient,
/// brought to the parameter's TP placements first. Callers cast to reduce_dtype before, so a
/// Partial gradient (the unsharded TP leaves keep them) is reduced over tp in reduce_dtype.
Tensor tp_local_grad(const FSDPParam& p, Tensor g) {
  if (!g.is_distributed()) return g;
  if (placements(g) != p.tp_spec->placements) g = redistribute(g, p.tp_spec->placements);
  return local_tensor(g);
}

std::atomic<int64_t> g_wait_ns{0};
std::atomic<bool> g_log_on{false};
std::mutex g_log_mu;
std::vector<double> g_log;  // seconds of each wait, in order, while g_log_on

/// Waits for `w`, adding the blocked time to the exposed-communication counter (and the log).
void timed_wait(const WorkPtr& w) {
  const auto t0 = std::chrono::steady_clock::now();
  w->wait();
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  g_wait_ns.fetch_add(ns);
  if (g_log_on.load()) {
    std::lock_guard<std::mutex> lk(g_log_mu);
    g_log.push_back(static_cast<double>(ns) * 1e-9);
  }
}

}  // namespace

double fsdp_exposed_comm_seconds() { return static_cast<double>(g_wait_ns.load()) * 1e-9; }
void reset_fsdp_exposed_comm_seconds() { g_wait_ns.store(0); }

void set_fsdp_wait_log(bool on) { g_log_on.store(on); }
std::vector<double> take_fsdp_wait_log() {
  std::lock_guard<std::mutex> lk(g_log_mu);
  std::vector<double> out;
  out.swap(g_log);
  return out;
}

int64_t FSDPParam::rows_of(int64_t r) const {
  const int64_t start = r * chunk_rows;
  if (start >= rows) return 0;
  return std::min(chunk_rows, rows - start);
}

const Tensor& FSDPParam::unsharded_local() const { return tp_spec ? local_tensor(unsharded) : unsharded; }

void FSDPParam::versions(uint32_t out[4]) const {
  out[0] = local_tensor(sharded).version();
  out[1] = sharded.version();
  out[2] = unsharded.version();
  out[3] = unsharded_local().version();
}

bool FSDPParam::reusable() const {
  if (trainable) return false;
  uint32_t v[4];
  versions(v);
  return std::equal(v, v + 4, gathered_versions);
}

FSDPParamGroup::FSDPParamGroup(nn::Module& module, std::vector<std::pair<std::vector<std::string>, Tensor>> params,
                               const DeviceMesh& mesh, const FSDPOptions& opt, std::string label, bool tp_layout)
    : module_(module), mesh_(mesh), tp_layout_(tp_layout), label_(std::move(label)) {
  // Mesh dims: [replicate,] shard [, tp].
  const int nd = mesh.ndim();
  const int dp_dims = tp_layout ? nd - 1 : nd;
  const int shard_dim = dp_dims - 1;
  shard_pg_ = mesh.group(shard_dim);
  if (dp_dims == 2) replicate_pg_ = mesh.group(0);
  shard_size_ = mesh.size(shard_dim);
  dp_size_ = 1;
  for (int i = 0; i < dp_dims; ++i) dp_size_ *= mesh.size(i);
  divide_factor_ = opt.gradient_divide_factor.value_or(static_cast<double>(dp_size_));
  DTR_CHECK(divide_factor_ > 0, "fully_shard(", label_, "): gradient_divide_factor=", divide_factor_, " must be > 0");
  const int64_t tp_size = tp_layout ? mesh.size(nd - 1) : 1;
  const int64_t coord = mesh.coordinate(shard_dim);

  storage_dtype_ = params.empty() ? DType::f32 : params[0].second.dtype();
  device_ = mesh.device();
  for (const auto& [names, t] : params) {
    DTR_CHECK(t.dtype() == storage_dtype_, "fully_shard(", label_, "): parameters of one unit must share a dtype: \"",
              params[0].first[0], "\" is ", storage_dtype_, " but \"", names[0], "\" is ", t.dtype());
    const Device d = t.is_distributed() ? local_tensor(t).device() : t.device();
    DTR_CHECK(d == device_, "fully_shard(", label_, "): parameter \"", names[0], "\" is on ", d, " but the mesh ",
              mesh.str(), " is on ", device_, " (move the module to the mesh's device first)");
  }
  param_dtype_ = opt.mp_policy.param_dtype.value_or(storage_dtype_);
  reduce_dtype_ = opt.mp_policy.reduce_dtype.value_or(param_dtype_);

  // Layout of the flat shard buffer (one rank's segment) and the reduce-scatter segment.
  for (auto& [names, t] : params) {
    FSDPParam p;
    p.fqns = names;
    p.global_shape = t.sizes();
    p.shape = t.sizes();
    Placement tp_pl = Replicate();
    if (t.is_distributed()) {
      p.tp_spec = dtensor_spec(t, "fully_shard");
      p.shape = local_tensor(t).sizes();
      tp_pl = p.tp_spec->placements.at(0);
    }
    p.rows = p.shape[0];
    for (size_t d = 1; d < p.shape.size(); ++d) p.row_numel *= p.shape[d];
    p.chunk_rows = (p.rows + shard_size_ - 1) / shard_size_;
    p.local_rows = p.rows_of(coord);
    p.trainable = t.requires_grad();
    p.shard_offset = shard_numel_;
    shard_numel_ += p.padded_numel();
    Placements pl;
    if (dp_dims == 2) pl.push_back(Replicate());
    // TP also splitting dim 0 (colwise): the dp shard of the TP-local rows is a strided shard of
    // the global rows (PyTorch's _StridedShard(0, split_factor = tp)).
    pl.push_back(tp_pl.is_shard(0) ? StridedShard(0, tp_size) : Shard(0));
    if (tp_layout) pl.push_back(tp_pl);
    p.spec = DTensorSpec{mesh, pl, p.global_shape, storage_dtype_};
    params_.push_back(std::move(p));
  }

  // The flat buffer holds every parameter's shard padded to chunk_rows (padding stays zero), so
  // the all-gather reads it as is.
  NoGradGuard no_grad;
  flat_shard_ = zeros({shard_numel_}, TensorOptions(storage_dtype_).with_device(device_));
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    const Tensor& src = params[i].second;
    const Tensor& whole = src.is_distributed() ? local_tensor(src) : src;
    Shape local_shape = p.shape;
    local_shape[0] = p.local_rows;
    Tensor local = flat_shard_.narrow(0, p.shard_offset, p.local_rows * p.row_numel).view(local_shape);
    // Its own version counter (not the flat buffer's): the optimizer stepping one parameter of
    // the unit must not mark the unit's frozen parameters as changed (frozen-parameter reuse).
    local.impl()->version = std::make_shared<std::atomic<uint32_t>>(0);
    if (is_meta(whole)) {
      // Meta initialisation: this rank's rows are made here, from the recipe (Philox by global
      // offset, or the file's byte range); the full tensor never exists on any rank.
      Shape at(p.shape.size(), 0);
      at[0] = coord * p.chunk_rows;
      fill_from_meta(whole, at, local);
    } else if (p.local_rows > 0) {
      local.copy_(whole.detach().contiguous().narrow(0, coord * p.chunk_rows, p.local_rows));
    }
    p.sharded = make_dtensor(local, *p.spec);
    if (p.trainable) p.sharded.set_requires_grad(true);
    p.sharded.set_name(p.fqns[0]);
    // The unsharded parameter: a persistent leaf whose storage is allocated only while gathered
    // (under FSDP + TP a DTensor with the TP spec over that storage).
    // Padded to shard size x chunk_rows rows, so the copy-out writes every rank's chunk at once.
    // A 0-byte storage from the start: allocating the full size first, even briefly, would put a
    // whole parameter on every rank at wrap time.
    p.padded = make_view(empty({0}, TensorOptions(param_dtype_).with_device(device_)), {shard_size_ * p.padded_numel()},
                         {1}, 0);
    Tensor buf = p.padded.narrow(0, 0, p.rows * p.row_numel).view(p.shape);
    p.unsharded = p.tp_spec ? make_dtensor(buf, *p.tp_spec) : buf;
    // A replicated TP parameter used on sharded activations (sequence parallelism) gets a
    // Partial gradient: keep it, so that its tp reduction runs in reduce_dtype (reduce_grads_async).
    if (p.tp_spec) set_grad_keeps_partial(p.unsharded);
    p.unsharded.set_name(p.fqns[0]);
  }
  layout_grads();
  register_tensors(false);
}

void FSDPParamGroup::layout_grads() {
  grad_numel_ = 0;
  num_trainable_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    p.grad_offset = -1;
    if (!p.trainable) continue;
    p.unsharded.set_requires_grad(true);
    if (!p.hooked) {  // the hook stays when the parameter is frozen later (it then gets no gradient)
      const int idx = static_cast<int>(i);
      p.unsharded.register_post_accumulate_grad_hook([this, idx](Tensor&) {
        if (on_grad_ready && params_[idx].trainable) on_grad_ready(idx);
      });
      p.hooked = true;
    }
    p.grad_offset = grad_numel_;
    grad_numel_ += p.padded_numel();
    ++num_trainable_;
  }
}

void FSDPParamGroup::sync_requires_grad() {
  bool changed = false;
  for (FSDPParam& p : params_) {
    const bool leaf_rg = p.unsharded.requires_grad();
    const bool want = leaf_rg != p.trainable ? leaf_rg : p.sharded.requires_grad();
    if (want == p.trainable) continue;
    DTR_CHECK(want || (!p.acc_grad.defined() && !p.unsharded.grad().defined()), "fully_shard(", label_,
              "): requires_grad of \"", p.fqns[0], "\" was set to false while the parameter holds unsynced ",
              "accumulated gradients (set_requires_gradient_sync(false)); change requires_grad between optimizer "
              "steps, after a synced backward");
    DTR_CHECK(!reduce_pending(), "fully_shard(", label_, "): requires_grad of \"", p.fqns[0],
              "\" changed while a gradient reduction is pending");
    p.trainable = want;
    p.sharded.set_requires_grad(want);
    p.unsharded.set_requires_grad(want);
    changed = true;
  }
  if (changed) layout_grads();
}

FSDPParamGroup::~FSDPParamGroup() {
  // Outstanding collectives reference our buffers: finish them before freeing.
  try {
    if (gather_work_) gather_work_->wait();
    if (rs_work_) rs_work_->wait();
    if (ar_work_) ar_work_->wait();
  } catch (...) {
  }
}

void FSDPParamGroup::register_tensors(bool unsharded) {
  for (const FSDPParam& p : params_)
    for (const std::string& fqn : p.fqns) module_.set_parameter(fqn, unsharded ? p.unsharded : p.sharded);
}

void FSDPParamGroup::unshard_async() {
  if (unsharded_ || gather_work_ || !gathering_.empty() || params_.empty()) return;
  NoGradGuard no_grad;
  // Kept frozen parameters whose shard is unchanged need no gather.
  gathering_.clear();
  int64_t numel = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    p.kept = p.kept && p.reusable();
    if (p.kept) continue;
    gathering_.push_back(static_cast<int>(i));
    numel += p.padded_numel();
  }
  if (gathering_.empty()) {
    gathering_.push_back(-1);  // nothing to move: wait_unshard only registers
    return;
  }
  if (numel == shard_numel_) {
    // Copy-in only when a cast is needed: otherwise the flat shard buffer is the input.
    gather_in_ = param_dtype_ == storage_dtype_ ? flat_shard_ : flat_shard_.to(param_dtype_);
  } else {
    // Some parameters kept: the others' padded shards packed side by side (FSDP2's copy-in).
    std::vector<Tensor> parts;
    for (int i : gathering_) parts.push_back(flat_shard_.narrow(0, params_[i].shard_offset, params_[i].padded_numel()));
    gather_in_ = cat(parts, 0);
    if (param_dtype_ != storage_dtype_) gather_in_ = gather_in_.to(param_dtype_);
  }
  gather_out_ = empty({shard_size_ * numel}, TensorOptions(param_dtype_).with_device(device_));
  gather_work_ = shard_pg_->all_gather(gather_out_, gather_in_);
}

void FSDPParamGroup::wait_unshard() {
  if (unsharded_ || params_.empty()) {
    unsharded_ = true;
    return;
  }
  if (!gather_work_ && gathering_.empty()) unshard_async();
  if (gather_work_) {
    timed_wait(gather_work_);
    gather_work_.reset();
    // Copy-out: rank r's segment holds rows [r * chunk_rows, ...) of every gathered parameter,
    // so viewed as [shard size, gathered numel] its column blocks are the parameters' padded
    // buffers (FSDP2's split_with_sizes_copy). Their version counters are kept: autograd may
    // hold the parameter from the forward when it was resharded in between, and the values are
    // the ones it saw.
    NoGradGuard no_grad;
    std::vector<Tensor> outs;
    Shape sizes;
    int64_t numel = 0;
    for (int i : gathering_) {
      FSDPParam& p = params_[i];
      p.padded.storage()->resize_(static_cast<size_t>(p.padded.numel()) * itemsize(param_dtype_));
      outs.push_back(p.padded.view({shard_size_, p.padded_numel()}));
      sizes.push_back(p.padded_numel());
      numel += p.padded_numel();
    }
    {
      UnsafePreserveVersionCounter keep(outs);
      split_with_sizes_copy(gather_out_.view({shard_size_, numel}), sizes, 1, outs);
    }
    for (int i : gathering_) params_[i].versions(params_[i].gathered_versions);
  }
  gathering_.clear();
  for (FSDPParam& p : params_) p.kept = false;
  gather_in_ = Tensor();
  gather_out_ = Tensor();
  unsharded_ = true;
  register_tensors(true);
}

void FSDPParamGroup::drop_gather() {
  gathering_.clear();
  if (!gather_work_) return;
  timed_wait(gather_work_);
  gather_work_.reset();
  gather_in_ = Tensor();
  gather_out_ = Tensor();
}

void FSDPParamGroup::reshard(bool keep_frozen) {
  if (!unsharded_) return;
  for (FSDPParam& p : params_) {
    // Kept only when nothing wrote the unsharded values since they were gathered.
    p.kept = keep_frozen && p.reusable();
    if (!p.kept) p.padded.storage()->resize_(0);
  }
  unsharded_ = false;
  register_tensors(false);
}

void FSDPParamGroup::reduce_grads_async() {
  if (num_trainable_ == 0) return;
  DTR_CHECK(!reduce_pending(), "fully_shard(", label_, "): a gradient reduction is still pending");
  NoGradGuard no_grad;
  // Copy-in: every trainable gradient split into shard-size chunks of chunk_rows rows (zero
  // padded) and rank r's chunks laid side by side (FSDP2's chunk_cat).
  std::vector<Tensor> grads;
  for (FSDPParam& p : params_) {
    if (!p.trainable) continue;
    Tensor g = p.unsharded.grad();
    if (g.defined()) g = g.to(reduce_dtype_);
    if (p.acc_grad.defined()) g = g.defined() ? add(p.acc_grad, g) : p.acc_grad;
    p.unsharded.set_grad(Tensor());
    p.acc_grad = Tensor();
    // An unused parameter reduces zeros.
    grads.push_back(g.defined() ? tp_local_grad(p, g) : zeros(p.shape, TensorOptions(reduce_dtype_).with_device(device_)));
  }
  rs_in_ = chunk_cat(grads, shard_size_).view({-1});
  rs_out_ = empty({grad_numel_}, TensorOptions(reduce_dtype_).with_device(device_));
  rs_work_ = shard_pg_->reduce_scatter(rs_out_, rs_in_, ReduceOp::SUM);
}

void FSDPParamGroup::finish_reduce_scatter() {
  if (!rs_work_) return;
  timed_wait(rs_work_);
  rs_work_.reset();
  rs_in_ = Tensor();
  if (replicate_pg_) ar_work_ = replicate_pg_->all_reduce(rs_out_, ReduceOp::SUM);
}

void FSDPParamGroup::finish_reduce_apply() {
  if (rs_work_) finish_reduce_scatter();
  if (ar_work_) {
    timed_wait(ar_work_);
    ar_work_.reset();
  }
  if (!rs_out_.defined()) return;
  NoGradGuard no_grad;
  const double scale = 1.0 / divide_factor_;
  for (FSDPParam& p : params_) {
    if (!p.trainable) continue;
    Shape local_shape = p.shape;
    local_shape[0] = p.local_rows;
    Tensor g = mul(rs_out_.narrow(0, p.grad_offset, p.local_rows * p.row_numel), scale)
                   .to(storage_dtype_)
                   .contiguous()
                   .view(local_shape);
    Tensor cur = p.sharded.grad();
    if (cur.defined()) {
      Tensor l = local_tensor(cur);
      add_(l, g);
    } else {
      p.sharded.set_grad(make_dtensor(g, *p.spec));
    }
  }
  rs_out_ = Tensor();
}

void FSDPParamGroup::accumulate_unsynced() {
  if (reduce_dtype_ == param_dtype_) return;  // the leaves' .grad keeps accumulating
  NoGradGuard no_grad;
  for (FSDPParam& p : params_) {
    if (!p.trainable) continue;
    Tensor g = p.unsharded.grad();
    if (!g.defined()) continue;
    g = g.to(reduce_dtype_);  // a TP DTensor stays one (Partial kept: reduced once, at the sync)
    p.acc_grad = p.acc_grad.defined() ? add(p.acc_grad, g) : g;
    p.unsharded.set_grad(Tensor());
  }
}

}  // namespace dtr
