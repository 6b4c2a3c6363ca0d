// dtr-bench-collectives: the collectives benchmark as its own executable (until the dtr-bench
// front end wires it as `dtr-bench collectives`). Usage: mpirun -np 4 dtr-bench-collectives
// [--max-mib 256] [--ops all_reduce,all_gather] [--rounds 3]
#include "bench/collectives.h"
#include "runtime/env.h"

int main(int argc, char** argv) {
  dtr::init(argc, argv);
  const int rc = dtr::bench::bench_collectives(argc, argv);
  dtr::finalize();
  return rc;
}
