// View ops: share storage with their input; the kernels only compute geometry, so the same
// kernel serves every device. Backward maps the gradient back to the input's shape.
#include <algorithm>
#include <numeric>
#include <optional>

#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {

Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      DTR_CHECK(infer < 0, op, ": only one dim can be -1 in ", shape);
      infer = static_cast<int>(i);
    } else {
      DTR_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in ", shape);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    DTR_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape, " is invalid for input of shape ", from);
    out[infer] = numel / known;
  }
  DTR_CHECK(shape_numel(out) == numel, op, ": shape ", shape, " is invalid for input of shape ", from, " (",
            numel, " elements)");
  return out;
}

/// Strides for viewing (sizes, strides) as `shape` without a copy, if possible
/// (PyTorch's computeStride: each run of merged old dims must be contiguous within itself).
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides, const Shape& shape) {
  const int64_t numel = shape_numel(sizes);
  if (numel == 0 || sizes.empty()) return contiguous_strides(shape);
  Shape out(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

std::vector<Tensor> k_view(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  Shape shape = infer_shape(c.shape(0), x.numel(), "view", x.sizes());
  auto st = view_strides(x.sizes(), x.strides(), shape);
  DTR_CHECK(st.has_value(), "view: cannot view a tensor of shape ", x.sizes(), " and strides ", x.strides(), " as ",
            shape, " without a copy (use reshape)");
  return {make_view(x, shape, *st, x.storage_offset())};
}

std::vector<Tensor> k_transpose(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const int64_t a = wrap_dim(c.i(0), x.dim(), "transpose"), b = wrap_dim(c.i(1), x.dim(), "transpose");
  Shape sz = x.sizes(), st = x.strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  return {make_view(x, sz, st, x.storage_offset())};
}

std::vector<Tensor> k_permute(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape& dims = c.shape(0);
  DTR_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute: ", dims.size(), " dims given for a ", x.dim(),
            "-d tensor");
  Shape sz(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], x.dim(), "permute");
    DTR_CHECK(!seen[d], "permute: dim ", d, " repeated in ", dims);
    seen[d] = true;
    sz[i] = x.sizes()[d];
    st[i] = x.strides()[d];
  }
  return {make_view(x, sz, st, x.storage_offset())};
}

std::vector<Tensor> k_slice(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const int64_t d = wrap_dim(c.i(0), x.dim(), "slice");
  const int64_t start = c.i(1), end = c.i(2), step = c.i(3);
  Shape sz = x.sizes(), st = x.strides();
  sz[d] = (end - start + step - 1) / step;
  st[d] *= step;
  return {make_view(x, sz, st, x.storage_offset() + start * x.strides()[d])};
}

std::vector<Tensor> k_expand(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape& shape = c.shape(0);
  DTR_CHECK(shape.size() >= static_cast<size_t>(x.dim()), "expand: target ", shape, " has fewer dims than input ",
            x.sizes());
  const size_t lead = shape.size() - x.dim();
  Shape sz(shape.size()), st(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      DTR_CHECK(shape[i] >= 0, "expand: new leading dim ", i, " cannot be -1 in ", shape);
      sz[i] = shape[i];
      continue;
    }
    const int64_t s = x.sizes()[i - lead];
    const int64_t want = shape[i] == -1 ? s : shape[i];
    DTR_CHECK(s == want || s == 1, "expand: cannot expand shape ", x.sizes(), " to ", shape);
    sz[i] = want;
    st[i] = (s == want) ? x.strides()[i - lead] : 0;
  }
  return {make_view(x, sz, st, x.storage_offset())};
}

std::vector<Tensor> k_reshape(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  Shape shape = infer_shape(c.shape(0), x.numel(), "reshape", x.sizes());
  if (auto st = view_strides(x.sizes(), x.strides(), shape)) return {make_view(x, shape, *st, x.storage_offset())};
  Tensor y = contiguous(x);
  return {make_view(y, shape, contiguous_strides(shape), y.storage_offset())};
}

DTR_REGISTER_KERNEL("reshape", DeviceType::CPU, k_reshape);
DTR_REGISTER_KERNEL("reshape", DeviceType::CUDA, k_reshape);
DTR_REGISTER_KERNEL("view", DeviceType::CPU, k_view);
DTR_REGISTER_KERNEL("view", DeviceType::CUDA, k_view);
DTR_REGISTER_KERNEL("transpose", DeviceType::CPU, k_transpose);
DTR_REGISTER_KERNEL("transpose", DeviceType::CUDA, k_transpose);
DTR_REGISTER_KERNEL("permute", DeviceType::CPU, k_permute);
DTR_REGISTER_KERNEL("permute", DeviceType::CUDA, k_permute);
DTR_REGISTER_KERNEL("slice", DeviceType::CPU, k_slice);
DTR_REGISTER_KERNEL("slice", DeviceType::CUDA, k_slice);
DTR_REGISTER_KERNEL("expand", DeviceType::CPU, k_expand);
DTR_REGISTER_KERNEL("expand", DeviceType::CUDA, k_expand);

