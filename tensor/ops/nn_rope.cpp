// Rotary position embedding, Hugging Face rotate-half layout.
//   rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
//   out = x * cos + rotate_half(x) * sin
//   dx  = g * cos + rotate_half^T(g * sin),  rotate_half^T(u) = cat(u[..., D/2:], -u[..., :D/2])
// Source: Su et al. 2021 (RoFormer); HF LlamaRotaryEmbedding / apply_rotary_pos_emb.
#include <algorithm>
#include <cmath>

#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {
namespace {
Tensor rotate_half(const Tensor& x) {
  const int64_t h = x.sizes().back() / 2;
  return cat({neg(narrow(x, -1, h, h)), narrow(x, -1, 0, h)}, -1);
}
}  // namespace

std::pair<Tensor, Tensor> rope_tables(int64_t T, int64_t D, double theta, int64_t pos0, DType dt) {
  DTR_CHECK(T >= 0 && D > 0 && D % 2 == 0, "rope_tables: need T >= 0 and an even head dim D > 0, got T=", T, " D=", D);
  DTR_CHECK(theta > 0, "rope_tables: theta must be > 0, got ", theta);
  DTR_CHECK(is_floating(dt), "rope_tables: dtype must be floating, got ", dt);
  const int64_t h = D / 2;
  std::vector<double> c(static_cast<size_t>(T * D)), s(static_cast<size_t>(T * D));
  if (dt == DType::f64) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < h; ++i) {
        const double f = static_cast<double>(pos0 + t) / std::pow(theta, 2.0 * i / D);
        c[t * D + i] = c[t * D + i + h] = std::cos(f);
        s[t * D + i] = s[t * D + i + h] = std::sin(f);
      }
  } else {
    // f32 arithmetic exactly like HF: inv_freq = 1 / theta^(arange(0, D, 2) / D) in f32,
    // freqs = pos * inv_freq in f32, cos/sin in f32, then cast to dt.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < h; ++i) {
        const float inv = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(D));
        const float f = static_cast<float>(pos0 + t) * inv;
        c[t * D + i] = c[t * D + i + h] = std::cos(f);
        s[t * D + i] = s[t * D + i + h] = std::sin(f);
      }
  }
  Tensor ct = from_vector<double>(c, {T, D}), st = from_vector<double>(s, {T, D});
  return {to_dtype(ct, dt), to_dtype(st, dt)};
}

std::pair<Tensor, Tensor> rope_tables(const Tensor& position_ids, int64_t D, double theta, DType dt) {
  DTR_CHECK(position_ids.dim() == 2 && position_ids.dtype() == DType::i64,
            "rope_tables: position_ids must be int64 [B, T], got ", position_ids.dtype(), " ", position_ids.sizes());
  const Tensor pos = position_ids.device().is_cpu() ? position_ids.detach() : to_device(position_ids, Device::cpu());
  int64_t n = 0;  // positions 0 .. n - 1 are needed
  for (int64_t p : pos.to_vector<int64_t>()) {
    DTR_CHECK(p >= 0, "rope_tables: position_ids must be >= 0, got ", p);
    n = std::max(n, p + 1);
  }
  auto [c, s] = rope_tables(n, D, theta, 0, dt);  // [n, D]
  c = unsqueeze(embedding(pos, c), 1);           // [B, 1, T, D]
  s = unsqueeze(embedding(pos, s), 1);
  if (!position_ids.device().is_cpu()) {
    c = to_device(c, position_ids.device());
    s = to_device(s, position_ids.device());
  }
  return {c, s};
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  DTR_CHECK(x.dim() >= 1 && x.sizes().back() % 2 == 0, "rotary_embedding: x must be [..., D] with D even, got ",
            x.sizes());
  DTR_CHECK(cos.sizes() == sin.sizes(), "rotary_embedding: cos ", cos.sizes(), " and sin ", sin.sizes(), " differ");
  DTR_CHECK(cos.dim() >= 1 && cos.dim() <= x.dim() && cos.sizes().back() == x.sizes().back(),
            "rotary_embedding: cos/sin ", cos.sizes(), " do not broadcast to x ", x.sizes());
  for (int64_t i = 1; i <= cos.dim(); ++i) {
    const int64_t a = cos.sizes()[cos.dim() - i], b = x.sizes()[x.dim() - i];
    DTR_CHECK(a == b || a == 1, "rotary_embedding: cos/sin ", cos.sizes(), " do not broadcast to x ", x.sizes());
  }
  DTR_CHECK(x.dtype() == cos.dtype() && x.dtype() == sin.dtype(), "rotary_embedding: dtype mismatch: x ", x.dtype(),
            ", cos ", cos.dtype(), ", sin ", sin.dtype());
  static const OpDef* op = op_def("rotary_embedding");
  Tensor out = dispatch1(OpCall{op, {x, cos, sin}, {}});
  if (needs_grad({x, cos, sin})) {
    const bool table_grad = cos.requires_grad() || sin.requires_grad();
    record("rotary_embedding", {x, cos, sin}, out,
           [sx = table_grad ? SavedTensor(x) : SavedTensor(), sc = SavedTensor(cos), ss = SavedTensor(sin)](
               const std::vector<Tensor>& g, const std::vector<bool>& n) {
             static const OpDef* bw = op_def("rotary_embedding_backward");
             const char* nm = "rotary_embedding";
             Tensor c = sc.get(nm), s = ss.get(nm);
             std::vector<Tensor> r(3);
             if (n[0]) r[0] = dispatch1(OpCall{bw, {g[0], c, s}, {}});
             if (n[1]) r[1] = sum_to(mul(g[0], sx.get(nm)), c.sizes());
             if (n[2]) r[2] = sum_to(mul(g[0], rotate_half(sx.get(nm))), s.sizes());
             return r;
           });
  }
  return out;
}

}  // namespace dtr
