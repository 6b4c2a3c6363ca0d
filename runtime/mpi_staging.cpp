#include "runtime/mpi_staging.h"

#include <climits>

#include "tensor/ops.h"
#include "tensor/ops/cpu/copy_kernel.h"
#ifdef DTR_WITH_CUDA
#include "tensor/cuda/pinned_allocator.h"
#include "tensor/ops/cuda/copy.h"
#endif

namespace dtr::mpi {

MPI_Datatype datatype(DType t) {
  switch (t) {
    case DType::f64: return MPI_DOUBLE;
    case DType::f32: return MPI_FLOAT;
    case DType::i64: return MPI_INT64_T;
    case DType::i32: return MPI_INT32_T;
    case DType::u8:
    case DType::bool_: return MPI_UINT8_T;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
  }
  DTR_ERROR("mpi::datatype: unknown dtype ", static_cast<int>(t));
}

MPI_Op op(ReduceOp o) {
  switch (o) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: return MPI_SUM;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::MIN: return MPI_MIN;
    case ReduceOp::PRODUCT: return MPI_PROD;
  }
  DTR_ERROR("mpi::op: unknown ReduceOp ", static_cast<int>(o));
}

void check(int rc, const char* call, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DTR_ERROR(what, ": ", call, " failed: ", std::string(msg, len));
}

int count(int64_t n, const std::string& what) {
  DTR_CHECK(n <= INT_MAX, what, ": ", n, " elements exceed the MPI count limit (INT_MAX); split the tensor");
  return static_cast<int>(n);
}

Staged::Staged(const Tensor& t) : user(t) {
  staged = !(t.is_contiguous() && t.device().is_cpu());
  if (!staged) {
    buf = t;
  } else if (t.device().is_cpu()) {
    buf = empty(t.sizes(), TensorOptions(t.dtype()));
  } else {
#ifdef DTR_WITH_CUDA
    buf = cuda::empty_pinned(t.sizes(), t.dtype());  // DMA target / source of the staging copies
#else
    DTR_ERROR("mpi staging: tensor on ", t.device(), " but dtr was built without CUDA");
#endif
  }
}

void Staged::load() {
  if (!staged) return;
  if (user.device().is_cpu()) {
    cpu::copy_strided(buf, user);
    return;
  }
#ifdef DTR_WITH_CUDA
  // CUDA tensor on an MPI group: device -> pinned host, after the work queued on the tensor's
  // compute stream (the copy waits for it).
  cuda::copy_device_to_host(user, buf);
#endif
}

void Staged::store() {
  if (!staged) return;
  if (user.device().is_cpu()) {
    cpu::copy_strided(user, buf);
    return;
  }
#ifdef DTR_WITH_CUDA
  // Pinned host -> device on the tensor's compute stream: later kernels on that stream see it.
  cuda::copy_host_to_device(buf, user);
#endif
}

std::vector<float> to_f32(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (t.dtype() == DType::bf16) {
    const bf16* p = static_cast<const bf16*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  } else {
    DTR_CHECK(t.dtype() == DType::f16, "mpi::to_f32: expected bf16 or f16, got ", t.dtype());
    const f16* p = static_cast<const f16*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  }
  return out;
}

void from_f32(const std::vector<float>& src, Tensor& t) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::bf16) {
    bf16* p = static_cast<bf16*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = bf16(src[i]);
  } else {
    f16* p = static_cast<f16*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = f16(src[i]);
  }
}

void divide(Tensor& t, int64_t n) {
  const int64_t m = t.numel();
  if (t.dtype() == DType::f64) {
    double* p = static_cast<double*>(t.data_ptr());
    for (int64_t i = 0; i < m; ++i) p[i] /= static_cast<double>(n);
  } else {
    DTR_CHECK(t.dtype() == DType::f32, "mpi::divide: AVG needs a floating dtype, got ", t.dtype());
    float* p = static_cast<float*>(t.data_ptr());
    for (int64_t i = 0; i < m; ++i) p[i] /= static_cast<float>(n);
  }
}

void divide(std::vector<float>& v, int64_t n) {
  for (auto& x : v) x /= static_cast<float>(n);
}

}  // namespace dtr::mpi
