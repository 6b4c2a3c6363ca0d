// CPU kernels of the fused GLU gatings act(gate) * up: swiglu (act = silu) and geglu (act =
// gelu, tanh approximation), each with its backward {g, gate, up} -> {dgate, dup}, and
// swiglu_joined_backward {g, gate_up} -> d gate_up (the joined [.., 2I] form of the MoE experts),
// and the weighted joined form swiglu_weighted {gate_up, w} -> w[r] * swiglu(gate_up[r]) with its
// backward {g, gate_up, w} -> {d gate_up, dw} (the MoE routing weights applied to the experts'
// hidden rows), each one pass over its inputs. swiglu / geglu read inputs made of contiguous rows (the two
// halves of a joined gate_up) in place, row by row; other strided inputs are made contiguous
// first; contiguous arrays are processed in blocks of kBlock elements, OpenMP-parallel over
// blocks (rows: blocks of rows), handed out dynamically (a thread slowed by another process
// takes fewer blocks instead of making the others wait at the join; every element's result is
// independent of which thread computes it).
// f32 runs Eigen's packet math (cpu/vec.h; the same exp as the silu / silu_backward kernels in
// pointwise_kernels.cpp), one register pass per packet, the tail padded to a full packet so
// every element takes the same path wherever a block (or a shard) ends; f64 the scalar std::
// expressions.
//   silu:      s = 1 / (1 + exp(-x)), act = x * s, act' = s * (x * (1 - s) + 1)
//   gelu tanh: 0.5 x (1 + tanh(u)) with u = k (x + a x^3), k = sqrt(2 / pi), a = 0.044715, is
//              x * sigmoid(2u) (1 + tanh(u) = 2 sigmoid(2u)): v = x (2k + 2ka x^2),
//              s = 1 / (1 + exp(-v)), act = x * s, act' = s * (x * (1 - s) * (2k + 6ka x^2) + 1).
//              One exp per element (no tanh), and no cancellation in 1 + tanh(u) for x < 0.
//   exp overflows to inf for -x (silu) or -v (gelu) above 88 (f32), giving s = 0 and act = -0,
//   the limit; no NaN for finite inputs.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/swiglu_rows.h"
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
#pragma omp parallel for schedule(dynamic) if (n >= cpu::kParallelGrain)
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

/// silu: act(x) = x * sigmoid(x); grad() gives act(x) and act'(x) (see the file comment).
struct Silu {
  template <class T>
  static T act(T x) {
    return x / (T(1) + std::exp(-x));
  }
  template <class T>
  static void grad(T x, T& a, T& da) {
    const T s = T(1) / (T(1) + std::exp(-x));
    a = x * s;
    da = s * (x * (T(1) - s) + T(1));
  }
  using P = cpu::vec::detail::Packet;
  static P act_packet(const P& x) {
    using namespace Eigen::internal;
    return pdiv(x, padd(pset1<P>(1.0f), pexp(pnegate(x))));
  }
  static void grad_packet(const P& x, P& a, P& da) {
    using namespace Eigen::internal;
    const P one = pset1<P>(1.0f), s = pdiv(one, padd(one, pexp(pnegate(x))));
    a = pmul(x, s);
    da = pmul(s, padd(pmul(x, psub(one, s)), one));
  }
};

/// gelu, tanh approximation (PyTorch gelu(approximate='tanh'), HF gelu_pytorch_tanh) in the
/// sigmoid form of the file comment.
struct GeluTanh {
  static constexpr double kC1 = 1.5957691216057307117;     // 2 sqrt(2 / pi)
  static constexpr double kC3 = 0.071354816272869213275;   // 2 sqrt(2 / pi) * 0.044715
  template <class T>
  static T act(T x) {
    return x / (T(1) + std::exp(-(x * (T(kC1) + T(kC3) * x * x))));
  }
  template <class T>
  static void grad(T x, T& a, T& da) {
    const T x2 = x * x, s = T(1) / (T(1) + std::exp(-(x * (T(kC1) + T(kC3) * x2))));
    a = x * s;
    da = s * (x * (T(1) - s) * (T(kC1) + T(3 * kC3) * x2) + T(1));
  }
  using P = cpu::vec::detail::Packet;
  static P act_packet(const P& x) {
    using namespace Eigen::internal;
    const P v = pmul(x, padd(pset1<P>(static_cast<float>(kC1)), pmul(pset1<P>(static_cast<float>(kC3)), pmul(x, x))));
    return pdiv(x, padd(pset1<P>(1.0f), pexp(pnegate(v))));
  }
  static void grad_packet(const P& x, P& a, P& da) {
    using namespace Eigen::internal;
    const P one = pset1<P>(1.0f), c1 = pset1<P>(static_cast<float>(kC1)), x2 = pmul(x, x);
    const P v = pmul(x, padd(c1, pmul(pset1<P>(static_cast<float>(kC3)), x2)));
    const P s = pdiv(one, padd(one, pexp(pnegate(v))));
    a = pmul(x, s);
    const P dv = padd(c1, pmul(pset1<P>(static_cast<float>(3 * kC3)), x2));
    da = pmul(s, padd(pmul(pmul(x, psub(one, s)), dv), one));
  }
};

