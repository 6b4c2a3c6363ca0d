// Shared Catch2 main: initialises dtr (MPI when launched by mpirun, world size 1 otherwise),
// runs the tests, and makes every rank agree on the exit status.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "runtime/env.h"

int main(int argc, char** argv) {
  dtr::init(argc, argv);
  int failed = Catch::Session().run(argc, argv);
  failed = dtr::all_ranks_max(failed);
  dtr::finalize();
  return failed ? 1 : 0;
}
