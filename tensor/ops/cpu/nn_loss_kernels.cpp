// CPU kernels of cross_entropy (per row: logsumexp - logit[target], f64 sum over rows) and
// cross_entropy_backward ((softmax - onehot) * g / count). Neither materialises more than its
// output: the forward keeps one logsumexp per row in registers, the backward writes dlogits
// directly. f32 rows use Eigen's vectorised exp (cpu/vec.h); f64 rows the scalar std::exp.
// f32 rows take one pass over the logits (online softmax per block of cpu::vec::kSumBlock:
// running max, f32 block sums added in f64); the backward stores each block's exp(x - running
// max) and scales it by exp(shift - max) * g / (count * sum) while the row is in cache: one
// read of the row and one exp per logit, not the forward's max + sum passes plus a second exp.
// cross_entropy_loss_and_grad_ (linear_cross_entropy's chunks) runs that backward pass in place
// on the logits and takes the row's loss from the same max and sum: the loss costs no pass.
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

/// One row's gradient (softmax(x) - onehot(target)) * k into o (o may equal x: the row is
/// overwritten in place) and its loss logsumexp(x) - x[target] (read before o is written).
/// f32: one read of the row and one exp per logit: o = exp(x - running max) per block (online
/// softmax, cpu/vec.h), then each block scaled by exp(shift - max) * k / sum while the row is in
/// cache. `shifts` holds C / kSumBlock + 1 floats (f32 only).
template <class T>
double row_loss_and_grad(const T* x, T* o, int64_t C, int64_t target, T k, float* shifts) {
  const double xt = static_cast<double>(x[target]);
  double lse;
  if constexpr (std::is_same_v<T, float>) {
    float m;
    const double z = cpu::vec::online_sum_exp(x, C, m, o, shifts);
    if (m == -std::numeric_limits<float>::infinity()) {
      std::fill(o, o + C, std::numeric_limits<float>::quiet_NaN());  // as exp(x - lse) with lse = -inf
      lse = -std::numeric_limits<double>::infinity();
    } else {
      for (int64_t b = 0, kb = 0; b < C; b += cpu::vec::kSumBlock, ++kb) {
        const int64_t len = std::min(cpu::vec::kSumBlock, C - b);
        const double f = std::exp(static_cast<double>(shifts[kb]) - static_cast<double>(m)) * static_cast<double>(k) / z;
        cpu::vec::MapF(o + b, len) *= static_cast<float>(f);
      }
      lse = static_cast<double>(m) + std::log(z);
    }
  } else {
    const T l = row_lse(x, C);
    for (int64_t j = 0; j < C; ++j) o[j] = std::exp(x[j] - l) * k;
    lse = static_cast<double>(l);
  }
  o[target] -= k;
  return lse - xt;
}

/// dlogits of every row of x [N, C] into out (may be x itself) with the scale g / count of
/// cross_entropy_backward; ignored rows 0. Returns the sum of the rows' losses (f64, in row
/// order: independent of the thread count).
double loss_and_grad(const Tensor& x, const Tensor& out, const std::vector<int64_t>& tg, int64_t count, int64_t ignore,
                     double g, const char* op) {
  const int64_t N = x.sizes()[0], C = x.sizes()[1];
  std::vector<double> per_row(static_cast<size_t>(N), 0.0);
  cpu::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const T k = static_cast<T>(count == 0 ? 0.0 : g / static_cast<double>(count));
    std::vector<float> shifts;  // per block of a row (f32 path)
#pragma omp parallel for schedule(static) firstprivate(shifts) if (N * C >= cpu::kParallelGrain)
    for (int64_t i = 0; i < N; ++i) {
      T* o = po + i * C;
      if (tg[i] == ignore) {
        std::fill(o, o + C, T(0));
        continue;
      }
      shifts.resize(static_cast<size_t>(C / cpu::vec::kSumBlock + 1));
      per_row[i] = row_loss_and_grad<T>(px + i * C, o, C, tg[i], k, shifts.data());
    }
  });
  double total = 0;
  for (double v : per_row) total += v;
  return total;
}

/// inputs {g (0-d), logits, targets}, attrs {ignore_index} -> dlogits.
std::vector<Tensor> k_cross_entropy_backward(const OpCall& c) {
  Tensor x = contig(c.inputs[1]);
  const int64_t C = x.sizes()[1], ignore = c.i(0);
  std::vector<int64_t> tg;
  const int64_t count = checked_targets(c.inputs[2], C, ignore, tg, "cross_entropy_backward");
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  loss_and_grad(x, out, tg, count, ignore, c.inputs[0].item<double>(), "cross_entropy_backward");
  return {out};
}

/// The loss and the gradient in one pass (linear_cross_entropy's chunks): inputs {g (0-d),
/// logits [N, C] contiguous f32 / f64 (overwritten by dlogits), targets}, attrs {ignore_index}
/// -> {sum over the non-ignored rows of logsumexp - logit[target] (0-d f64), logits}. The
/// dlogits are cross_entropy_backward's ((softmax - onehot) * g / count); the loss is the sum,
/// not the mean, so chunks add up exactly. One read of each row from memory and one write
/// (the row's second pass, the rescale, runs in cache), where cross_entropy + its backward read
/// the logits twice and write a second [N, C] buffer.
std::vector<Tensor> k_cross_entropy_loss_and_grad_(const OpCall& c) {
  const Tensor& x = c.inputs[1];
  DTR_CHECK(x.dim() == 2 && x.is_contiguous() && (x.dtype() == DType::f32 || x.dtype() == DType::f64),
            "cross_entropy_loss_and_grad_: logits must be contiguous f32 / f64 [N, C], got ", x.dtype(), " ",
            x.sizes());
  const int64_t C = x.sizes()[1], ignore = c.i(0);
  std::vector<int64_t> tg;
  const int64_t count = checked_targets(c.inputs[2], C, ignore, tg, "cross_entropy_loss_and_grad_");
  const double total = loss_and_grad(x, x, tg, count, ignore, c.inputs[0].item<double>(), "cross_entropy_loss_and_grad_");
  Tensor loss = empty({}, TensorOptions(DType::f64));
  *static_cast<double*>(loss.data_ptr()) = total;
  return {loss, x};
}

DTR_REGISTER_KERNEL("cross_entropy", DeviceType::CPU, k_cross_entropy);
DTR_REGISTER_KERNEL("cross_entropy_backward", DeviceType::CPU, k_cross_entropy_backward);
DTR_REGISTER_KERNEL_EXACT("cross_entropy_loss_and_grad_", DeviceType::CPU, k_cross_entropy_loss_and_grad_);

}  // namespace
}  // namespace dtr
