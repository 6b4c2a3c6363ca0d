#pragma once
// Helpers of MpiProcessGroup: MPI datatypes and ops for dtr dtypes, contiguous CPU staging of
// tensors, f32 accumulation buffers for bf16/f16 reductions, MPI error checks.
#include <mpi.h>

#include <string>
#include <vector>

#include "runtime/process_group.h"

namespace dtr::mpi {

/// The MPI datatype that moves / reduces `t` natively: f64 DOUBLE, f32 FLOAT, i64 INT64_T,
/// i32 INT32_T, u8/bool UINT8_T, bf16/f16 UINT16_T (moves only: reduce those via f32).
MPI_Datatype datatype(DType t);
/// MPI op of a ReduceOp (AVG -> MPI_SUM, divided afterwards).
MPI_Op op(ReduceOp op);
/// Throws dtr::Error "<what>: <MPI error string>" when rc != MPI_SUCCESS.
void check(int rc, const char* call, const std::string& what);
/// Element count as an MPI int. Errors: count > INT_MAX.
int count(int64_t n, const std::string& what);

/// A contiguous CPU tensor holding the data of a user tensor: the tensor itself when it is
/// already contiguous on the CPU, else a staging copy (made by load(), written back by store()).
/// CUDA tensors are staged through pinned host memory: load() copies device -> host after the
/// work queued on the device's compute stream, store() copies host -> device on that stream.
struct Staged {
  Tensor user, buf;
  bool staged = false;
  explicit Staged(const Tensor& t);
  /// Copies user -> buf when staged (call on the communication thread).
  void load();
  /// Copies buf -> user when staged.
  void store();
  void* data() const { return buf.data_ptr(); }
};

/// f32 copies of bf16 / f16 data and back.
std::vector<float> to_f32(const Tensor& contiguous);
void from_f32(const std::vector<float>& src, Tensor& contiguous);
/// x /= n elementwise for a contiguous f32 / f64 tensor (AVG).
void divide(Tensor& contiguous, int64_t n);
void divide(std::vector<float>& v, int64_t n);

}  // namespace dtr::mpi
