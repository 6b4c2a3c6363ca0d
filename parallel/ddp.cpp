// replicate / DDP (see ddp.h).
#include "parallel/ddp.h"

#include <unordered_map>

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

struct Bucket {
  std::vector<int> params;  // indices into DDPState::params
  DType dtype = DType::f32;
  int64_t numel = 0;
  int pending = 0;
  bool launched = false;
  WorkPtr work;
  Tensor flat;
};

/// replicate's state, stored on the module (nn::Module::state<DDPState>()).
struct DDPState : nn::ModuleState, std::enable_shared_from_this<DDPState> {
  static constexpr const char* kKey = "replicate";
  std::shared_ptr<ProcessGroup> pg;
  std::vector<Tensor> params;
  std::vector<int> bucket_of;
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  int next_launch = 0;
  bool requires_sync = true;
  bool active = false;  // a forward ran since the last finish
  uint64_t callback_backward_id = 0;  // the backward the finalize callback is queued for
  // Every parameter with its requires_grad at replicate(): the buckets are built once from it.
  std::vector<std::pair<std::string, Tensor>> all;
  std::vector<bool> requires_grad;

  /// requires_grad changed since replicate() would be a silent wrong update (a frozen parameter
  /// gets an averaged zero gradient, an unfrozen one is stepped with each rank's own gradient):
  /// refused, as the buckets (torch DDP's reducer too) are fixed at construction.
  void check_requires_grad() const {
    for (size_t i = 0; i < all.size(); ++i)
      DTR_CHECK(all[i].second.requires_grad() == requires_grad[i], "replicate: requires_grad of \"", all[i].first,
                "\" changed to ", all[i].second.requires_grad() ? "true" : "false",
                " after replicate (DDP's buckets are fixed when it is applied); set requires_grad before replicate, "
                "or use fully_shard (strategy fsdp2), which honours the change");
  }

  void reset() {
    for (Bucket& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.launched = false;
    }
    ready.assign(params.size(), false);
    next_launch = 0;
    active = true;
  }
  void launch(Bucket& b) {
    NoGradGuard no_grad;
    std::vector<Tensor> flats;
    for (int i : b.params) {
      Tensor g = params[i].grad();
      flats.push_back(g.defined() ? g.to(b.dtype).contiguous().view({-1}) : zeros({params[i].numel()}, TensorOptions(b.dtype).with_device(params[i].device())));
    }
    b.flat = flats.size() == 1 ? flats[0].clone() : cat(flats, 0);
    b.work = pg->all_reduce(b.flat, ReduceOp::SUM);
    b.launched = true;
  }
  void launch_ready() {
    while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0)
      launch(buckets[next_launch++]);
  }
  void wait_all() {
    NoGradGuard no_grad;
    const double scale = 1.0 / static_cast<double>(pg->size());
    for (Bucket& b : buckets) {
      if (!b.launched || !b.work) continue;
      b.work->wait();
      b.work.reset();
      Tensor avg = mul(b.flat, scale);
      int64_t off = 0;
      for (int i : b.params) {
        const Tensor& p = params[i];
        p.set_grad(avg.narrow(0, off, p.numel()).view(p.sizes()).to(p.dtype()));
        off += p.numel();
      }
      b.flat = Tensor();
    }
    active = false;
  }
  /// DDP's finalize_backward: the first hook of a synced backward queues finish() at the end of
  /// the outermost backward (autograd queue_callback), so buckets left unlaunched by unused
  /// parameters are reduced (zeros stand in) without a call from the user.
  void queue_finish() {
    const uint64_t id = current_backward_id();
    if (!active || !requires_sync || id == 0 || callback_backward_id == id) return;
    callback_backward_id = id;
    std::weak_ptr<DDPState> w = weak_from_this();
    queue_callback([w] {
      if (auto s = w.lock()) s->finish();
    });
  }
  void on_ready(int i) {
    if (!active || !requires_sync || ready[i]) return;
    queue_finish();
    ready[i] = true;
    --buckets[bucket_of[i]].pending;
    launch_ready();
    if (next_launch == static_cast<int>(buckets.size())) wait_all();
  }
  void finish() {
    if (!active) return;
    if (requires_sync) {
      for (Bucket& b : buckets) b.pending = 0;
      launch_ready();
      wait_all();
    }
    active = false;
  }
};

DDPState* find_state(const nn::Module& m) { return m.state<DDPState>(); }

/// The parameters replicate manages (weak: a tensor freed is forgotten).
std::unordered_map<const TensorImpl*, std::weak_ptr<TensorImpl>>& replicated_params() {
  static std::unordered_map<const TensorImpl*, std::weak_ptr<TensorImpl>> r;
  return r;
}

DDPState* state_of(const nn::Module& m, const char* op) {
  DDPState* s = find_state(m);
  DTR_CHECK(s != nullptr, op, ": replicate was not applied to this ", m.type_name());
  return s;
}

}  // namespace

