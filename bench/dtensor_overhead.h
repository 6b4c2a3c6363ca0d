#pragma once
namespace dtr::bench {
/// `dtr-bench dtensor`: per-op overhead of the DTensor path (propagation cache hit, cache miss,
/// redistribution planning) in microseconds, beside the same local op without DTensor, on
/// small tensors where overhead dominates. Run under mpirun or alone (1-rank mesh).
int bench_dtensor(int argc, char** argv);
}  // namespace dtr::bench
