// CPU kernels of moe_permute, moe_permute_backward, moe_unpermute and moe_unpermute_backward
// (see ops/moe_permute.h): OpenMP over tokens, each token's k rows in order j = 0..k-1, so results do
// not depend on the thread count; every output element is written once (no zero fill, no
// atomics: slot_position is a permutation, so each sorted row belongs to exactly one slot). The
// threads take chunks of kChunkTokens tokens in turn (schedule dynamic), so a thread slowed by
// another process takes fewer instead of making the others wait at the join.
#include <algorithm>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/stream_store.h"

namespace dtr {
namespace {

/// Tokens per chunk of the dynamic schedule (2048 tokens: 32 chunks).
constexpr int64_t kChunkTokens = 64;

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

/// slot_position as a vector, checked to be a permutation of [0, rows).
std::vector<int64_t> positions(const Tensor& pos, int64_t rows, const char* op) {
  std::vector<int64_t> v = contig(pos).to_vector<int64_t>();
  DTR_CHECK(static_cast<int64_t>(v.size()) == rows, op, ": ", v.size(), " slot positions for ", rows, " rows");
  std::vector<char> seen(rows, 0);
  for (size_t i = 0; i < v.size(); ++i) {
    DTR_CHECK(v[i] >= 0 && v[i] < rows && !seen[v[i]], op, ": slot_position[", i, "] = ", v[i],
              " is out of range [0, ", rows, ") or repeated (expected a permutation)");
    seen[v[i]] = 1;
  }
  return v;
}

/// x [N, H], slot_position [N*k], attrs {k} -> [N*k, H]: row pos[t*k + j] = x[t]. Token-major
/// (each x row read once, its k copies written to their sorted rows), where a gather in sorted
/// order (embedding) sweeps the whole of x once per expert; an f32 output of
/// kStreamOutputBytes or more is written with non-temporal stores (cpu/stream_store.h).
std::vector<Tensor> k_moe_permute(const OpCall& c) {
  const Tensor x = contig(c.inputs[0]);
  DTR_CHECK(x.dim() == 2, "moe_permute: x ", x.sizes(), " (expected [N, H])");
  const int64_t k = c.i(0), N = x.size(0), H = x.size(1), M = N * k;
  const std::vector<int64_t> pos = positions(c.inputs[1], M, "moe_permute");
  Tensor out = empty({M, H}, TensorOptions(x.dtype()));
  const bool stream = static_cast<int64_t>(out.nbytes()) >= cpu::kStreamOutputBytes;
  cpu::dispatch_floating(x.dtype(), "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel if (M * H >= cpu::kParallelGrain)
    {
#pragma omp for schedule(dynamic, kChunkTokens) nowait
      for (int64_t t = 0; t < N; ++t) {
        const T* r = px + t * H;
        for (int64_t j = 0; j < k; ++j) {
          T* o = po + pos[t * k + j] * H;
          if constexpr (std::is_same_v<T, float>)
            cpu::copy_floats(o, r, H, stream);
          else
            std::copy(r, r + H, o);
        }
      }
      if (stream) cpu::stream_fence();
    }
  });
  return {out};
}

/// g [N*k, H], slot_position [N*k], attrs {k} -> dx [N, H]: dx[t] = sum_j g[pos[t*k + j]].
std::vector<Tensor> k_moe_permute_backward(const OpCall& c) {
  const Tensor g = contig(c.inputs[0]);
  const int64_t k = c.i(0);
  DTR_CHECK(k > 0 && g.dim() == 2 && g.size(0) % k == 0, "moe_permute_backward: gradient ", g.sizes(), " (expected [N*",
            k, ", H] with k > 0)");
  const int64_t M = g.size(0), H = g.size(1), N = M / k;
  const std::vector<int64_t> pos = positions(c.inputs[1], M, "moe_permute_backward");
  Tensor dx = empty({N, H}, TensorOptions(g.dtype()));
  cpu::dispatch_floating(g.dtype(), "moe_permute_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* po = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for schedule(dynamic, kChunkTokens) if (M * H >= cpu::kParallelGrain)
    for (int64_t t = 0; t < N; ++t) {
      T* o = po + t * H;
      const T* r0 = pg + pos[t * k] * H;
      std::copy(r0, r0 + H, o);
      for (int64_t j = 1; j < k; ++j) {
        const T* r = pg + pos[t * k + j] * H;
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) o[h] += r[h];
      }
    }
  });
  return {dx};
}

