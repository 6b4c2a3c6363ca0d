#pragma once
// Vectorised f32 helpers for CPU kernels over contiguous runs, through Eigen's packet math
// (AVX2 exp with ~1 ulp error; "a well-kept library beats our own polynomials").
// Only f32 paths use them: f64 kernels keep their scalar std:: math so that their results stay
// bit-identical to the references they were checked against.
//  - exp results below FLT_MIN are flushed to 0: Eigen's pexp returns ~2.9e-39 (a denormal)
//    for exp(-inf) and any x < -88.7, which is both wrong where the exact answer is 0 (masked
//    logits) and slow in later arithmetic. NaN propagates.
//  - Sums over long rows add f32 partial sums of blocks of kSumBlock elements (8 lanes wide) in
//    f64, so a 49152-wide vocabulary row loses no tiny terms (what the former all-f64 sums
//    guarded against). Every result depends only on its own row, never on how rows are split
//    across threads or ranks.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dtr::cpu::vec {

using ArrF = Eigen::Array<float, Eigen::Dynamic, 1>;
using CMapF = Eigen::Map<const ArrF>;
using MapF = Eigen::Map<ArrF>;

/// Block length of the f32 partial sums (see the file comment).
constexpr int64_t kSumBlock = 512;

namespace detail {
using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int64_t kLanes = Eigen::internal::packet_traits<float>::size;

/// exp(x - shift) of one packet, results below FLT_MIN set to 0.
inline Packet exp_packet(const Packet& x, const Packet& shift) {
  using namespace Eigen::internal;
  const Packet y = pexp(psub(x, shift));
  return pandnot(y, pcmp_lt(y, pset1<Packet>(std::numeric_limits<float>::min())));
}

/// Loads the n < kLanes floats at p into a packet padded with `pad`.
inline Packet load_tail(const float* p, int64_t n, float pad) {
  alignas(64) float buf[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) buf[i] = i < n ? p[i] : pad;
  return Eigen::internal::pload<Packet>(buf);
}
}  // namespace detail

/// max over x[0, n); -inf for n == 0. NaNs are skipped like std::max(m, x) does: each lane keeps
/// m < x ? x : m (a NaN x compares false), four packets wide so the compares pipeline.
inline float max(const float* x, int64_t n) {
  using namespace Eigen::internal;
  using detail::Packet;
  constexpr int64_t L = detail::kLanes;
  const float ninf = -std::numeric_limits<float>::infinity();
  auto step = [](const Packet& m, const Packet& v) { return pselect(pcmp_lt(m, v), v, m); };
  Packet m0 = pset1<Packet>(ninf), m1 = m0, m2 = m0, m3 = m0;
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L) {
    m0 = step(m0, ploadu<Packet>(x + j));
    m1 = step(m1, ploadu<Packet>(x + j + L));
    m2 = step(m2, ploadu<Packet>(x + j + 2 * L));
    m3 = step(m3, ploadu<Packet>(x + j + 3 * L));
  }
  for (; j + L <= n; j += L) m0 = step(m0, ploadu<Packet>(x + j));
  if (j < n) m1 = step(m1, detail::load_tail(x + j, n - j, ninf));
  return predux_max(step(step(m0, m1), step(m2, m3)));  // the lanes hold no NaN
}

/// out[j] = exp(x[j] - shift) * scale for j in [0, n) (out may equal x).
inline void exp_shift(const float* x, float shift, float scale, float* out, int64_t n) {
  using namespace Eigen::internal;
  using detail::Packet;
  constexpr int64_t L = detail::kLanes;
  const Packet ps = pset1<Packet>(shift), sc = pset1<Packet>(scale);
  int64_t j = 0;
  for (; j + L <= n; j += L) pstoreu(out + j, pmul(detail::exp_packet(ploadu<Packet>(x + j), ps), sc));
  if (j < n) {
    alignas(64) float buf[L];
    pstore(buf, pmul(detail::exp_packet(detail::load_tail(x + j, n - j, shift), ps), sc));
    std::copy(buf, buf + (n - j), out + j);
  }
}

