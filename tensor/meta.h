#pragma once
// Meta (deferred) tensors: shapes and dtypes only, no memory, plus a recipe for their values.
// Under a MetaInitGuard (PyTorch's `with torch.device("meta")`, torchdistx's deferred_init) the
// factories full / zeros / ones / uniform / normal return meta tensors that remember how their
// values are made (an InitSource: a constant, the Philox stream they would have drawn, or a
// file range reader set by a loader), and copy_ / fill_ on a meta tensor replace that recipe.
// Random factories still reserve their Philox offsets, so a model built under the guard records
// exactly the numbers an eager build draws. Whoever gives a meta tensor (or a block of it) real
// memory fills it from the recipe: distribute_tensor keeps the local block meta, fully_shard
// fills its shard rows, materialize_ fills what is left. Reading a meta tensor's data is an error.
#include <memory>
#include <string>

#include "tensor/tensor.h"

namespace dtr {

/// The values of a whole (global) tensor, produced block by block on demand.
struct InitSource {
  virtual ~InitSource() = default;
  /// Writes the block of the global tensor (shape `global`) that starts at `offset` (one entry
  /// per dim) into `out` (any dtype / device, contiguous or not; out.sizes() is the block).
  virtual void fill(const Shape& global, const Shape& offset, Tensor& out) const = 0;
  /// One-line description for messages ("normal(0, 0.02) seed 42 offset 1024", a file and key).
  virtual std::string str() const = 0;
};

/// A constant (zeros, ones, full).
std::shared_ptr<const InitSource> constant_init(double value);
/// Philox uniform(low, high) / normal(mean, std) of the stream (seed, offset): element with
/// global row-major index i takes counter offset + i, as the eager factories do (tensor/random.h).
std::shared_ptr<const InitSource> uniform_init(double low, double high, uint64_t seed, uint64_t offset);
std::shared_ptr<const InitSource> normal_init(double mean, double std, uint64_t seed, uint64_t offset);

/// Sets (for its lifetime) whether this thread's factories return meta tensors.
class MetaInitGuard {
 public:
  explicit MetaInitGuard(bool enabled = true);
  ~MetaInitGuard();
  MetaInitGuard(const MetaInitGuard&) = delete;
  MetaInitGuard& operator=(const MetaInitGuard&) = delete;

 private:
  bool prev_;
};
/// True inside a MetaInitGuard(true) on this thread.
bool meta_init_enabled();

/// A meta tensor of `shape` standing for the block at `offset` of the global tensor `global`
/// whose values `source` makes. offset empty = zeros, global empty = shape.
Tensor meta_tensor(const Shape& shape, DType dtype, Device device, std::shared_ptr<const InitSource> source,
                   Shape global = {}, Shape offset = {});
/// True for a plain meta tensor (distributed tensors: ask their local shard).
bool is_meta(const Tensor& t);
/// Replaces the recipe of meta tensor `t` (a loader names the file range of a parameter). Every
/// handle of t (detached copies, the same tensor under a tied name) sees it. Errors: t not meta.
void set_init_source(const Tensor& t, std::shared_ptr<const InitSource> source);
/// The recipe's description (messages, tests). Errors: t not meta.
std::string init_source_str(const Tensor& t);
/// The meta tensor for the block of meta tensor `t` at `offset` (relative to t) of `shape`.
Tensor meta_block(const Tensor& t, const Shape& offset, const Shape& shape);
/// Meta tensor `t` on `device` (same block, same recipe; nothing is allocated or copied).
Tensor meta_to_device(const Tensor& t, Device device);
/// Fills `out` with the block of meta tensor `t` at `offset` (relative to t; out.sizes() is the
/// block). Errors: t not meta, the block outside t.
void fill_from_meta(const Tensor& t, const Shape& offset, Tensor& out);
/// Gives meta tensor `t` memory (its storage, shared by every handle) and fills it from its
/// recipe; afterwards t is an ordinary tensor. Errors: t not meta or not contiguous.
void materialize_(const Tensor& t);

namespace meta_detail {
/// copy_ / fill_ into a meta tensor (tensor/ops/copy.cpp): the destination takes src's recipe
/// (src must be meta, same shape) or the constant.
void copy_into_meta(const Tensor& dst, const Tensor& src);
void fill_meta(const Tensor& dst, double value);
/// The error data_ptr() raises for a meta tensor.
[[noreturn]] void data_of_meta(const Tensor& t);
}  // namespace meta_detail

}  // namespace dtr
