// cuBLASLt GEMM and the CUDA kernels of mm / bmm / addmm_ (see gemm.h).
#include "tensor/ops/cuda/gemm.h"

#ifdef DTR_WITH_CUDA
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "tensor/cuda/cuda_context.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda/copy.h"
#include "tensor/env_vars.h"

namespace dtr::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // NVIDIA's recommendation for Hopper
constexpr int kMaxDevices = 64;

std::atomic<int> g_tf32{-1};  // -1: not read from the environment yet

std::mutex g_mu;
cublasLtHandle_t g_handles[kMaxDevices] = {};
std::map<std::pair<int, cudaStream_t>, void*> g_workspaces;
std::unordered_map<std::string, cublasLtMatmulHeuristicResult_t> g_algos;

/// Workspace of (current device, stream), allocated once and kept for the process.
void* workspace(int dev, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  void*& w = g_workspaces[{dev, s}];
  if (!w) DTR_CUDA_CHECK(cudaMalloc(&w, kWorkspaceBytes));
  return w;
}

/// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic assumes 256-byte
/// aligned pointers unless told otherwise, and views (narrow, slices) break that.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

/// One GEMM operand as cuBLASLt sees it: a column-major matrix [rows x cols] with leading
/// dimension ld, used transposed or not, and a batch stride.
struct Operand {
  const void* ptr = nullptr;
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t rows = 0, cols = 0, ld = 0, batch_stride = 0;
};

/// Describes row-major X [r, c] with element strides (rs, cs) as the column-major matrix X^T
/// (op N gives X^T) when its rows are unit-stride, or as X itself (op T gives X^T) when its
/// columns are. Returns false when neither layout fits (then the caller copies).
bool as_transposed(int64_t r, int64_t c, int64_t rs, int64_t cs, Operand& o) {
  if ((c == 1 || cs == 1) && (r == 1 || rs >= c)) {  // X^T stored column-major: [c x r], ld rs
    o.op = CUBLAS_OP_N;
    o.rows = c;
    o.cols = r;
    o.ld = r == 1 ? std::max<int64_t>(c, 1) : rs;
    return true;
  }
  if ((r == 1 || rs == 1) && (c == 1 || cs >= r)) {  // X stored column-major: [r x c], ld cs
    o.op = CUBLAS_OP_T;
    o.rows = r;
    o.cols = c;
    o.ld = c == 1 ? std::max<int64_t>(r, 1) : cs;
    return true;
  }
  return false;
}

struct Types {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

Types types_for(DType dt) {
  switch (dt) {
    case DType::bf16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f32:
      return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    default: break;
  }
  DTR_ERROR("cuda gemm: unsupported dtype ", dt, " (expected float64, float32, bfloat16 or float16)");
}

/// RAII owners of cuBLASLt descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

void make_layout(Layout& L, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t batch_stride) {
  DTR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&L.l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    DTR_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(L.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    DTR_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(L.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                      sizeof(batch_stride)));
  }
}

