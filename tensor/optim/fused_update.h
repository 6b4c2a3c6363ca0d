#pragma once
// Shared plumbing of the fused optimizer steps: pick the C++ element types of a parameter, its
// gradient and the math (f64 for f64 parameters, f32 otherwise: "f32 master math" for bf16 /
// f16 / f32), and prepare the local, contiguous, CPU tensors one update loop runs over.
#include <string>

#include "tensor/optim/local.h"
#include "tensor/optim/optimizer.h"

namespace dtr::optim::detail {

/// The tensors one fused update of a parameter works on.
struct UpdateOperands {
  Tensor param;  // local storage of the parameter, contiguous, written in place
  Tensor grad;   // local gradient, contiguous (copied only when it was not)
};

/// Local tensors of parameter `p` and its gradient `g`. Errors (naming `opt`): local shapes
/// differ; a non-contiguous parameter; a non-CPU tensor (unless `allow_cuda`: then both on
/// one device, CPU or CUDA; the caller runs a CUDA kernel for CUDA operands).
UpdateOperands prepare(const Tensor& p, const Tensor& g, const char* opt, bool allow_cuda = false);

/// The dtype of state tensors (exp_avg, momentum) for a parameter of dtype `dt`.
inline DType math_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

/// Calls f(P* param, const G* grad, C math_tag) with the element types of the operands.
template <class F>
void dispatch_update(const UpdateOperands& u, const char* opt, F&& f) {
  auto with_grad = [&](auto* p, auto math) {
    switch (u.grad.dtype()) {
      case DType::f64: f(p, static_cast<const double*>(u.grad.data_ptr()), math); break;
      case DType::f32: f(p, static_cast<const float*>(u.grad.data_ptr()), math); break;
      case DType::bf16: f(p, static_cast<const bf16*>(u.grad.data_ptr()), math); break;
      case DType::f16: f(p, static_cast<const f16*>(u.grad.data_ptr()), math); break;
      default: DTR_ERROR(opt, ": gradient dtype ", u.grad.dtype(), " is not floating");
    }
  };
  switch (u.param.dtype()) {
    case DType::f64: with_grad(static_cast<double*>(u.param.data_ptr()), double{}); break;
    case DType::f32: with_grad(static_cast<float*>(u.param.data_ptr()), float{}); break;
    case DType::bf16: with_grad(static_cast<bf16*>(u.param.data_ptr()), float{}); break;
    case DType::f16: with_grad(static_cast<f16*>(u.param.data_ptr()), float{}); break;
    default: DTR_ERROR(opt, ": parameter dtype ", u.param.dtype(), " is not floating");
  }
}

/// Element conversions through float for the 16-bit types (tensor/dtype.h).
using dtr::elem::load;
using dtr::elem::store;

}  // namespace dtr::optim::detail
