#include "tensor/ops/shape.h"

#include <algorithm>

#include "tensor/autograd/grad_mode.h"

namespace dtr {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DTR_CHECK(sa == sb || sa == 1 || sb == 1, op, ": shapes ", a, " and ", b, " are not broadcastable");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

Shape reduction_dims(const Shape& dims, int64_t ndim, const char* op) {
  Shape out;
  if (dims.empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  DTR_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op, ": dim listed twice in ", dims);
  return out;
}

Shape reduced_shape(const Shape& shape, const Shape& dims, bool keepdim) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    const bool reduced = std::find(dims.begin(), dims.end(), i) != dims.end();
    if (!reduced) out.push_back(shape[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  DTR_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch ", a.dtype(), " ", a.sizes(), " vs ", b.dtype(), " ",
            b.sizes(), " (cast one operand with .to())");
}

void check_inplace(const Tensor& t, const char* op) {
  DTR_CHECK(!(grad_enabled() && t.requires_grad()), op, ": in-place op on a tensor that requires grad (shape ",
            t.sizes(), "); use the out-of-place op or run it under NoGradGuard");
}

Tensor reduced_last_view(const Tensor& x, const Shape& dims, int64_t& rows, int64_t& R) {
  Shape sz, st;
  rows = 1;
  R = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!std::count(dims.begin(), dims.end(), d)) {
      sz.push_back(x.sizes()[d]);
      st.push_back(x.strides()[d]);
      rows *= x.sizes()[d];
    }
  for (int64_t d : dims) {
    sz.push_back(x.sizes()[d]);
    st.push_back(x.strides()[d]);
    R *= x.sizes()[d];
  }
  return make_view(x, sz, st, x.storage_offset());
}

}  // namespace dtr
