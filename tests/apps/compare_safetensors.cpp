// compare_safetensors A B [--atol X]
// A and B are safetensors files or HF model directories (model.safetensors or an index).
// Exit 0 when both hold the same tensor names, shapes and dtypes and every element satisfies
// |a - b| <= atol; prints the largest difference and where. Exit 1 otherwise (names the tensor).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "models/formats/sharded_checkpoint.h"
#include "tensor/ops.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: compare_safetensors A B [--atol X]\n");
    return 2;
  }
  double atol = 0;
  for (int i = 3; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--atol") == 0) atol = std::stod(argv[i + 1]);
  try {
    const auto a = dtr::safetensors::load_checkpoint(argv[1]);
    const auto b = dtr::safetensors::load_checkpoint(argv[2]);
    if (a.size() != b.size()) {
      std::printf("FAIL: %zu tensors in %s, %zu in %s\n", a.size(), argv[1], b.size(), argv[2]);
      return 1;
    }
    double worst = 0;
    std::string where;
    for (const auto& [name, ta] : a) {
      auto it = b.find(name);
      if (it == b.end() || it->second.sizes() != ta.sizes() || it->second.dtype() != ta.dtype()) {
        std::printf("FAIL: %s differs in presence, shape or dtype\n", name.c_str());
        return 1;
      }
      const auto va = dtr::to_dtype(ta, dtr::DType::f64).to_vector<double>();
      const auto vb = dtr::to_dtype(it->second, dtr::DType::f64).to_vector<double>();
      for (size_t i = 0; i < va.size(); ++i) {
        const double d = std::fabs(va[i] - vb[i]);
        if (!(d <= worst)) {  // NaN counts as the worst
          worst = std::isnan(d) ? INFINITY : d;
          where = name + "[" + std::to_string(i) + "]";
        }
      }
    }
    std::printf("%zu tensors, max |a - b| = %.3g at %s (atol %.3g)\n", a.size(), worst, where.c_str(), atol);
    return worst <= atol ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_safetensors: %s\n", e.what());
    return 1;
  }
}
