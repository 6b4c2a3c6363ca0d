#pragma once
namespace dtr::bench {
/// `dtr-bench ops`: per-op overhead (dispatch, and dispatch + autograd recording) on tiny
/// tensors in microseconds, and throughput of the fused kernels in GB/s beside a memcpy of the
/// same bytes.
int bench_ops(int argc, char** argv);
}  // namespace dtr::bench
