// CUDA kernels of the fused GLU gatings act(gate) * up: swiglu (silu) and geglu (gelu, tanh
// approximation), their backwards {g, gate, up} -> {dgate, dup}, and swiglu_joined_backward
// {g, gate_up} -> d gate_up (halves of the last dim), swiglu_weighted {gate_up, w} and its backward
// {g, gate_up, w} -> {d gate_up, dw} (rows scaled by w; dw one block per row), same formulas and operation order as
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

/// The weighted joined form: element i of out [R, I] = w[r] * silu(gate) * up of row r.
template <class T>
__global__ void swiglu_weighted_kernel(int64_t n, int64_t I, const T* gu, const T* w, T* out) {
  using A = acc_t<T>;
  DTR_GRID_STRIDE_LOOP(i, n) {
    const int64_t r = i / I, c = i % I, x0 = r * 2 * I + c;
    out[i] = store<T>(Silu::act(load(gu[x0])) * load(gu[x0 + I]) * load(w[r]));
  }
}

/// Its gradient, one block per row r: d gate_up of g * w[r], dw[r] = sum_c g * silu(gate) * up.
template <class T>
__global__ void swiglu_weighted_backward_kernel(int64_t I, const T* g, const T* gu, const T* w, T* d, T* dw) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const A wr = load(w[r]);
  A dot = 0;
  for (int64_t c = threadIdx.x; c < I; c += blockDim.x) {
    const int64_t x0 = r * 2 * I + c;
    const A gv = load(g[r * I + c]), u = load(gu[x0 + I]), gw = gv * wr;
    A a, da;
    Silu::grad(load(gu[x0]), a, da);
    d[x0 + I] = store<T>(gw * a);
    d[x0] = store<T>(gw * u * da);
    dot += gv * (a * u);
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) dw[r] = store<T>(dot);
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

/// gate_up [.., 2I] and w [..] of a weighted call, checked: returns I.
int64_t weighted_inputs(const Tensor& gu, const Tensor& w, const char* op) {
  const int64_t d = gu.dim();
  DTR_CHECK(d >= 1 && gu.size(-1) > 0 && gu.size(-1) % 2 == 0 && is_floating(gu.dtype()) && w.dtype() == gu.dtype() &&
                w.dim() == d - 1 && Shape(gu.sizes().begin(), gu.sizes().end() - 1) == w.sizes(),
            op, ": gate_up ", gu.sizes(), " ", gu.dtype(), " and weights ", w.sizes(), " ", w.dtype(),
            " (expected [.., 2I], I > 0, and its leading dims, one floating dtype)");
  return gu.size(-1) / 2;
}

/// {gate_up [.., 2I], w [..]} -> w * silu(gate) * up [.., I].
std::vector<Tensor> k_swiglu_weighted(const OpCall& c) {
  const int64_t I = weighted_inputs(c.inputs[0], c.inputs[1], "swiglu_weighted");
  Shape os = c.inputs[0].sizes();
  os.back() = I;
  Tensor out = cuda_empty(os, c.inputs[0].dtype(), c.inputs[0]);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  DeviceGuard guard(out.device());
  const Tensor gu = cuda_contiguous(c.inputs[0]), w = cuda_contiguous(c.inputs[1]);
  dispatch_floating(gu.dtype(), "swiglu_weighted", [&](auto tag) {
    using T = decltype(tag);
    swiglu_weighted_kernel<T><<<blocks_for(n), kThreads, 0, cuda::current_stream()>>>(
        n, I, static_cast<const T*>(gu.data_ptr()), static_cast<const T*>(w.data_ptr()), static_cast<T*>(out.data_ptr()));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

/// {g [.., I], gate_up [.., 2I], w [..]} -> {d gate_up, dw}.
std::vector<Tensor> k_swiglu_weighted_backward(const OpCall& c) {
  const int64_t I = weighted_inputs(c.inputs[1], c.inputs[2], "swiglu_weighted_backward");
  const Tensor& g0 = c.inputs[0];
  const int64_t R = c.inputs[2].numel();
  DTR_CHECK(g0.dtype() == c.inputs[1].dtype() && g0.numel() == R * I && g0.dim() == c.inputs[1].dim() &&
                g0.size(-1) == I,
            "swiglu_weighted_backward: gradient ", g0.sizes(), " (expected [.., ", I, "])");
  Tensor d = cuda_empty(c.inputs[1].sizes(), g0.dtype(), g0), dw = cuda_empty(c.inputs[2].sizes(), g0.dtype(), g0);
  if (R == 0) return {d, dw};
  DeviceGuard guard(g0.device());
  const Tensor g = cuda_contiguous(g0), gu = cuda_contiguous(c.inputs[1]), w = cuda_contiguous(c.inputs[2]);
  dispatch_floating(g.dtype(), "swiglu_weighted_backward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_weighted_backward_kernel<T><<<static_cast<unsigned>(R), threads_for_row(I), 0, cuda::current_stream()>>>(
        I, static_cast<const T*>(g.data_ptr()), static_cast<const T*>(gu.data_ptr()),
        static_cast<const T*>(w.data_ptr()), static_cast<T*>(d.data_ptr()), static_cast<T*>(dw.data_ptr()));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {d, dw};
}

DTR_REGISTER_KERNEL("swiglu", DeviceType::CUDA, k_glu<Silu>);
DTR_REGISTER_KERNEL("swiglu_weighted", DeviceType::CUDA, k_swiglu_weighted);
DTR_REGISTER_KERNEL("swiglu_weighted_backward", DeviceType::CUDA, k_swiglu_weighted_backward);
DTR_REGISTER_KERNEL("geglu", DeviceType::CUDA, k_glu<GeluTanh>);
DTR_REGISTER_KERNEL("geglu_backward", DeviceType::CUDA, k_glu_backward<GeluTanh>);
DTR_REGISTER_KERNEL("swiglu_joined_backward", DeviceType::CUDA, k_swiglu_joined_backward);
DTR_REGISTER_KERNEL("swiglu_backward", DeviceType::CUDA, k_glu_backward<Silu>);

}  // namespace
}  // namespace dtr::cuda_ops
