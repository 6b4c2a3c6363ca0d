// CPU kernels of swiglu {gate, up} -> silu(gate) * up and swiglu_backward {g, gate, up} ->
// {dgate, dup}, each one pass over its inputs. Strided inputs are made contiguous first; the
// contiguous arrays are processed in blocks of kBlock elements, OpenMP-parallel over blocks.
// f32 runs Eigen's packet math (cpu/vec.h; the same exp as the silu / silu_backward kernels in
// pointwise_kernels.cpp), one register pass per packet, the tail padded to a full packet so
// every element takes the same path wherever a block (or a shard) ends; f64 the scalar std::
// expressions.
//   s = 1 / (1 + exp(-x)): exp overflows to inf for x < -88 (f32), giving s = 0 and silu = -0,
//   the limit; no NaN for finite inputs.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr {
namespace {

/// Elements per block (one OpenMP iteration; one Eigen expression for f32).
constexpr int64_t kBlock = 4096;

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

void check_inputs(const OpCall& c) {
  const Tensor& a = c.inputs[0];
  for (size_t i = 1; i < c.inputs.size(); ++i)
    DTR_CHECK(c.inputs[i].sizes() == a.sizes() && c.inputs[i].dtype() == a.dtype(), c.name(), ": input ", i, " ",
              c.inputs[i].sizes(), " ", c.inputs[i].dtype(), " differs from input 0 ", a.sizes(), " ", a.dtype());
}

/// Calls f(off, len) for every block of [0, n), in parallel when n is large.
template <class F>
void for_blocks(int64_t n, F f) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t b = 0; b < nb; ++b) f(b * kBlock, std::min(kBlock, n - b * kBlock));
}

/// Calls body(in pointers, out pointers) on each packet of the f32 arrays at [off, off + len):
/// full packets in place, the tail through zero-padded buffers (so it takes the packet math too).
template <size_t N, size_t M, class F>
void packet_loop(std::array<const float*, N> in, std::array<float*, M> out, int64_t off, int64_t len, F body) {
  constexpr int64_t L = cpu::vec::detail::kLanes;
  const int64_t end = off + len;
  int64_t j = off;
  for (; j + L <= end; j += L) {
    std::array<const float*, N> pi;
    std::array<float*, M> po;
    for (size_t k = 0; k < N; ++k) pi[k] = in[k] + j;
    for (size_t k = 0; k < M; ++k) po[k] = out[k] + j;
    body(pi, po);
  }
  if (j == end) return;
  alignas(64) float bi[N][L] = {}, bo[M][L];
  std::array<const float*, N> pi;
  std::array<float*, M> po;
  for (size_t k = 0; k < N; ++k) {
    std::copy(in[k] + j, in[k] + end, bi[k]);
    pi[k] = bi[k];
  }
  for (size_t k = 0; k < M; ++k) po[k] = bo[k];
  body(pi, po);
  for (size_t k = 0; k < M; ++k) std::copy(bo[k], bo[k] + (end - j), out[k] + j);
}

std::vector<Tensor> k_swiglu(const OpCall& c) {
  check_inputs(c);
  const Tensor gate = contig(c.inputs[0]), up = contig(c.inputs[1]);
  Tensor out = empty(gate.sizes(), TensorOptions(gate.dtype()));
  const int64_t n = gate.numel();
  cpu::dispatch_floating(gate.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(gate.data_ptr());
    const T* pu = static_cast<const T*>(up.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    for_blocks(n, [&](int64_t off, int64_t len) {
      if constexpr (std::is_same_v<T, float>) {
        using namespace Eigen::internal;
        using P = cpu::vec::detail::Packet;
        const P one = pset1<P>(1.0f);
        packet_loop<2, 1>({px, pu}, {po}, off, len, [&](const auto& in, const auto& o) {
          const P x = ploadu<P>(in[0]);
          pstoreu(o[0], pmul(pdiv(x, padd(one, pexp(pnegate(x)))), ploadu<P>(in[1])));
        });
      } else {
        for (int64_t i = off; i < off + len; ++i) po[i] = px[i] / (T(1) + std::exp(-px[i])) * pu[i];
      }
    });
  });
  return {out};
}

std::vector<Tensor> k_swiglu_backward(const OpCall& c) {
  check_inputs(c);
  const Tensor g = contig(c.inputs[0]), gate = contig(c.inputs[1]), up = contig(c.inputs[2]);
  Tensor dgate = empty(gate.sizes(), TensorOptions(gate.dtype()));
  Tensor dup = empty(gate.sizes(), TensorOptions(gate.dtype()));
  const int64_t n = gate.numel();
  cpu::dispatch_floating(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(gate.data_ptr());
    const T* pu = static_cast<const T*>(up.data_ptr());
    T* pdx = static_cast<T*>(dgate.data_ptr());
    T* pdu = static_cast<T*>(dup.data_ptr());
    for_blocks(n, [&](int64_t off, int64_t len) {
      if constexpr (std::is_same_v<T, float>) {
        using namespace Eigen::internal;
        using P = cpu::vec::detail::Packet;
        const P one = pset1<P>(1.0f);
        packet_loop<3, 2>({pg, px, pu}, {pdx, pdu}, off, len, [&](const auto& in, const auto& o) {
          const P gv = ploadu<P>(in[0]), x = ploadu<P>(in[1]), u = ploadu<P>(in[2]);
          const P s = pdiv(one, padd(one, pexp(pnegate(x))));
          pstoreu(o[1], pmul(gv, pmul(x, s)));
          pstoreu(o[0], pmul(pmul(gv, u), pmul(s, padd(pmul(x, psub(one, s)), one))));
        });
      } else {
        for (int64_t i = off; i < off + len; ++i) {
          const T x = px[i], s = T(1) / (T(1) + std::exp(-x));
          pdu[i] = pg[i] * (x * s);
          pdx[i] = pg[i] * pu[i] * (s * (x * (T(1) - s) + T(1)));
        }
      }
    });
  });
  return {dgate, dup};
}

DTR_REGISTER_KERNEL("swiglu", DeviceType::CPU, k_swiglu);
DTR_REGISTER_KERNEL("swiglu_backward", DeviceType::CPU, k_swiglu_backward);

}  // namespace
}  // namespace dtr