namespace detail {
/// sum_j exp(x[j] - shift) over one block (n <= kSumBlock) in f32; also stores the terms at
/// `out` when it is not null.
inline float block_sum_exp(const float* x, float shift, float* out, int64_t n) {
  using namespace Eigen::internal;
  constexpr int64_t L = kLanes;
  const Packet ps = pset1<Packet>(shift);
  Packet acc = pset1<Packet>(0.0f);
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    const Packet y = exp_packet(ploadu<Packet>(x + j), ps);
    if (out) pstoreu(out + j, y);
    acc = padd(acc, y);
  }
  if (j < n) {
    const Packet y = exp_packet(load_tail(x + j, n - j, -std::numeric_limits<float>::infinity()), ps);
    if (out) {
      alignas(64) float buf[L];
      pstore(buf, y);
      std::copy(buf, buf + (n - j), out + j);
    }
    acc = padd(acc, y);
  }
  return predux(acc);
}
}  // namespace detail

/// Online logsumexp in one pass over x (Milakov & Gimelshein 2018, per block of kSumBlock):
/// returns z and sets m (the max, NaNs skipped as max() does) with sum_j exp(x[j] - m) = z. Each
/// block is shifted by the running max (its f32 sum added in f64, earlier blocks rescaled by
/// exp(m_old - m_new) in f64), so the row is read once where max + sum_exp read it twice.
/// With `out` (may equal x) it also stores the block's terms exp(x[j] - shift[b]) and the shift
/// of each block b in `shift` (n / kSumBlock rounded up entries): a caller scales block b by
/// exp(shift[b] - m) / z for the softmax. n == 0 or all -inf: m = -inf, z = 0. A NaN anywhere
/// makes z NaN (a block of only NaN / -inf included), as the two-pass sum does.
inline double online_sum_exp(const float* x, int64_t n, float& m, float* out = nullptr, float* shift = nullptr) {
  m = -std::numeric_limits<float>::infinity();
  double z = 0;
  for (int64_t b = 0, k = 0; b < n; b += kSumBlock, ++k) {
    const int64_t len = std::min(kSumBlock, n - b);
    const float bm = max(x + b, len);
    if (bm > m) {
      z *= std::exp(static_cast<double>(m) - static_cast<double>(bm));  // 0 while m is -inf
      m = bm;
    }
    if (shift) shift[k] = m;
    if (m == -std::numeric_limits<float>::infinity()) {  // nothing visible yet
      if (out) std::fill(out + b, out + b + len, 0.0f);
      // max() skipped the block's NaNs; exp(NaN - m) would have made the sum NaN.
      if (std::any_of(x + b, x + b + len, [](float v) { return std::isnan(v); }))
        z = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    z += static_cast<double>(detail::block_sum_exp(x + b, m, out ? out + b : nullptr, len));
  }
  return z;
}

/// sum_j exp(x[j] - shift) over [0, n) (same exp as exp_shift): f32 block sums added in f64.
inline double sum_exp(const float* x, int64_t n, float shift) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock)
    total += static_cast<double>(detail::block_sum_exp(x + b, shift, nullptr, std::min(kSumBlock, n - b)));
  return total;
}

/// sum_j x[j] * y[j] over [0, n): f32 block sums added in f64.
inline double dot(const float* x, const float* y, int64_t n) {
  double s = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t len = std::min(kSumBlock, n - b);
    s += static_cast<double>((CMapF(x + b, len) * CMapF(y + b, len)).sum());
  }
  return s;
}

/// sum_j x[j] over [0, n): f32 block sums added in f64.
inline double sum(const float* x, int64_t n) {
  double s = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t len = std::min(kSumBlock, n - b);
    s += static_cast<double>(CMapF(x + b, len).sum());
  }
  return s;
}

}  // namespace dtr::cpu::vec