void replicate(nn::Module& module, const DeviceMesh& mesh, const DDPOptions& options) {
  DTR_CHECK(mesh.ndim() == 1, "replicate: expected a 1-d data-parallel mesh, got ", mesh.ndim(), " dims ", mesh.str());
  DTR_CHECK(!find_state(module), "replicate: called twice on the same ", module.type_name(), " module");
  DTR_CHECK(!module.composable_state("fully_shard"), "replicate: fully_shard was already applied to this ",
            module.type_name(), " module (a module takes one data-parallel strategy: replicate or fully_shard)");
  DTR_CHECK(options.bucket_cap_bytes > 0, "replicate: bucket_cap_bytes must be > 0, got ", options.bucket_cap_bytes);
  auto st = std::make_shared<DDPState>();
  st->pg = mesh.group(0);
  NoGradGuard no_grad;
  for (auto& [fqn, p] : module.named_parameters()) {
    DTR_CHECK(!p.is_distributed(), "replicate: parameter \"", fqn, "\" is a DTensor (", p.dist_spec()->str(),
              "); replicate takes plain parameters");
    if (options.broadcast_from_rank0 && st->pg->size() > 1) {
      Tensor t = p.detach();
      DTR_CHECK(t.is_contiguous(), "replicate: parameter \"", fqn, "\" is not contiguous");
      st->pg->broadcast(t, 0)->wait();
    }
    if (p.requires_grad()) st->params.push_back(p);
    replicated_params()[p.impl()] = p.impl_ptr();
    st->all.push_back({fqn, p});
    st->requires_grad.push_back(p.requires_grad());
  }
  if (options.broadcast_from_rank0 && st->pg->size() > 1)
    for (auto& [fqn, b] : module.named_buffers()) {
      Tensor t = b.detach();
      if (t.is_contiguous()) st->pg->broadcast(t, 0)->wait();
    }
  // Buckets in reverse registration order (roughly the order gradients become ready).
  st->bucket_of.assign(st->params.size(), -1);
  for (int i = static_cast<int>(st->params.size()) - 1; i >= 0; --i) {
    const Tensor& p = st->params[i];
    const int64_t bytes = static_cast<int64_t>(p.nbytes());
    if (st->buckets.empty() || st->buckets.back().dtype != p.dtype() ||
        (st->buckets.back().numel > 0 &&
         (st->buckets.back().numel * static_cast<int64_t>(itemsize(p.dtype())) + bytes) > options.bucket_cap_bytes)) {
      st->buckets.emplace_back();
      st->buckets.back().dtype = p.dtype();
    }
    st->buckets.back().params.push_back(i);
    st->buckets.back().numel += p.numel();
    st->bucket_of[i] = static_cast<int>(st->buckets.size()) - 1;
    std::weak_ptr<DDPState> w = st;
    p.register_post_accumulate_grad_hook([w, i](Tensor&) {
      if (auto s = w.lock()) s->on_ready(i);
    });
  }
  st->reset();
  st->active = false;
  module.set_composable_state(DDPState::kKey, st);
  module.register_forward_pre_hook([st](nn::Module&, const std::vector<Tensor>&) -> std::optional<std::vector<Tensor>> {
    // A backward that launched some buckets but not all (unused parameters, no finish call):
    // complete the launched ones so no collective is left behind; unlaunched ones are dropped.
    if (st->active && st->next_launch > 0) st->wait_all();
    st->check_requires_grad();
    st->reset();
    return std::nullopt;
  });
  // The outputs' gradients queue the finalize callback too: a rank whose backward reaches no
  // parameter of this module still joins the all-reduces.
  std::weak_ptr<DDPState> w = st;
  module.register_forward_hook([w](nn::Module&, const std::vector<Tensor>&,
                                   const std::vector<Tensor>& out) -> std::optional<std::vector<Tensor>> {
    if (!grad_enabled()) return std::nullopt;
    for (const Tensor& y : out)
      if (y.defined() && y.requires_grad() && !y.is_leaf())
        y.register_hook([w](const Tensor&) {
          if (auto s = w.lock()) s->queue_finish();
          return Tensor();
        });
    return std::nullopt;
  });
}

bool is_replicated_parameter(const Tensor& t) {
  auto it = replicated_params().find(t.impl());
  return it != replicated_params().end() && it->second.lock() == t.impl_ptr();
}

void replicate_set_requires_gradient_sync(nn::Module& module, bool requires_sync) {
  state_of(module, "replicate_set_requires_gradient_sync")->requires_sync = requires_sync;
}

int replicate_num_buckets(const nn::Module& module) {
  return static_cast<int>(state_of(module, "replicate_num_buckets")->buckets.size());
}

}  // namespace dtr