/// D [batch x (n x m) column-major, ld n] = opA(A) opB(B) (+ bias over rows of D), where in
/// row-major terms out[m, n] = a[m, k] b[k, n]: A describes b^T, B describes a^T.
/// accumulate: D += (beta 1, D read as C), else D = (beta 0).
/// Returns false when cuBLASLt's heuristic has no algorithm (e.g. for the bias epilogue, or
/// for unusual alignments); the caller then falls back (bias added separately, aligned copies).
bool lt_matmul(const Operand& A, const Operand& B, void* D, int64_t m, int64_t n, int64_t k, int64_t batch,
               DType dt, const void* bias, bool accumulate = false) {
  const Types ty = types_for(dt);
  const int dev = current_device();
  cudaStream_t stream = current_stream();

  MatmulDesc desc;
  DTR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, ty.compute, ty.scale));
  const int32_t opa = A.op, opb = B.op;
  DTR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  DTR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    DTR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    DTR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  Layout la, lb, ld;
  make_layout(la, ty.data, A.rows, A.cols, A.ld, batch, A.batch_stride);
  make_layout(lb, ty.data, B.rows, B.cols, B.ld, batch, B.batch_stride);
  make_layout(ld, ty.data, n, m, n, batch, n * m);

  const uint32_t al_a = alignment(A.ptr), al_b = alignment(B.ptr), al_d = alignment(D);
  const std::string key =
      detail::cat(dev, '|', static_cast<int>(dt), '|', static_cast<int>(ty.compute), '|', opa, opb, '|', m, ',', n,
                  ',', k, ',', batch, '|', A.ld, ',', B.ld, ',', A.batch_stride, ',', B.batch_stride, '|', al_a, ',',
                  al_b, ',', al_d, '|', bias ? alignment(bias) : 0u, '|', accumulate);
  cublasLtMatmulHeuristicResult_t heur{};
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_algos.find(key);
    if (it != g_algos.end()) {
      heur = it->second;
      cached = true;
    }
  }
  if (!cached) {
    Preference pref;
    DTR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
    const uint64_t ws = kWorkspaceBytes;
    DTR_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    DTR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                          sizeof(al_a)));
    DTR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                          sizeof(al_b)));
    DTR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                          sizeof(al_d)));
    DTR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                          sizeof(al_d)));
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc.d, la.l, lb.l, ld.l, ld.l, pref.p, 1,
                                                             &heur, &returned);
    if (st != CUBLAS_STATUS_SUCCESS || returned == 0) {
      if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
        DTR_ERROR("cuda gemm: cublasLtMatmulAlgoGetHeuristic failed for ", dtype_name(dt), " m=", m, " n=", n,
                  " k=", k, " batch=", batch, ": ", cublasLtGetStatusString(st));
      return false;
    }
    std::lock_guard<std::mutex> lock(g_mu);
    g_algos[key] = heur;
  }
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const void* alpha = ty.scale == CUDA_R_64F ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = ty.scale == CUDA_R_64F ? static_cast<const void*>(accumulate ? &one_d : &zero_d)
                                             : static_cast<const void*>(accumulate ? &one_f : &zero_f);
  DTR_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), desc.d, alpha, A.ptr, la.l, B.ptr, lb.l, beta, D, ld.l, D, ld.l,
                                  &heur.algo, workspace(dev, stream), kWorkspaceBytes, stream));
  return true;
}

/// A 2-D matrix (the last two dims of `t`, batch dim 0 when 3-D) as a cuBLASLt operand of
/// op(X) = X^T; copies `t` to a contiguous tensor when its layout does not fit (kept in `hold`).
Operand operand(const Tensor& t, Tensor& hold) {
  const int64_t d = t.dim();
  const int64_t r = t.size(d - 2), c = t.size(d - 1);
  Operand o;
  const bool batched = d == 3 && t.size(0) > 1;
  const bool batch_ok = !batched || t.stride(0) != 0;
  if (batch_ok && as_transposed(r, c, t.stride(d - 2), t.stride(d - 1), o)) {
    hold = t;
  } else {
    hold = t.contiguous();
    DTR_CHECK(as_transposed(r, c, hold.stride(d - 2), hold.stride(d - 1), o), "cuda gemm: contiguous operand rejected");
  }
  o.ptr = hold.data_ptr();
  o.batch_stride = d == 3 ? hold.stride(0) : 0;
  return o;
}

}  // namespace

bool allow_tf32() {
  int v = g_tf32.load();
  if (v < 0) {
    v = env::flag("DTR_ALLOW_TF32") ? 1 : 0;
    g_tf32.store(v);
  }
  return v == 1;
}

void set_allow_tf32(bool on) { g_tf32.store(on ? 1 : 0); }

cublasLtHandle_t lt_handle() {
  const int dev = current_device();
  DTR_CHECK(dev < kMaxDevices, "cuda gemm: device index ", dev, " >= ", kMaxDevices);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_handles[dev]) DTR_CUBLAS_CHECK(cublasLtCreate(&g_handles[dev]));
  return g_handles[dev];
}

