// materialize_module (see meta_init.h).
#include "parallel/meta_init.h"

#include "dtensor/spec.h"
#include "tensor/meta.h"

namespace dtr {
namespace {

/// The tensor that holds this rank's values: the local shard of a DTensor, else itself.
const Tensor& holder(const Tensor& t) { return t.is_distributed() ? local_tensor(t) : t; }

template <class F>
void for_each_tensor(const nn::Module& m, F f) {
  for (const auto& [n, p] : m.named_parameters()) f(p);
  for (const auto& [n, b] : m.named_buffers()) f(b);
}

}  // namespace

int64_t materialize_module(nn::Module& module) {
  int64_t n = 0;
  for_each_tensor(module, [&](const Tensor& t) {
    if (!t.defined() || !is_meta(holder(t))) return;  // tied names: the second sees it done
    materialize_(holder(t));
    ++n;
  });
  return n;
}

bool has_meta_tensors(const nn::Module& module) {
  bool any = false;
  for_each_tensor(module, [&](const Tensor& t) { any = any || (t.defined() && is_meta(holder(t))); });
  return any;
}

}  // namespace dtr
