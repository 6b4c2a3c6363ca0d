#pragma once
// Helpers for the nn-op sharding rule tests: placement lists per input and the check
// "every combination equals the single-process result" (forward and input gradients).
#include <functional>

#include "dtensor/comm_debug.h"
#include "dtensor_test_util.h"

namespace dtr::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
/// The placement lists to try for one input on a mesh.
using PlacementsFor = std::function<std::vector<Placements>(const DeviceMesh&)>;

inline PlacementsFor any_placement(int64_t ndim, bool partial) {
  return [=](const DeviceMesh& m) { return all_placements(m, ndim, partial); };
}
inline PlacementsFor replicated() {
  return [](const DeviceMesh& m) { return std::vector<Placements>{replicate_all(m.ndim())}; };
}
/// The same placement on every mesh dim, for each of `opts`.
inline PlacementsFor each_of(std::vector<Placement> opts) {
  return [=](const DeviceMesh& m) {
    std::vector<Placements> out;
    for (const auto& p : opts) out.push_back(Placements(m.ndim(), p));
    return out;
  };
}

/// compare_with_single over the cartesian product of per-input placement lists on every test mesh.
inline void check_all(const Fn& f, const std::vector<Tensor>& fulls, const std::vector<PlacementsFor>& per_input,
                      bool backward = true, double tol = kDistTol) {
  for (const DeviceMesh& mesh : test_meshes()) {
    std::vector<std::vector<Placements>> combos{{}};
    for (const auto& pf : per_input) {
      std::vector<std::vector<Placements>> next;
      for (const auto& c : combos)
        for (const auto& p : pf(mesh)) {
          auto d = c;
          d.push_back(p);
          next.push_back(d);
        }
      combos = next;
    }
    for (const auto& c : combos) {
      const std::string r = compare_with_single(f, fulls, mesh, c, backward, tol);
      INFO(r);
      CHECK(r.empty());
    }
  }
}

inline Tensor rnd(const Shape& s, double lo = -1, double hi = 1) {
  return uniform(s, lo, hi, TensorOptions(DType::f64));
}

}  // namespace dtr::testing
