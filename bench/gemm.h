#pragma once
namespace dtr::bench {
/// `dtr-bench gemm`: GFLOP/s of dtr::mm / dtr::bmm (f32, dispatch + allocation included) beside
/// raw Eigen (preallocated output, same maps) and OpenBLAS cblas_sgemm on the same shapes and
/// thread count (OpenBLAS only with `--blas`), best of 7, printed with the ratios to Eigen.
int bench_gemm(int argc, char** argv);
}  // namespace dtr::bench