Tensor gemm(const Tensor& a_in, const Tensor& b_in, const Tensor& bias_in) {
  DTR_CHECK((a_in.dim() == 2 && b_in.dim() == 2) || (a_in.dim() == 3 && b_in.dim() == 3), "cuda gemm: operands ",
            a_in.sizes(), " and ", b_in.sizes(), " (expected both 2-d or both 3-d)");
  const bool batched = a_in.dim() == 3;
  const int64_t B = batched ? a_in.size(0) : 1;
  const int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  DTR_CHECK(b_in.size(-2) == k && (!batched || b_in.size(0) == B), "cuda gemm: shapes ", a_in.sizes(), " and ",
            b_in.sizes(), " do not match");
  DTR_CHECK(a_in.device().is_cuda() && b_in.device() == a_in.device(), "cuda gemm: operands on ", a_in.device(),
            " and ", b_in.device(), " (expected one CUDA device)");
  DTR_CHECK(a_in.dtype() == b_in.dtype(), "cuda gemm: dtypes differ: ", a_in.dtype(), " vs ", b_in.dtype());
  DTR_CHECK(!bias_in.defined() || (bias_in.dim() == 1 && bias_in.size(0) == n && bias_in.dtype() == a_in.dtype() &&
                                   bias_in.device() == a_in.device()),
            "cuda gemm: bias ", bias_in.sizes(), " (expected [", n, "] of the operands' dtype and device)");
  (void)types_for(a_in.dtype());  // rejects integer dtypes with a clear message
  DeviceGuard guard(a_in.device().index);
  const TensorOptions opt = TensorOptions(a_in.dtype()).with_device(a_in.device());

  // A weight broadcast over the batch (stride 0, e.g. TPLinear) with a batch-collapsible
  // input: one [B*m, k] x [k, n] GEMM instead of a copy of the weight per batch element.
  if (batched && B > 1 && b_in.stride(0) == 0 && a_in.stride(0) == m * a_in.stride(1)) {
    const Tensor a2 = make_view(a_in, {B * m, k}, {a_in.stride(1), a_in.stride(2)}, a_in.storage_offset());
    const Tensor b2 = make_view(b_in, {k, n}, {b_in.stride(1), b_in.stride(2)}, b_in.storage_offset());
    return gemm(a2, b2, bias_in).view({B, m, n});
  }

  Tensor out = empty(batched ? Shape{B, m, n} : Shape{m, n}, opt);
  if (out.numel() == 0) return out;
  if (k == 0) {  // empty sum: zeros (+ bias)
    fill_strided(out, 0.0);
    if (bias_in.defined()) copy_strided(out, bias_in.expand(out.sizes()));
    return out;
  }
  Tensor ha, hb;
  const Operand A = operand(b_in, hb);  // b^T
  const Operand Bop = operand(a_in, ha);  // a^T
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
  const DType dt = a_in.dtype();
  if (bias.defined() && lt_matmul(A, Bop, out.data_ptr(), m, n, k, B, dt, bias.data_ptr())) return out;
  if (!lt_matmul(A, Bop, out.data_ptr(), m, n, k, B, dt, nullptr)) {
    // No algorithm for these layouts / alignments: fresh (256-byte aligned) contiguous copies.
    Tensor ca, cb;
    const Operand A2 = operand(b_in.clone(), cb), B2 = operand(a_in.clone(), ca);
    DTR_CHECK(lt_matmul(A2, B2, out.data_ptr(), m, n, k, B, dt, nullptr), "cuda gemm: cuBLASLt has no algorithm for ",
              dtype_name(dt), " m=", m, " n=", n, " k=", k, " batch=", B, " even with contiguous operands");
  }
  if (bias.defined()) out = add(out, bias);
  return out;
}

namespace {

std::vector<Tensor> k_mm(const OpCall& c) { return {gemm(c.inputs[0], c.inputs[1])}; }
std::vector<Tensor> k_bmm(const OpCall& c) { return {gemm(c.inputs[0], c.inputs[1])}; }

/// self += a @ b: cuBLASLt with beta 1 into a contiguous self; other layouts (or no algorithm)
/// take the product and an add.
std::vector<Tensor> k_addmm_(const OpCall& c) {
  Tensor self = c.inputs[0];
  const Tensor& a = c.inputs[1];
  const Tensor& b = c.inputs[2];
  DTR_CHECK(self.device().is_cuda() && a.device() == self.device() && b.device() == self.device(),
            "addmm_: self on ", self.device(), ", operands on ", a.device(), " and ", b.device(),
            " (expected one CUDA device)");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (self.is_contiguous() && self.numel() > 0 && k > 0) {
    DeviceGuard guard(self.device().index);
    Tensor ha, hb;
    const Operand A = operand(b, hb);  // b^T
    const Operand Bop = operand(a, ha);  // a^T
    if (lt_matmul(A, Bop, self.data_ptr(), m, n, k, 1, self.dtype(), nullptr, true)) return {self};
  }
  add_(self, gemm(a, b));
  return {self};
}

DTR_REGISTER_KERNEL("mm", DeviceType::CUDA, k_mm);
DTR_REGISTER_KERNEL("bmm", DeviceType::CUDA, k_bmm);
DTR_REGISTER_KERNEL_EXACT("addmm_", DeviceType::CUDA, k_addmm_);

}  // namespace
}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
