// CUDA kernels of the fused GLU gatings act(gate) * up: swiglu (silu) and geglu (gelu, tanh
// approximation), their backwards {g, gate, up} -> {dgate, dup}, and swiglu_joined_backward
// {g, gate_up} -> d gate_up (halves of the last dim), same formulas and operation order as
// ops/cpu/nn_swiglu_kernels.cpp. Inputs are made contiguous; one thread per element
// (grid-stride). bf16 / f16 compute in f32 and round once.
//   silu: s = 1 / (1 + exp(-x));  act = x * s;  act' = s * (x * (1 - s) + 1)
//   gelu: v = x (2k + 2ka x^2), s = 1 / (1 + exp(-v));  act = x * s;
//         act' = s * (x * (1 - s) * (2k + 6ka x^2) + 1)      (k = sqrt(2 / pi), a = 0.044715)
//   out = act(x) * u;  dup = g * act(x);  dgate = g * u * act'(x)
#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

struct Silu {
  template <class A>
  __device__ static A act(A x) {
    return x / (A(1) + exp(-x));
  }
  template <class A>
  __device__ static void grad(A x, A& a, A& da) {
    const A s = A(1) / (A(1) + exp(-x));
    a = x * s;
    da = s * (x * (A(1) - s) + A(1));
  }
};

struct GeluTanh {
  template <class A>
  __device__ static A act(A x) {
    return x / (A(1) + exp(-(x * (A(1.5957691216057307117) + A(0.071354816272869213275) * x * x))));
  }
  template <class A>
  __device__ static void grad(A x, A& a, A& da) {
    const A x2 = x * x, s = A(1) / (A(1) + exp(-(x * (A(1.5957691216057307117) + A(0.071354816272869213275) * x2))));
    a = x * s;
    da = s * (x * (A(1) - s) * (A(1.5957691216057307117) + A(0.21406444881860763983) * x2) + A(1));
  }
};

template <class Act, class T>
__global__ void glu_kernel(int64_t n, const T* gate, const T* up, T* out) {
  using A = acc_t<T>;
  DTR_GRID_STRIDE_LOOP(i, n) { out[i] = store<T>(Act::act(load(gate[i])) * load(up[i])); }
}

template <class Act, class T>
__global__ void glu_backward_kernel(int64_t n, const T* g, const T* gate, const T* up, T* dgate, T* dup) {
  using A = acc_t<T>;
  DTR_GRID_STRIDE_LOOP(i, n) {
    const A gv = load(g[i]), u = load(up[i]);
    A a, da;
    Act::grad(load(gate[i]), a, da);
    dup[i] = store<T>(gv * a);
    dgate[i] = store<T>(gv * u * da);
  }
}

/// The joined form's gradient: element i of g [R, I] -> dgate / dup at row r of d [R, 2I].
template <class T>
__global__ void swiglu_joined_backward_kernel(int64_t n, int64_t I, const T* g, const T* gu, T* d) {
  using A = acc_t<T>;
  DTR_GRID_STRIDE_LOOP(i, n) {
    const int64_t r = i / I, c = i % I, x0 = r * 2 * I + c;
    const A gv = load(g[i]), u = load(gu[x0 + I]);
    A a, da;
    Silu::grad(load(gu[x0]), a, da);
    d[x0 + I] = store<T>(gv * a);
    d[x0] = store<T>(gv * u * da);
  }
}

void check_inputs(const OpCall& c) {
  const Tensor& a = c.inputs[0];
  DTR_CHECK(is_floating(a.dtype()), c.name(), ": expected floating tensors, got ", a.dtype());
  for (size_t i = 1; i < c.inputs.size(); ++i)
    DTR_CHECK(c.inputs[i].sizes() == a.sizes() && c.inputs[i].dtype() == a.dtype(), c.name(), ": input ", i, " ",
              c.inputs[i].sizes(), " ", c.inputs[i].dtype(), " differs from input 0 ", a.sizes(), " ", a.dtype());
}

template <class Act>
std::vector<Tensor> k_glu(const OpCall& c) {
  check_inputs(c);
  const Tensor& g0 = c.inputs[0];
  Tensor out = cuda_empty(g0.sizes(), g0.dtype(), g0);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  DeviceGuard guard(g0.device());
  const Tensor gate = cuda_contiguous(g0), up = cuda_contiguous(c.inputs[1]);
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(gate.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    glu_kernel<Act, T><<<blocks_for(n), kThreads, 0, s>>>(n, static_cast<const T*>(gate.data_ptr()),
                                                        static_cast<const T*>(up.data_ptr()),
                                                        static_cast<T*>(out.data_ptr()));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

template <class Act>
std::vector<Tensor> k_glu_backward(const OpCall& c) {
  check_inputs(c);
  const Tensor& g0 = c.inputs[0];
  Tensor dgate = cuda_empty(g0.sizes(), g0.dtype(), g0), dup = cuda_empty(g0.sizes(), g0.dtype(), g0);
  const int64_t n = g0.numel();
  if (n == 0) return {dgate, dup};
  DeviceGuard guard(g0.device());
  const Tensor g = cuda_contiguous(g0), gate = cuda_contiguous(c.inputs[1]), up = cuda_contiguous(c.inputs[2]);
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(gate.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    glu_backward_kernel<Act, T><<<blocks_for(n), kThreads, 0, s>>>(
        n, static_cast<const T*>(g.data_ptr()), static_cast<const T*>(gate.data_ptr()),
        static_cast<const T*>(up.data_ptr()), static_cast<T*>(dgate.data_ptr()), static_cast<T*>(dup.data_ptr()));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {dgate, dup};
}

/// {g [.., I], gate_up [.., 2I]} -> d gate_up [.., 2I].
std::vector<Tensor> k_swiglu_joined_backward(const OpCall& c) {
  const Tensor& g0 = c.inputs[0];
  const Tensor& gu0 = c.inputs[1];
  const int64_t I = g0.dim() > 0 ? g0.size(-1) : 0;
  DTR_CHECK(gu0.dim() == g0.dim() && gu0.size(-1) == 2 * I && gu0.numel() == 2 * g0.numel() &&
                gu0.dtype() == g0.dtype() && is_floating(g0.dtype()),
            "swiglu_joined_backward: gradient ", g0.sizes(), " ", g0.dtype(), " and gate_up ", gu0.sizes(), " ",
            gu0.dtype(), " (expected [.., I] and [.., 2I] of one floating dtype)");
  Tensor d = cuda_empty(gu0.sizes(), gu0.dtype(), gu0);
  const int64_t n = g0.numel();
  if (n == 0) return {d};
  DeviceGuard guard(g0.device());
  const Tensor g = cuda_contiguous(g0), gu = cuda_contiguous(gu0);
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(g.dtype(), "swiglu_joined_backward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_joined_backward_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
        n, I, static_cast<const T*>(g.data_ptr()), static_cast<const T*>(gu.data_ptr()), static_cast<T*>(d.data_ptr()));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {d};
}

DTR_REGISTER_KERNEL("swiglu", DeviceType::CUDA, k_glu<Silu>);
DTR_REGISTER_KERNEL("geglu", DeviceType::CUDA, k_glu<GeluTanh>);
DTR_REGISTER_KERNEL("geglu_backward", DeviceType::CUDA, k_glu_backward<GeluTanh>);
DTR_REGISTER_KERNEL("swiglu_joined_backward", DeviceType::CUDA, k_swiglu_joined_backward);
DTR_REGISTER_KERNEL("swiglu_backward", DeviceType::CUDA, k_glu_backward<Silu>);

}  // namespace
}  // namespace dtr::cuda_ops
