// dtr-fuzz-seeds OUT_DIR: writes the seed inputs of every fuzz target to OUT_DIR/<target>/seed_N.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fuzz/targets.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  for (const auto& name : dtr::fuzz::target_names()) {
    const auto dir = std::filesystem::path(argv[1]) / name;
    std::filesystem::create_directories(dir);
    const auto seeds = dtr::fuzz::seed_inputs(name);
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream(dir / ("seed_" + std::to_string(i)), std::ios::binary) << seeds[i];
    }
    std::printf("%s: %zu seeds\n", name.c_str(), seeds.size());
  }
  return 0;
}
