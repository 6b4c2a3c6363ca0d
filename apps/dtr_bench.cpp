// dtr-bench: the benchmark front end. `dtr-bench <name> [args]` with name one of gemm, ops,
// dtensor, collectives. Each prints dtr beside its reference, measured in the same run.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "bench/collectives.h"
#include "bench/dtensor_overhead.h"
#include "bench/fsdp.h"
#include "bench/gemm.h"
#ifdef DTR_WITH_CUDA
#include "bench/gemm_gpu.h"
#endif
#include "bench/ops.h"
#include "runtime/env.h"
#include "tensor/error.h"

int main(int argc, char** argv) {
  const std::map<std::string, int (*)(int, char**)> benches = {
      {"gemm", dtr::bench::bench_gemm},
#ifdef DTR_WITH_CUDA
      {"gemm-gpu", dtr::bench::bench_gemm_gpu},
#endif
      {"ops", dtr::bench::bench_ops},
      {"dtensor", dtr::bench::bench_dtensor},
      {"collectives", dtr::bench::bench_collectives},
      {"fsdp", dtr::bench::bench_fsdp},
  };
  if (argc < 2 || !benches.count(argv[1])) {
    std::fprintf(stderr, "usage: dtr-bench <name> [args]   names:");
    for (auto& [n, f] : benches) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  int rc = 0;
  try {
    dtr::init(argc, argv);
    rc = benches.at(argv[1])(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtr-bench: error: %s\n", e.what());
    rc = 1;
  }
  dtr::finalize();
  return rc;
}