/// act(x) * u over the contiguous segment [0, len) of x, u -> o.
template <class Act, class T>
void glu_segment(const T* px, const T* pu, T* po, int64_t len) {
  if constexpr (std::is_same_v<T, float>) {
    using namespace Eigen::internal;
    using P = cpu::vec::detail::Packet;
    packet_loop<2, 1>({px, pu}, {po}, 0, len, [&](const auto& in, const auto& o) {
      pstoreu(o[0], pmul(Act::act_packet(ploadu<P>(in[0])), ploadu<P>(in[1])));
    });
  } else {
    for (int64_t i = 0; i < len; ++i) po[i] = Act::act(px[i]) * pu[i];
  }
}

/// {dgate, dup} = {g * u * act'(x), g * act(x)} of g, x (gate), u (up) over the contiguous
/// segment [0, len).
template <class Act, class T>
void glu_backward_segment(const T* pg, const T* px, const T* pu, T* pdx, T* pdu, int64_t len) {
  if constexpr (std::is_same_v<T, float>) {
    using namespace Eigen::internal;
    using P = cpu::vec::detail::Packet;
    packet_loop<3, 2>({pg, px, pu}, {pdx, pdu}, 0, len, [&](const auto& in, const auto& o) {
      const P gv = ploadu<P>(in[0]), u = ploadu<P>(in[2]);
      P a, da;
      Act::grad_packet(ploadu<P>(in[1]), a, da);
      pstoreu(o[1], pmul(gv, a));
      pstoreu(o[0], pmul(pmul(gv, u), da));
    });
  } else {
    for (int64_t i = 0; i < len; ++i) {
      T a, da;
      Act::grad(px[i], a, da);
      pdu[i] = pg[i] * a;
      pdx[i] = pg[i] * pu[i] * da;
    }
  }
}

/// The row stride of t when it is rows of contiguous last-dim elements (leading dims collapsing
/// into one stride, e.g. a narrow of the last dim), else -1.
int64_t row_stride(const Tensor& t) {
  const int64_t d = t.dim();
  if (d < 2 || t.stride(d - 1) != 1) return -1;
  for (int64_t i = 0; i + 2 < d; ++i)
    if (t.stride(i) != t.stride(i + 1) * t.size(i + 1)) return -1;
  return t.stride(d - 2);
}

/// Calls f(r0, r1) for blocks of rows of [0, R) (rows of C elements), in parallel when large.
template <class F>
void for_row_blocks(int64_t R, int64_t C, F f) {
  const int64_t per = std::max<int64_t>(1, kBlock / std::max<int64_t>(C, 1)), nb = (R + per - 1) / per;
#pragma omp parallel for schedule(dynamic) if (R * C >= cpu::kParallelGrain)
  for (int64_t b = 0; b < nb; ++b) f(b * per, std::min(R, (b + 1) * per));
}

/// {gate, up} -> act(gate) * up.
template <class Act>
std::vector<Tensor> k_glu(const OpCall& c) {
  check_inputs(c);
  const Tensor& g0 = c.inputs[0];
  const Tensor& u0 = c.inputs[1];
  Tensor out = empty(g0.sizes(), TensorOptions(g0.dtype()));
  // Rows read in place (the halves of a joined [.., 2I] gate_up: no copies), else contiguous.
  const int64_t gs = row_stride(g0), us = row_stride(u0);
  const bool rows = !(g0.is_contiguous() && u0.is_contiguous()) && gs > 0 && us > 0;
  const Tensor gate = rows ? g0 : contig(g0), up = rows ? u0 : contig(u0);
  const int64_t n = gate.numel();
  cpu::dispatch_floating(gate.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(gate.data_ptr());
    const T* pu = static_cast<const T*>(up.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (rows) {
      const int64_t C = gate.size(-1), R = n / std::max<int64_t>(C, 1);
      for_row_blocks(R, C, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) glu_segment<Act, T>(px + r * gs, pu + r * us, po + r * C, C);
      });
    } else {
      for_blocks(n, [&](int64_t off, int64_t len) { glu_segment<Act, T>(px + off, pu + off, po + off, len); });
    }
  });
  return {out};
}

