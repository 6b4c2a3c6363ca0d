// CUDA kernels of ops "sdpa" and "sdpa_backward" (the front end is tensor/ops/nn_attention.cpp):
// checks, output allocation on the inputs' device, and the launch of the fused FlashAttention-2
// kernels of attention_forward.cu / attention_backward.cu on dtr::cuda::current_stream().
// Semantics are those of the CPU kernels (tensor/ops/cpu/nn_attention_common.h,
// nn_attention_forward.cpp, nn_attention_backward.cpp):
//   sdpa          {q, k, v[, q_doc, k_doc]}, attrs {is_causal, scale[, window[, diagonal]]}
//                 -> {out [B, Hq, T, Dv] (q's dtype), lse [B, Hq, T] f32}
//   sdpa_backward {g, q, k, v, out, lse[, q_doc, k_doc]}, attrs as sdpa -> {dq, dk, dv} (q's dtype)
// Supported: f32 / bf16 / f16 (f32 accumulation), head dims D, Dv <= 128. Not on CUDA: f64
// (dtr::Error). There is no dropout attribute on this op (CPU or CUDA).
// Env DTR_CUDA_SDPA_SIMPLE=1: bf16 / f16 forward on CUDA cores instead of tensor cores.
#include <cstdlib>
#include <cstring>
#include <limits>

#include "tensor/cuda/cuda_context.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda/attention.cuh"
#include "tensor/env_vars.h"

namespace dtr {
namespace {

namespace attn = cuda::attn;

attn::ElemType elem_type(DType dt, const char* op) {
  switch (dt) {
    case DType::f32: return attn::ElemType::f32;
    case DType::bf16: return attn::ElemType::bf16;
    case DType::f16: return attn::ElemType::f16;
    default: break;
  }
  DTR_ERROR(op, " (CUDA): dtype ", dt, " is not supported on CUDA; expected float32, bfloat16 or float16");
}

void copy_strides(int64_t (&dst)[4], const Tensor& t) {
  for (int d = 0; d < 4; ++d) dst[d] = t.stride(d);
}

/// True when DTR_CUDA_SDPA_SIMPLE is set to a value other than "" / "0": the bf16 / f16 forward
/// then runs the CUDA-core kernel instead of the tensor-core one (for debugging and comparison).
bool simple_forward_requested() {
  return env::flag("DTR_CUDA_SDPA_SIMPLE");
}

/// Makes the tensors' device current for the launch, restoring the previous one afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device d) : prev_(cuda::current_device()) {
    if (prev_ != d.index) cuda::set_device(d.index);
    changed_ = prev_ != d.index;
  }
  ~DeviceGuard() {
    if (changed_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
  bool changed_ = false;
};

/// The sliding window of an sdpa call (attrs {is_causal, scale, window}; 0 when absent).
int64_t sdpa_window(const OpCall& c) { return c.attrs.size() > 2 ? c.i(2) : 0; }

/// Fills the causal diagonal (attr 3, default S - T) and the document ids (inputs doc0, doc0 + 1,
/// made contiguous into `ids`, which keeps them alive until the launch is queued) of `p`.
template <class P>
void fill_mask(P& p, const OpCall& c, size_t doc0, const Tensor& q, Tensor (&ids)[2]) {
  constexpr int64_t kMaxLen = std::numeric_limits<int>::max() / 4;
  const int64_t diag = c.attrs.size() > 3 ? c.i(3) : static_cast<int64_t>(p.S) - p.T;
  DTR_CHECK(diag >= -kMaxLen && diag <= kMaxLen, c.name(), " (CUDA): causal diagonal ", diag, " out of range");
  p.diag = static_cast<int>(diag);
  if (c.inputs.size() > doc0 + 1 && c.inputs[doc0].defined()) {
    for (int j = 0; j < 2; ++j) {
      ids[j] = contiguous(c.inputs[doc0 + j]);
      DTR_CHECK(ids[j].dtype() == DType::i64 && ids[j].device() == q.device(), c.name(),
                " (CUDA): document ids must be int64 on ", q.device(), ", got ", ids[j].dtype(), " on ",
                ids[j].device());
    }
    p.q_doc = static_cast<const int64_t*>(ids[0].data_ptr());
    p.k_doc = static_cast<const int64_t*>(ids[1].data_ptr());
  }
}

/// Checks shared by forward and backward; fills the geometry of `p` (ForwardParams or BackwardParams).
template <class P>
void check_and_fill(P& p, const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                    int64_t window) {
  DTR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, " (CUDA): expected q [B, Hq, T, D], k/v [B, Hkv, S, D], got q ",
            q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  DTR_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op, " (CUDA): q, k, v must share one dtype, got ",
            q.dtype(), ", ", k.dtype(), ", ", v.dtype());
  p.dtype = elem_type(q.dtype(), op);
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3);
  DTR_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && k.size(3) == D && v.size(2) == S, op,
            " (CUDA): shape mismatch: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  DTR_CHECK(Hq == 0 || (Hkv > 0 && Hq % Hkv == 0), op, " (CUDA): query heads Hq=", Hq,
            " must be a multiple of key/value heads Hkv=", Hkv);
  DTR_CHECK(D >= 1 && D <= attn::kMaxHeadDim && Dv >= 1 && Dv <= attn::kMaxHeadDim, op,
            " (CUDA): head dims must be in [1, ", attn::kMaxHeadDim, "], got D=", D, ", Dv=", Dv, " (q ", q.sizes(),
            ", v ", v.sizes(), ")");
  constexpr int64_t kGridYZ = 65535;  // CUDA grid y / z limit (heads, batch)
  DTR_CHECK(B <= kGridYZ && Hq <= kGridYZ, op, " (CUDA): batch ", B, " and heads ", Hq, " must be <= ", kGridYZ);
  constexpr int64_t kMaxLen = std::numeric_limits<int>::max() / 2;
  DTR_CHECK(T <= kMaxLen && S <= kMaxLen, op, " (CUDA): sequence lengths T=", T, ", S=", S, " too large");
  p.B = static_cast<int>(B);
  p.Hq = static_cast<int>(Hq);
  p.Hkv = static_cast<int>(Hkv);
  p.T = static_cast<int>(T);
  p.S = static_cast<int>(S);
  p.D = static_cast<int>(D);
  p.Dv = static_cast<int>(Dv);
  p.causal = causal;
  DTR_CHECK(window >= 0 && window <= kMaxLen, op, " (CUDA): sliding window ", window, " out of range");
  p.window = static_cast<int>(window);
  p.scale = static_cast<float>(scale);
  copy_strides(p.q_stride, q);
  copy_strides(p.k_stride, k);
  copy_strides(p.v_stride, v);
}

