// libFuzzer entry point of one target; CMake builds it once per target with
// -DDTR_FUZZ_TARGET="<name>" (see fuzz/CMakeLists.txt and models/README.md).
#include <cstddef>
#include <cstdint>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)dtr::fuzz::run_target(DTR_FUZZ_TARGET, {reinterpret_cast<const char*>(data), size});
  return 0;
}
