#include "tensor/ops/cpu/copy_kernel.h"

#include <cstring>

#include "tensor/ops/cpu/loops.h"

namespace dtr::cpu {
namespace {

template <class F>
void dispatch_any(DType dt, F&& f) {
  switch (dt) {
    case DType::f64: f(double{}); break;
    case DType::f32: f(float{}); break;
    case DType::bf16: f(bf16{}); break;
    case DType::f16: f(f16{}); break;
    case DType::i64: f(int64_t{}); break;
    case DType::i32: f(int32_t{}); break;
    case DType::u8: f(uint8_t{}); break;
    case DType::bool_: f(bool{}); break;
  }
}

template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, f16>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, f16>) {
    return static_cast<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const size_t lead = shape.size() - t.sizes().size();
  Shape st(shape.size(), 0);
  for (size_t i = lead; i < shape.size(); ++i) {
    const int64_t s = t.sizes()[i - lead];
    DTR_CHECK(s == shape[i] || s == 1, "broadcast: shape ", t.sizes(), " does not broadcast to ", shape);
    st[i] = (s == 1 && shape[i] != 1) ? 0 : t.strides()[i - lead];
  }
  return st;
}

void copy_strided(Tensor& dst, const Tensor& src) {
  DTR_CHECK(dst.sizes() == src.sizes(), "copy: shape ", src.sizes(), " into ", dst.sizes());
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch_any(dst.dtype(), [&](auto to_tag) {
    using To = decltype(to_tag);
    dispatch_any(src.dtype(), [&](auto from_tag) {
      using From = decltype(from_tag);
      To* po = static_cast<To*>(dst.data_ptr());
      const From* pi = static_cast<const From*>(src.data_ptr());
      auto L = coalesce<2>(dst.sizes(), {dst.strides(), src.strides()});
      for_each_row(L, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        To* o = po + off[0];
        const From* x = pi + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t j = 0; j < n; ++j) o[j] = convert<To>(x[j]);
        } else {
          for (int64_t j = 0; j < n; ++j) o[j * st[0]] = convert<To>(x[j * st[1]]);
        }
      });
    });
  });
}

void fill_strided(Tensor& dst, double v) {
  if (dst.numel() == 0) return;
  dispatch_any(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T value = convert<T>(v);
    T* po = static_cast<T*>(dst.data_ptr());
    auto L = coalesce<1>(dst.sizes(), {dst.strides()});
    for_each_row(L, [&](const std::array<int64_t, 1>& off, int64_t n, const std::array<int64_t, 1>& st) {
      for (int64_t j = 0; j < n; ++j) po[off[0] + j * st[0]] = value;
    });
  });
}

}  // namespace dtr::cpu