/// {g, gate, up} -> {dgate, dup}.
template <class Act>
std::vector<Tensor> k_glu_backward(const OpCall& c) {
  check_inputs(c);
  const Tensor g = contig(c.inputs[0]), gate = contig(c.inputs[1]), up = contig(c.inputs[2]);
  Tensor dgate = empty(gate.sizes(), TensorOptions(gate.dtype()));
  Tensor dup = empty(gate.sizes(), TensorOptions(gate.dtype()));
  const int64_t n = gate.numel();
  cpu::dispatch_floating(gate.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(gate.data_ptr());
    const T* pu = static_cast<const T*>(up.data_ptr());
    T* pdx = static_cast<T*>(dgate.data_ptr());
    T* pdu = static_cast<T*>(dup.data_ptr());
    for_blocks(n, [&](int64_t off, int64_t len) {
      glu_backward_segment<Act, T>(pg + off, px + off, pu + off, pdx + off, pdu + off, len);
    });
  });
  return {dgate, dup};
}

/// {g [.., I], gate_up [.., 2I]} -> d [.., 2I] (dgate then dup per row): the gradient of the
/// joined swiglu(gate_up) in one pass, reading the halves in place.
std::vector<Tensor> k_swiglu_joined_backward(const OpCall& c) {
  const Tensor g = contig(c.inputs[0]), gu = contig(c.inputs[1]);
  const int64_t I = g.dim() > 0 ? g.size(-1) : 0;
  DTR_CHECK(gu.dim() == g.dim() && gu.size(-1) == 2 * I && gu.numel() == 2 * g.numel() && gu.dtype() == g.dtype(),
            "swiglu_joined_backward: gradient ", g.sizes(), " ", g.dtype(), " and gate_up ", gu.sizes(), " ",
            gu.dtype(), " (expected [.., I] and [.., 2I] of one dtype)");
  Tensor d = empty(gu.sizes(), TensorOptions(gu.dtype()));
  const int64_t R = I > 0 ? g.numel() / I : 0;
  cpu::dispatch_floating(g.dtype(), "swiglu_joined_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(gu.data_ptr());
    T* pd = static_cast<T*>(d.data_ptr());
    for_row_blocks(R, 2 * I, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        glu_backward_segment<Silu, T>(pg + r * I, px + r * 2 * I, px + r * 2 * I + I, pd + r * 2 * I, pd + r * 2 * I + I,
                                   I);
    });
  });
  return {d};
}

/// The rows of gate_up [R, 2I] (gate half, then up half) and w [R] of a weighted swiglu call,
/// checked (I > 0); gate_up and w contiguous, I, R.
struct WeightedRows {
  Tensor gu, w;
  int64_t I, R;
};
WeightedRows weighted_rows(const Tensor& gate_up, const Tensor& w, const char* op) {
  const int64_t d = gate_up.dim();
  DTR_CHECK(d >= 1 && gate_up.size(-1) > 0 && gate_up.size(-1) % 2 == 0 && w.dtype() == gate_up.dtype() && w.dim() == d - 1 &&
                Shape(gate_up.sizes().begin(), gate_up.sizes().end() - 1) == w.sizes(),
            op, ": gate_up ", gate_up.sizes(), " ", gate_up.dtype(), " and weights ", w.sizes(), " ", w.dtype(),
            " (expected [.., 2I], I > 0, and its leading dims, one dtype)");
  const int64_t I = gate_up.size(-1) / 2;
  return {contig(gate_up), contig(w), I, gate_up.numel() / (2 * I)};
}

}  // namespace

template <class T>
void cpu::swiglu_weighted_rows(const T* gu, const T* w, T* h, int64_t r0, int64_t r1, int64_t I) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = gu + r * 2 * I;
    T* o = h + r * I;
    if constexpr (std::is_same_v<T, float>) {
      using namespace Eigen::internal;
      using P = cpu::vec::detail::Packet;
      const P wv = pset1<P>(w[r]);
      packet_loop<2, 1>({x, x + I}, {o}, 0, I, [&](const auto& i, const auto& q) {
        pstoreu(q[0], pmul(pmul(Silu::act_packet(ploadu<P>(i[0])), ploadu<P>(i[1])), wv));
      });
    } else {
      for (int64_t j = 0; j < I; ++j) o[j] = Silu::act(x[j]) * x[I + j] * w[r];
    }
  }
}
template void cpu::swiglu_weighted_rows<float>(const float*, const float*, float*, int64_t, int64_t, int64_t);
template void cpu::swiglu_weighted_rows<double>(const double*, const double*, double*, int64_t, int64_t, int64_t);