/// ys [N*k, H], slot_position [N*k], probs [N, k] -> out [N, H].
std::vector<Tensor> k_moe_unpermute(const OpCall& c) {
  const Tensor ys = contig(c.inputs[0]), probs = contig(c.inputs[2]);
  const int64_t M = ys.size(0), H = ys.size(1), N = probs.size(0), k = probs.size(1);
  const std::vector<int64_t> pos = positions(c.inputs[1], M, "moe_unpermute");
  Tensor out = empty({N, H}, TensorOptions(ys.dtype()));
  cpu::dispatch_floating(ys.dtype(), "moe_unpermute", [&](auto tag) {
    using T = decltype(tag);
    const T* py = static_cast<const T*>(ys.data_ptr());
    const T* pp = static_cast<const T*>(probs.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(dynamic, kChunkTokens) if (M * H >= cpu::kParallelGrain)
    for (int64_t t = 0; t < N; ++t) {
      T* o = po + t * H;
      const T* r0 = py + pos[t * k] * H;
      const T w0 = pp[t * k];
#pragma omp simd
      for (int64_t h = 0; h < H; ++h) o[h] = w0 * r0[h];
      for (int64_t j = 1; j < k; ++j) {
        const T* r = py + pos[t * k + j] * H;
        const T w = pp[t * k + j];
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) o[h] += w * r[h];
      }
    }
  });
  return {out};
}

/// g [N, H], ys [N*k, H], slot_position [N*k], probs [N, k] -> {dys [N*k, H], dprobs [N, k]}.
std::vector<Tensor> k_moe_unpermute_backward(const OpCall& c) {
  const Tensor g = contig(c.inputs[0]), ys = contig(c.inputs[1]), probs = contig(c.inputs[3]);
  const int64_t M = ys.size(0), H = ys.size(1), N = probs.size(0), k = probs.size(1);
  DTR_CHECK(g.dim() == 2 && g.size(0) == N && g.size(1) == H, "moe_unpermute_backward: gradient ", g.sizes(),
            " (expected [", N, ", ", H, "])");
  const std::vector<int64_t> pos = positions(c.inputs[2], M, "moe_unpermute_backward");
  Tensor dys = empty({M, H}, TensorOptions(ys.dtype())), dprobs = empty({N, k}, TensorOptions(ys.dtype()));
  cpu::dispatch_floating(ys.dtype(), "moe_unpermute_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* py = static_cast<const T*>(ys.data_ptr());
    const T* pp = static_cast<const T*>(probs.data_ptr());
    T* pdy = static_cast<T*>(dys.data_ptr());
    T* pdp = static_cast<T*>(dprobs.data_ptr());
#pragma omp parallel for schedule(dynamic, kChunkTokens) if (M * H >= cpu::kParallelGrain)
    for (int64_t t = 0; t < N; ++t) {
      const T* gr = pg + t * H;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = pos[t * k + j];
        const T* r = py + p * H;
        T* d = pdy + p * H;
        const T w = pp[t * k + j];
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t h = 0; h < H; ++h) {
          d[h] = w * gr[h];
          dot += gr[h] * r[h];
        }
        pdp[t * k + j] = dot;
      }
    }
  });
  return {dys, dprobs};
}

DTR_REGISTER_KERNEL("moe_permute", DeviceType::CPU, k_moe_permute);
DTR_REGISTER_KERNEL("moe_permute_backward", DeviceType::CPU, k_moe_permute_backward);
DTR_REGISTER_KERNEL("moe_unpermute", DeviceType::CPU, k_moe_unpermute);
DTR_REGISTER_KERNEL("moe_unpermute_backward", DeviceType::CPU, k_moe_unpermute_backward);

}  // namespace
}  // namespace dtr
