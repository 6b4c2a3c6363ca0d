// Randomized property test of the DTensor layer (property_chain.h): random shapes, 1-d and 2-d
// meshes, random placements (strided shards included) and random chains of 3-7 ops; forward and
// input gradients equal the same chain on full f64 tensors. ctest runs a fixed-seed set on 1-4
// ranks; scripts/dtensor-property.sh runs more with new seeds through the environment:
//   DTR_PROPERTY_SEED   base seed (default 15)        DTR_PROPERTY_CASES  cases (default 400)
//   DTR_PROPERTY_CASE   run only this case index      DTR_PROPERTY_VERBOSE=1  print every case
// A case whose chain is invalid on one process too is redrawn; a view that would need
// communication may be refused with its clear error (PyTorch refuses it too), nothing else.
#include <cstdlib>
#include <iostream>

#include "property_chain.h"

using namespace dtr;
using namespace dtr::testing;
using namespace dtr::testing::property;

namespace {

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : dflt;
}

/// The meshes a case draws from: the world as 1-d, and as 2-d (2 x w/2 when even, else 1 x w and
/// w x 1), built once (every mesh is an MPI communicator split).
std::vector<DeviceMesh> property_meshes() {
  const int w = world_size();
  std::vector<DeviceMesh> out{DeviceMesh::world("w")};
  if (w % 2 == 0 && w > 2) out.push_back(DeviceMesh({2, w / 2}, {"a", "b"}));
  out.push_back(DeviceMesh({1, w}, {"a", "b"}));
  out.push_back(DeviceMesh({w, 1}, {"a", "b"}));
  return out;
}

}  // namespace

TEST_CASE("random op chains on random placements equal the single process", "[property]") {
  const uint64_t base = static_cast<uint64_t>(env_int("DTR_PROPERTY_SEED", 15));
  const int64_t cases = env_int("DTR_PROPERTY_CASES", 400);
  const int64_t only = env_int("DTR_PROPERTY_CASE", -1);
  const bool verbose = env_int("DTR_PROPERTY_VERBOSE", 0) != 0;
  const auto meshes = property_meshes();
  int64_t counts[4] = {0, 0, 0, 0};
  for (int64_t k = 0; k < cases; ++k) {
    if (only >= 0 && k != only) continue;
    // Redraw (deterministically) while the chain is invalid on one process.
    for (uint64_t attempt = 0; attempt < 20; ++attempt) {
      const uint64_t seed = base * 1000003ULL + static_cast<uint64_t>(k) * 101ULL + attempt;
      const DeviceMesh& mesh = meshes[seed % meshes.size()];
      const Chain c = random_chain(seed, mesh);
      std::string msg;
      const Outcome o = run_case(c, mesh, seed, msg);
      if (o == Outcome::invalid && attempt < 19) continue;
      ++counts[static_cast<int>(o)];
      const std::string what = "case " + std::to_string(k) + " (seed " + std::to_string(seed) + ", mesh " + mesh.str() +
                               "): " + c.str();
      if (verbose && rank() == 0) std::cerr << what << " => " << static_cast<int>(o) << " " << msg << "\n";
      INFO(what << "\n  " << msg);
      CHECK(o != Outcome::fail);
      break;
    }
  }
  if (rank() == 0)
    std::cerr << "property: world " << world_size() << " seed " << base << ": " << counts[0] << " passed, " << counts[2]
              << " refused (view needs communication), " << counts[1] << " invalid on one process, " << counts[3]
              << " failed\n";
}
