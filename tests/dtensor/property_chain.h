#pragma once
// Random op chains for the DTensor property test (test_property.cpp): a case is a set of f64
// inputs with random shapes (dims 1-5, so below or near the rank count: uneven and empty shards)
// and random placements (Shard, Replicate, Partial(sum), strided shards alone or paired with a
// later Shard as FSDP + TP make them), and a chain of 3-7 ops drawn from everything that has a
// sharding rule. run_case() runs the chain on full tensors and on DTensors and compares the
// output and every input gradient. Everything is drawn from one std::mt19937_64 seeded by the
// case seed, so every rank builds the same case.
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/redistribute.h"
#include "dtensor_test_util.h"

namespace dtr::testing::property {

using Rng = std::mt19937_64;
using Step = std::function<Tensor(const Tensor& x, const std::vector<Tensor>& in)>;

inline int64_t uni(Rng& r, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(r); }
inline bool coin(Rng& r, double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(r) < p; }

/// A random case: inputs (input 0 starts the chain), their placements, the steps.
struct Chain {
  std::vector<Tensor> fulls;
  std::vector<Placements> pls;
  std::vector<Step> steps;
  std::vector<std::string> desc;
  Shape cur;  // shape of the chain's value after the last step (while building)

  /// Runs the steps; on DTensors each step's local shard must have the shape its spec says.
  Tensor run(const std::vector<Tensor>& in) const {
    Tensor x = in[0];
    for (size_t i = 0; i < steps.size(); ++i) {
      x = steps[i](x, in);
      if (x.is_distributed())
        DTR_CHECK(local_tensor(x).sizes() == dtensor_spec(x).local_shape(), "property: after ", desc[i],
                  " the local shard ", local_tensor(x).sizes(), " does not match ", dtensor_spec(x).str());
    }
    return x;
  }
  std::string str() const {
    std::ostringstream os;
    for (size_t i = 0; i < fulls.size(); ++i)
      os << (i ? ", " : "") << "in" << i << " " << detail::cat(fulls[i].sizes()) << " " << fulls[i].dtype() << " "
         << (pls[i].empty() ? "plain" : placements_str(pls[i]));
    os << " | ";
    for (size_t i = 0; i < desc.size(); ++i) os << (i ? " -> " : "") << desc[i];
    return os.str();
  }
};

/// Random placements of a tensor of `shape` on `mesh`: per mesh dim Replicate, Shard(d),
/// Partial(sum) (floating only), a strided shard standing alone, or on a 2-d mesh the FSDP + TP
/// pair [StridedShard(d, mesh[1]), Shard(d)].
inline Placements random_placements(Rng& r, const DeviceMesh& mesh, const Shape& shape, bool floating) {
  const int nd = mesh.ndim();
  const int64_t td = static_cast<int64_t>(shape.size());
  Placements p(nd, Replicate());
  for (int i = 0; i < nd; ++i) {
    const int64_t k = uni(r, 0, 9);
    if (k <= 2 || td == 0) continue;  // Replicate
    const int64_t d = uni(r, 0, td - 1);
    if (k <= 5) p[i] = Shard(d);
    else if (k <= 7) p[i] = floating ? Partial() : Shard(d);
    else if (k == 8) p[i] = StridedShard(d, uni(r, 2, 3));
    else if (nd == 2 && i == 0) {
      p[0] = StridedShard(d, mesh.size(1));
      p[1] = Shard(d);
      break;
    } else {
      p[i] = Shard(d);
    }
  }
  return p;
}

inline Shape random_shape(Rng& r, int64_t min_dims, int64_t max_dims) {
  Shape s(static_cast<size_t>(uni(r, min_dims, max_dims)));
  for (auto& v : s) v = uni(r, 1, 5);
  return s;
}

/// Adds an f64 input of `shape` with values in [lo, hi) and random placements (an empty list,
/// one side input in eight: passed as a plain tensor, which counts as replicated); returns its index.
inline size_t add_input(Chain& c, Rng& r, const DeviceMesh& mesh, const Shape& shape, double lo = -1, double hi = 1) {
  c.fulls.push_back(uniform(shape, lo, hi, TensorOptions(DType::f64)));
  c.pls.push_back(!c.pls.empty() && coin(r, 0.125) ? Placements{} : random_placements(r, mesh, shape, true));
  return c.fulls.size() - 1;
}

/// Adds an int64 input (ids / targets; never Partial).
inline size_t add_ids(Chain& c, Rng& r, const DeviceMesh& mesh, const Shape& shape, int64_t hi, bool ignore) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = (ignore && coin(r, 0.2)) ? -100 : uni(r, 0, hi - 1);
  c.fulls.push_back(from_vector<int64_t>(v, shape));
  c.pls.push_back(random_placements(r, mesh, shape, false));
  return c.fulls.size() - 1;
}

/// A shape that broadcasts to `s`: some leading dims dropped, some dims set to 1.
inline Shape broadcastable(Rng& r, const Shape& s) {
  const int64_t drop = s.empty() ? 0 : uni(r, 0, static_cast<int64_t>(s.size()) - 1) * coin(r, 0.3);
  Shape b(s.begin() + drop, s.end());
  for (auto& v : b)
    if (coin(r, 0.3)) v = 1;
  return b;
}

/// A random target for `redistribute` given the current placements: any placement per mesh
/// dim, except that a shard never becomes Partial (PyTorch refuses that too).
inline Placements redistribute_target(uint64_t seed, const DTensorSpec& s) {
  Rng r(seed);
  Placements to = random_placements(r, s.mesh, s.shape, is_floating(s.dtype));
  for (size_t i = 0; i < to.size(); ++i)
    if (to[i].is_partial() && s.placements[i].shards()) to[i] = Replicate();
  return to;
}

/// Appends one random op applicable to c.cur; returns false when the drawn op does not apply.
inline bool add_random_step(Chain& c, Rng& r, const DeviceMesh& mesh);

/// A random case: input 0 of a random shape, then 3-7 ops.
inline Chain random_chain(uint64_t seed, const DeviceMesh& mesh) {
  Rng r(seed);
  Chain c;
  c.cur = random_shape(r, 1, 3);
  add_input(c, r, mesh, c.cur);
  const int64_t n = uni(r, 3, 7);
  for (int tries = 0; static_cast<int64_t>(c.steps.size()) < n && tries < 100; ++tries) add_random_step(c, r, mesh);
  return c;
}

/// Outcome of one case.
enum class Outcome { pass, invalid, rejected, fail };

/// Relative f64 tolerance: every difference is summation order (and the 1/n scale of R -> P).
constexpr double kPropertyRelTol = 1e-9;

/// Runs the chain on full tensors and on distributed inputs; `msg` says what differed.
inline Outcome run_case(const Chain& c, const DeviceMesh& mesh, uint64_t seed, std::string& msg);

}  // namespace dtr::testing::property

#include "property_ops.h"