/// inputs {q, k, v[, q_doc, k_doc]}, attrs {is_causal, scale[, window[, diagonal]]} -> {out, lse}.
std::vector<Tensor> k_sdpa_cuda(const OpCall& c) {
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  attn::ForwardParams p;
  check_and_fill(p, "sdpa", q, k, v, c.b(0), c.f(1), sdpa_window(c));
  DeviceGuard guard(q.device());
  Tensor ids[2];
  fill_mask(p, c, 3, q, ids);
  const TensorOptions opt = TensorOptions(q.dtype()).with_device(q.device());
  Tensor out = empty({q.size(0), q.size(1), q.size(2), v.size(3)}, opt);
  Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, opt.with_dtype(DType::f32));
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.tensor_cores = !simple_forward_requested();
  DTR_CUDA_CHECK(attn::sdpa_forward(p, cuda::current_stream()));
  return {out, lse};
}

/// inputs {g, q, k, v, out, lse[, q_doc, k_doc]}, attrs as sdpa -> {dq, dk, dv}.
std::vector<Tensor> k_sdpa_backward_cuda(const OpCall& c) {
  const Tensor &g = c.inputs[0], &q = c.inputs[1], &k = c.inputs[2], &v = c.inputs[3], &o = c.inputs[4];
  const Tensor& lse = c.inputs[5];
  attn::BackwardParams p;
  check_and_fill(p, "sdpa_backward", q, k, v, c.b(0), c.f(1), sdpa_window(c));
  const Shape out_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
  DTR_CHECK(g.sizes() == out_shape && o.sizes() == out_shape, "sdpa_backward (CUDA): gradient ", g.sizes(),
            " and output ", o.sizes(), " must have the output's shape ", out_shape);
  DTR_CHECK(g.dtype() == q.dtype() && o.dtype() == q.dtype(), "sdpa_backward (CUDA): gradient ", g.dtype(),
            " and output ", o.dtype(), " must have q's dtype ", q.dtype());
  DTR_CHECK(lse.dtype() == DType::f32 && lse.sizes() == Shape({q.size(0), q.size(1), q.size(2)}),
            "sdpa_backward (CUDA): lse must be float32 [B, Hq, T] = ", Shape({q.size(0), q.size(1), q.size(2)}),
            ", got ", lse.dtype(), " ", lse.sizes());
  DeviceGuard guard(q.device());
  Tensor ids[2];
  fill_mask(p, c, 6, q, ids);
  const TensorOptions opt = TensorOptions(q.dtype()).with_device(q.device());
  Tensor dq = empty(q.sizes(), opt), dk = empty(k.sizes(), opt), dv = empty(v.sizes(), opt);
  Tensor di = empty({q.size(0), q.size(1), q.size(2)}, opt.with_dtype(DType::f32));  // rowsum(dO * O)
  p.g = g.data_ptr();
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = o.data_ptr();
  p.lse = static_cast<const float*>(lse.data_ptr());
  copy_strides(p.g_stride, g);
  copy_strides(p.out_stride, o);
  for (int d = 0; d < 3; ++d) p.lse_stride[d] = lse.stride(d);
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.di = static_cast<float*>(di.data_ptr());
  DTR_CUDA_CHECK(attn::sdpa_backward(p, cuda::current_stream()));
  return {dq, dk, dv};
}

// The upcast flag of an OpDef is shared by all devices: register with the same flag as the CPU
// kernels (sdpa exact so that lse stays f32; sdpa_backward default), which the dispatcher ignores
// for CUDA anyway (CUDA kernels receive bf16 / f16 as they are).
DTR_REGISTER_KERNEL_EXACT("sdpa", DeviceType::CUDA, k_sdpa_cuda);
DTR_REGISTER_KERNEL("sdpa_backward", DeviceType::CUDA, k_sdpa_backward_cuda);

}  // namespace
}  // namespace dtr
