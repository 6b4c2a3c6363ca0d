#pragma once
// Template members of Tensor (included at the end of tensor.h).
#include <cstring>

namespace dtr {

/// Reads element i of a contiguous buffer of dtype `dt` as T.
template <class T>
T load_as(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::f64: return static_cast<T>(static_cast<const double*>(p)[i]);
    case DType::f32: return static_cast<T>(static_cast<const float*>(p)[i]);
    case DType::bf16: return static_cast<T>(static_cast<float>(static_cast<const bf16*>(p)[i]));
    case DType::f16: return static_cast<T>(static_cast<float>(static_cast<const f16*>(p)[i]));
    case DType::i64: return static_cast<T>(static_cast<const int64_t*>(p)[i]);
    case DType::i32: return static_cast<T>(static_cast<const int32_t*>(p)[i]);
    case DType::u8: return static_cast<T>(static_cast<const uint8_t*>(p)[i]);
    case DType::bool_: return static_cast<T>(static_cast<const uint8_t*>(p)[i] != 0);
  }
  return T{};
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(Device::cpu()).contiguous();
  std::vector<T> out(static_cast<size_t>(c.numel()));
  const void* p = c.data_ptr();
  for (int64_t i = 0; i < c.numel(); ++i) out[static_cast<size_t>(i)] = load_as<T>(p, c.dtype(), i);
  return out;
}

template <class T>
T Tensor::item() const {
  DTR_CHECK(numel() == 1, "item(): tensor of shape ", sizes(), " has ", numel(), " elements, expected 1");
  return to_vector<T>()[0];
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opt) {
  DTR_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
            " values do not fill shape ", shape);
  Tensor t = empty(shape, TensorOptions(dtype_of<T>::value));
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  if (opt.dtype != dtype_of<T>::value) t = t.to(opt.dtype);
  if (opt.device != Device::cpu()) t = t.to(opt.device);
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

}  // namespace dtr