namespace {

/// {gate_up [.., 2I], w [..]} -> w * silu(gate) * up [.., I] (row r scaled by w[r]).
std::vector<Tensor> k_swiglu_weighted(const OpCall& c) {
  const WeightedRows in = weighted_rows(c.inputs[0], c.inputs[1], "swiglu_weighted");
  Shape os = in.gu.sizes();
  os.back() = in.I;
  Tensor out = empty(os, TensorOptions(in.gu.dtype()));
  const int64_t I = in.I;
  cpu::dispatch_floating(in.gu.dtype(), "swiglu_weighted", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(in.gu.data_ptr());
    const T* pw = static_cast<const T*>(in.w.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    for_row_blocks(in.R, 2 * I, [&](int64_t r0, int64_t r1) { cpu::swiglu_weighted_rows<T>(px, pw, po, r0, r1, I); });
  });
  return {out};
}

/// {g [.., I], gate_up [.., 2I], w [..]} -> {d gate_up [.., 2I], dw [..]}: with gw = g * w[r],
/// dgate = gw * up * silu'(gate), dup = gw * silu(gate) (the swiglu gradient of gw), and
/// dw[r] = sum_j g[r, j] * silu(gate[r, j]) * up[r, j] (one row's sum in a fixed lane order).
std::vector<Tensor> k_swiglu_weighted_backward(const OpCall& c) {
  const WeightedRows in = weighted_rows(c.inputs[1], c.inputs[2], "swiglu_weighted_backward");
  const Tensor g = contig(c.inputs[0]);
  const int64_t I = in.I;
  DTR_CHECK(g.dtype() == in.gu.dtype() && g.numel() == in.R * I && g.dim() == in.gu.dim() && g.size(-1) == I,
            "swiglu_weighted_backward: gradient ", g.sizes(), " (expected [.., ", I, "])");
  Tensor d = empty(in.gu.sizes(), TensorOptions(in.gu.dtype())), dw = empty(in.w.sizes(), TensorOptions(in.w.dtype()));
  cpu::dispatch_floating(g.dtype(), "swiglu_weighted_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(in.gu.data_ptr());
    const T* pw = static_cast<const T*>(in.w.data_ptr());
    T* pd = static_cast<T*>(d.data_ptr());
    T* pdw = static_cast<T*>(dw.data_ptr());
    for_row_blocks(in.R, 2 * I, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* gr = pg + r * I;
        const T* x = px + r * 2 * I;
        T* dr = pd + r * 2 * I;
        if constexpr (std::is_same_v<T, float>) {
          using namespace Eigen::internal;
          using P = cpu::vec::detail::Packet;
          const P wv = pset1<P>(pw[r]);
          P acc = pset1<P>(0.0f);
          // Tail lanes are zero-padded: g = 0 there adds nothing to the sum.
          packet_loop<3, 2>({gr, x, x + I}, {dr, dr + I}, 0, I, [&](const auto& i, const auto& o) {
            const P gv = ploadu<P>(i[0]), u = ploadu<P>(i[2]), gw = pmul(gv, wv);
            P a, da;
            Silu::grad_packet(ploadu<P>(i[1]), a, da);
            pstoreu(o[1], pmul(gw, a));
            pstoreu(o[0], pmul(pmul(gw, u), da));
            acc = padd(acc, pmul(gv, pmul(a, u)));
          });
          pdw[r] = predux(acc);
        } else {
          T acc = 0;
          for (int64_t j = 0; j < I; ++j) {
            T a, da;
            Silu::grad(x[j], a, da);
            const T gw = gr[j] * pw[r];
            dr[I + j] = gw * a;
            dr[j] = gw * x[I + j] * da;
            acc += gr[j] * (a * x[I + j]);
          }
          pdw[r] = acc;
        }
      }
    });
  });
  return {d, dw};
}

DTR_REGISTER_KERNEL("swiglu", DeviceType::CPU, k_glu<Silu>);
DTR_REGISTER_KERNEL("swiglu_backward", DeviceType::CPU, k_glu_backward<Silu>);
DTR_REGISTER_KERNEL("geglu", DeviceType::CPU, k_glu<GeluTanh>);
DTR_REGISTER_KERNEL("geglu_backward", DeviceType::CPU, k_glu_backward<GeluTanh>);
DTR_REGISTER_KERNEL("swiglu_joined_backward", DeviceType::CPU, k_swiglu_joined_backward);
DTR_REGISTER_KERNEL("swiglu_weighted", DeviceType::CPU, k_swiglu_weighted);
DTR_REGISTER_KERNEL("swiglu_weighted_backward", DeviceType::CPU, k_swiglu_weighted_backward);

}  // namespace
}  // namespace dtr