// Views never upcast: they must alias their input.
[[maybe_unused]] const bool exact_views = [] {
  for (const char* n : {"view", "reshape", "transpose", "permute", "slice", "expand"}) op_def(n)->upcast_low_precision = false;
  return true;
}();

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  static const OpDef* op = op_def("view");
  Tensor out = dispatch1(OpCall{op, {x}, {shape}});
  if (needs_grad({x})) {
    record("view", {x}, out, [in = x.sizes()](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{reshape(g[0], in)};
    });
  }
  return out;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  if (!x.is_distributed()) {
    Shape s = infer_shape(shape, x.numel(), "reshape", x.sizes());
    if (!view_strides(x.sizes(), x.strides(), s)) return view(contiguous(x), s);
    return view(x, s);
  }
  static const OpDef* op = op_def("reshape");
  Tensor out = dispatch1(OpCall{op, {x}, {shape}});
  if (needs_grad({x})) {
    record("reshape", {x}, out, [in = x.sizes()](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{reshape(g[0], in)};
    });
  }
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  static const OpDef* op = op_def("transpose");
  Tensor out = dispatch1(OpCall{op, {x}, {d0, d1}});
  if (needs_grad({x})) {
    record("transpose", {x}, out, [d0, d1](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{transpose(g[0], d0, d1)};
    });
  }
  return out;
}

Tensor permute(const Tensor& x, const Shape& dims) {
  static const OpDef* op = op_def("permute");
  Tensor out = dispatch1(OpCall{op, {x}, {dims}});
  if (needs_grad({x})) {
    Shape inv(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inv[wrap_dim(dims[i], x.dim(), "permute")] = static_cast<int64_t>(i);
    record("permute", {x}, out, [inv](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{permute(g[0], inv)};
    });
  }
  return out;
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int64_t d = wrap_dim(dim, x.dim(), "slice");
  const int64_t n = x.sizes()[d];
  DTR_CHECK(step >= 1, "slice: step must be >= 1, got ", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  static const OpDef* op = op_def("slice");
  Tensor out = dispatch1(OpCall{op, {x}, {d, start, end, step}});
  if (needs_grad({x})) {
    record("slice", {x}, out, [in = x.sizes(), d, start, end, step](const std::vector<Tensor>& g, const std::vector<bool>&) {
      static const OpDef* bw = op_def("slice_backward");
      return std::vector<Tensor>{dispatch1(OpCall{bw, {g[0]}, {in, d, start, end, step}})};
    });
  }
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  const int64_t d = wrap_dim(dim, x.dim(), "narrow");
  const int64_t n = x.sizes()[d];
  if (start < 0) start += n;
  DTR_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: [", start, ", ", start + length,
            ") out of range for dim ", d, " of size ", n, " (shape ", x.sizes(), ")");
  return slice(x, d, start, start + length, 1);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  static const OpDef* op = op_def("expand");
  Tensor out = dispatch1(OpCall{op, {x}, {shape}});
  if (needs_grad({x})) {
    record("expand", {x}, out, [in = x.sizes()](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{sum_to(g[0], in)};
    });
  }
  return out;
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.sizes()[d] != 1) return x;
  Shape s = x.sizes();
  s.erase(s.begin() + d);
  return view(x, s);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape s = x.sizes();
  s.insert(s.begin() + d, 1);
  return view(x, s);
}

Tensor flatten(const Tensor& x, int64_t start, int64_t end) {
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = wrap_dim(start, x.dim(), "flatten"), e = wrap_dim(end, x.dim(), "flatten");
  DTR_CHECK(s <= e, "flatten: start dim ", start, " after end dim ", end);
  Shape out(x.sizes().begin(), x.sizes().begin() + s);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= x.sizes()[i];
  out.push_back(m);
  out.insert(out.end(), x.sizes().begin() + e + 1, x.sizes().end());
  return reshape(x, out);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  DTR_CHECK(lead >= 0, "sum_to: cannot reduce ", x.sizes(), " to ", shape);
  Shape dims;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < lead) dims.push_back(i);
    else if (shape[i - lead] == 1 && x.sizes()[i] != 1) dims.push_back(i);
  }
  Tensor r = dims.empty() ? x : sum(x, dims, true);
  return reshape(r, shape);
}

}  // namespace dtr
