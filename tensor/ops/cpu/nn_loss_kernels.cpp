// CPU kernels of cross_entropy (per row: logsumexp - logit[target], f64 sum over rows) and
// cross_entropy_backward ((softmax - onehot) * g / count). Neither materialises more than its
// output: the forward keeps one logsumexp per row in registers, the backward writes dlogits
// directly. f32 rows use Eigen's vectorised exp (cpu/vec.h); f64 rows the scalar std::exp.
// f32 rows take one pass over the logits (online softmax per block of cpu::vec::kSumBlock:
// running max, f32 block sums added in f64); the backward stores each block's exp(x - running
// max) and scales it by exp(shift - max) * g / (count * sum) while the row is in cache: one
// read of the row and one exp per logit, not the forward's max + sum passes plus a second exp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr {
namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

/// Targets as int64, checked: each in [0, C) or == ignore_index. Returns the non-ignored count.
int64_t checked_targets(const Tensor& targets, int64_t C, int64_t ignore, std::vector<int64_t>& v, const char* op) {
  v = targets.to_vector<int64_t>();
  int64_t count = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == ignore) continue;
    DTR_CHECK(v[i] >= 0 && v[i] < C, op, ": target ", v[i], " at position ", i, " is out of range [0, ", C,
              ") (ignore_index=", ignore, ")");
    ++count;
  }
  return count;
}

template <class T>
T row_lse(const T* x, int64_t C) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < C; ++j) m = std::max(m, x[j]);
  if (m == -std::numeric_limits<T>::infinity()) return m;
  // Sum in double: with f32 and a large vocabulary (49152) the many tiny terms fall below
  // half an ulp of the running sum and are lost, biasing the loss low by ~1e-4.
  double s = 0;
  for (int64_t j = 0; j < C; ++j) s += static_cast<double>(std::exp(x[j] - m));
  return m + static_cast<T>(std::log(s));
}

/// f32: one pass, online over blocks (cpu/vec.h online_sum_exp): vectorised max and exp, f32
/// block sums added in f64.
template <>
float row_lse<float>(const float* x, int64_t C) {
  float m;
  const double z = cpu::vec::online_sum_exp(x, C, m);
  if (m == -std::numeric_limits<float>::infinity()) return m;
  return m + static_cast<float>(std::log(z));
}

std::vector<Tensor> k_cross_entropy(const OpCall& c) {
  Tensor x = contig(c.inputs[0]);
  const int64_t N = x.sizes()[0], C = x.sizes()[1], ignore = c.i(0);
  std::vector<int64_t> tg;
  const int64_t count = checked_targets(c.inputs[1], C, ignore, tg, "cross_entropy");
  Tensor out = empty({}, TensorOptions(x.dtype()));
  cpu::dispatch_floating(x.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    // Per-row losses in parallel, summed in row order: the result does not depend on the
    // number of threads.
    std::vector<double> per_row(static_cast<size_t>(N), 0.0);
#pragma omp parallel for schedule(static) if (N * C >= cpu::kParallelGrain)
    for (int64_t i = 0; i < N; ++i) {
      if (tg[i] == ignore) continue;
      const T* row = px + i * C;
      per_row[i] = static_cast<double>(row_lse(row, C)) - static_cast<double>(row[tg[i]]);
    }
    double total = 0;
    for (double v : per_row) total += v;
    *static_cast<T*>(out.data_ptr()) = static_cast<T>(count == 0 ? 0.0 : total / static_cast<double>(count));
  });
  return {out};
}

/// inputs {g (0-d), logits, targets}, attrs {ignore_index} -> dlogits.
std::vector<Tensor> k_cross_entropy_backward(const OpCall& c) {
  Tensor x = contig(c.inputs[1]);
  const int64_t N = x.sizes()[0], C = x.sizes()[1], ignore = c.i(0);
  std::vector<int64_t> tg;
  const int64_t count = checked_targets(c.inputs[2], C, ignore, tg, "cross_entropy_backward");
  const double g = c.inputs[0].item<double>();
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  cpu::dispatch_floating(x.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const T k = static_cast<T>(count == 0 ? 0.0 : g / static_cast<double>(count));
    std::vector<float> shifts;  // per block of a row (f32 path)
#pragma omp parallel for schedule(static) firstprivate(shifts) if (N * C >= cpu::kParallelGrain)
    for (int64_t i = 0; i < N; ++i) {
      if constexpr (std::is_same_v<T, float>) shifts.resize(static_cast<size_t>(C / cpu::vec::kSumBlock + 1));
      T* o = po + i * C;
      if (tg[i] == ignore) {
        std::fill(o, o + C, T(0));
        continue;
      }
      const T* row = px + i * C;
      if constexpr (std::is_same_v<T, float>) {
        // One read of the row and one exp per logit: o = exp(x - running max) per block (online
        // softmax), then each block scaled by exp(shift - max) * k / sum while the row is in cache.
        float m;
        const double z = cpu::vec::online_sum_exp(row, C, m, o, shifts.data());
        if (m == -std::numeric_limits<float>::infinity()) {
          std::fill(o, o + C, std::numeric_limits<float>::quiet_NaN());  // as exp(x - lse) with lse = -inf
        } else {
          for (int64_t b = 0, kb = 0; b < C; b += cpu::vec::kSumBlock, ++kb) {
            const int64_t len = std::min(cpu::vec::kSumBlock, C - b);
            const double f = std::exp(static_cast<double>(shifts[kb]) - static_cast<double>(m)) * static_cast<double>(k) / z;
            cpu::vec::MapF(o + b, len) *= static_cast<float>(f);
          }
        }
      } else {
        const T lse = row_lse(row, C);
        for (int64_t j = 0; j < C; ++j) o[j] = std::exp(row[j] - lse) * k;
      }
      o[tg[i]] -= k;
    }
  });
  return {out};
}

DTR_REGISTER_KERNEL("cross_entropy", DeviceType::CPU, k_cross_entropy);
DTR_REGISTER_KERNEL("cross_entropy_backward", DeviceType::CPU, k_cross_entropy_backward);

}  // namespace
}  // namespace dtr
