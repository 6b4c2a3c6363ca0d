#pragma once
// The ops a property-test chain draws from (every family with a sharding rule) and the runner
// that compares a chain's distributed result with the single process. Included by
// property_chain.h.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "tensor/ops/shape.h"
#include "tensor/random.h"

namespace dtr::testing::property {

namespace detail_ops {

inline Shape reduce_dims(Rng& r, int64_t nd) {
  Shape dims;
  for (int64_t d = 0; d < nd; ++d)
    if (coin(r, 0.4)) dims.push_back(d);
  return dims;  // empty: all dims
}

/// A reshape target of `s`: merge two adjacent dims, split a dim, add or drop unit dims, or flatten.
inline Shape reshape_target(Rng& r, const Shape& s) {
  Shape t = s;
  const int64_t nd = static_cast<int64_t>(s.size());
  switch (uni(r, 0, 4)) {
    case 0:
      if (nd >= 2) {
        const int64_t d = uni(r, 0, nd - 2);
        t[d] *= t[d + 1];
        t.erase(t.begin() + d + 1);
      }
      break;
    case 1: {
      for (int64_t d = 0; d < nd; ++d)
        for (int64_t f : {2, 3})
          if (t[d] % f == 0 && t[d] > f) {
            t[d] /= f;
            t.insert(t.begin() + d + 1, f);
            return t;
          }
      break;
    }
    case 2: t.insert(t.begin() + uni(r, 0, nd), 1); break;
    case 3: {
      for (int64_t d = 0; d < nd; ++d)
        if (t[d] == 1) {
          t.erase(t.begin() + d);
          return t;
        }
      break;
    }
    default: t = {shape_numel(s)};
  }
  return t;
}

}  // namespace detail_ops

inline bool add_random_step(Chain& c, Rng& r, const DeviceMesh& mesh) {
  using namespace detail_ops;
  const Shape s = c.cur;
  const int64_t nd = static_cast<int64_t>(s.size());
  auto push = [&](std::string d, Step st, Shape out) {
    c.desc.push_back(std::move(d));
    c.steps.push_back(std::move(st));
    c.cur = std::move(out);
    return true;
  };
  switch (uni(r, 0, 23)) {
    case 0: {  // unary
      const int64_t k = uni(r, 0, 5);
      const char* names[] = {"tanh", "sigmoid", "silu", "neg", "exp", "relu"};
      return push(names[k], [k](const Tensor& x, const auto&) {
        switch (k) {
          case 0: return tanh(x);
          case 1: return sigmoid(x);
          case 2: return silu(x);
          case 3: return neg(x);
          case 4: return exp(tanh(x));
          default: return relu(x);
        }
      }, s);
    }
    case 1: {  // scalar ops (scalar-plus-Partial must add the scalar once)
      const int64_t k = uni(r, 0, 4);
      const double v = static_cast<double>(uni(r, 1, 9)) / 4.0;
      const char* names[] = {"add_scalar", "mul_scalar", "rsub_scalar", "div_scalar", "pow2"};
      return push(std::string(names[k]) + "(" + std::to_string(v) + ")", [k, v](const Tensor& x, const auto&) {
        switch (k) {
          case 0: return add(x, v);
          case 1: return mul(x, v);
          case 2: return rsub(x, v);
          case 3: return div(x, v);
          default: return pow(x, 2.0);
        }
      }, s);
    }
    case 2:
    case 3: {  // binary pointwise with broadcasting
      const Shape b = broadcastable(r, s);
      const int64_t k = uni(r, 0, 4);
      const bool swap = coin(r) && k != 3;
      const size_t j = add_input(c, r, mesh, b, k == 3 ? 1.0 : -1.0, k == 3 ? 2.0 : 1.0);
      const char* names[] = {"add", "sub", "mul", "div", "maximum"};
      return push(std::string(names[k]) + (swap ? "(in" : "(x, in") + std::to_string(j) + (swap ? ", x)" : ")"),
                  [k, j, swap](const Tensor& x, const std::vector<Tensor>& in) {
                    const Tensor& a = swap ? in[j] : x;
                    const Tensor& y = swap ? x : in[j];
                    switch (k) {
                      case 0: return add(a, y);
                      case 1: return sub(a, y);
                      case 2: return mul(a, y);
                      case 3: return div(a, y);
                      default: return maximum(a, y);
                    }
                  },
                  broadcast_shapes(s, b, "property"));
    }
    case 4: {  // mm
      if (nd != 2) return false;
      const int64_t n = uni(r, 1, 5);
      if (coin(r)) {
        const size_t j = add_input(c, r, mesh, {s[1], n});
        return push("mm(x, in" + std::to_string(j) + ")",
                    [j](const Tensor& x, const std::vector<Tensor>& in) { return mm(x, in[j]); }, {s[0], n});
      }
      const size_t j = add_input(c, r, mesh, {n, s[0]});
      return push("mm(in" + std::to_string(j) + ", x)",
                  [j](const Tensor& x, const std::vector<Tensor>& in) { return mm(in[j], x); }, {n, s[1]});
    }
    case 5: {  // bmm / linear
      const int64_t n = uni(r, 1, 5);
      if (nd == 3 && coin(r)) {
        const size_t j = add_input(c, r, mesh, {s[0], s[2], n});
        return push("bmm(x, in" + std::to_string(j) + ")",
                    [j](const Tensor& x, const std::vector<Tensor>& in) { return bmm(x, in[j]); }, {s[0], s[1], n});
      }
      if (nd < 1) return false;
      const size_t j = add_input(c, r, mesh, {n, s.back()});
      const bool bias = coin(r);
      const size_t jb = bias ? add_input(c, r, mesh, {n}) : j;
      Shape out = s;
      out.back() = n;
      return push("linear(x, in" + std::to_string(j) + (bias ? ", in" + std::to_string(jb) : "") + ")",
                  [j, jb, bias](const Tensor& x, const std::vector<Tensor>& in) {
                    return linear(x, in[j], bias ? in[jb] : Tensor());
                  },
                  out);
    }
    case 6:
    case 7: {  // sum / mean / amax with keepdim
      const Shape dims = reduce_dims(r, nd);
      const bool keep = coin(r);
      const int64_t k = uni(r, 0, 2);
      const char* names[] = {"sum", "mean", "amax"};
      return push(std::string(names[k]) + "(" + detail::cat(dims) + (keep ? ", keepdim)" : ")"),
                  [k, dims, keep](const Tensor& x, const auto&) {
                    return k == 0 ? sum(x, dims, keep) : (k == 1 ? mean(x, dims, keep) : amax(x, dims, keep));
                  },
                  reduced_shape(s, reduction_dims(dims, nd, "property"), keep));
    }
    case 8: {  // max along a dim (values; indices drive the backward)
      if (nd < 1) return false;
      const int64_t d = uni(r, 0, nd - 1);
      const bool keep = coin(r);
      return push("max(" + std::to_string(d) + (keep ? ", keepdim)" : ")"),
                  [d, keep](const Tensor& x, const auto&) { return max(x, d, keep).first; },
                  reduced_shape(s, {d}, keep));
    }
    case 9: {  // softmax / log_softmax
      if (nd < 1) return false;
      const int64_t d = uni(r, 0, nd - 1);
      const bool lg = coin(r);
      return push(std::string(lg ? "log_softmax(" : "softmax(") + std::to_string(d) + ")",
                  [d, lg](const Tensor& x, const auto&) { return lg ? log_softmax(x, d) : softmax(x, d); }, s);
    }
    case 10: {  // reshape / view
      const Shape t = reshape_target(r, s);
      const bool strict = coin(r);
      return push(std::string(strict ? "view(" : "reshape(") + detail::cat(t) + ")",
                  [t, strict](const Tensor& x, const auto&) { return strict ? view(x, t) : reshape(x, t); }, t);
    }
    case 11: {  // unsqueeze / squeeze
      if (coin(r)) {
        const int64_t d = uni(r, 0, nd);
        Shape t = s;
        t.insert(t.begin() + d, 1);
        return push("unsqueeze(" + std::to_string(d) + ")",
                    [d](const Tensor& x, const auto&) { return unsqueeze(x, d); }, t);
      }
      for (int64_t d = 0; d < nd; ++d)
        if (s[d] == 1) {
          Shape t = s;
          t.erase(t.begin() + d);
          return push("squeeze(" + std::to_string(d) + ")",
                      [d](const Tensor& x, const auto&) { return squeeze(x, d); }, t);
        }
      return false;
    }
    case 12: {  // transpose / permute
      if (nd < 2) return false;
      if (coin(r)) {
        const int64_t a = uni(r, 0, nd - 1), b = uni(r, 0, nd - 1);
        Shape t = s;
        std::swap(t[a], t[b]);
        return push("transpose(" + std::to_string(a) + ", " + std::to_string(b) + ")",
                    [a, b](const Tensor& x, const auto&) { return transpose(x, a, b); }, t);
      }
      Shape perm(static_cast<size_t>(nd));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), r);
      Shape t(static_cast<size_t>(nd));
      for (int64_t i = 0; i < nd; ++i) t[i] = s[perm[i]];
      return push("permute(" + detail::cat(perm) + ")",
                  [perm](const Tensor& x, const auto&) { return permute(x, perm); }, t);
    }
    case 13: {  // narrow / expand
      if (nd < 1) return false;
      const int64_t d = uni(r, 0, nd - 1);
      if (s[d] == 1) {
        Shape t = s;
        t[d] = uni(r, 2, 4);
        return push("expand(" + detail::cat(t) + ")", [t](const Tensor& x, const auto&) { return expand(x, t); }, t);
      }
      const int64_t start = uni(r, 0, s[d] - 1), len = uni(r, 1, s[d] - start);
      Shape t = s;
      t[d] = len;
      return push("narrow(" + std::to_string(d) + ", " + std::to_string(start) + ", " + std::to_string(len) + ")",
                  [d, start, len](const Tensor& x, const auto&) { return narrow(x, d, start, len); }, t);
    }
    case 14: {  // embedding: the chain's 2-d value is the weight [V, D]
      if (nd != 2) return false;
      const Shape ids_shape = random_shape(r, 1, 2);
      const size_t j = add_ids(c, r, mesh, ids_shape, s[0], false);
      Shape t = ids_shape;
      t.push_back(s[1]);
      return push("embedding(in" + std::to_string(j) + ", x)",
                  [j](const Tensor& x, const std::vector<Tensor>& in) { return embedding(in[j], x); }, t);
    }
    case 15: {  // cross-entropy: the chain's 2-d value is the logits [N, C]
      if (nd != 2) return false;
      const size_t j = add_ids(c, r, mesh, {s[0]}, s[1], true);
      return push("cross_entropy(x, in" + std::to_string(j) + ")",
                  [j](const Tensor& x, const std::vector<Tensor>& in) { return cross_entropy(x, in[j]); }, {});
    }
    case 16:
    case 17: {  // redistribute to a random target (at run time, from the placements the rules chose)
      const uint64_t seed = r();
      return push("redistribute", [seed](const Tensor& x, const auto&) {
        return x.is_distributed() ? redistribute(x, redistribute_target(seed, dtensor_spec(x))) : x;
      }, s);
    }
    case 18: {  // rms_norm over the last dim with a weight input
      if (nd < 1) return false;
      const size_t j = add_input(c, r, mesh, {s.back()});
      return push("rms_norm(x, in" + std::to_string(j) + ")",
                  [j](const Tensor& x, const std::vector<Tensor>& in) { return rms_norm(x, in[j], 1e-6); }, s);
    }
    case 19: {  // cat with a new input along a random dim
      if (nd < 1) return false;
      const int64_t d = uni(r, 0, nd - 1);
      Shape b = s;
      b[d] = uni(r, 1, 3);
      const size_t j = add_input(c, r, mesh, b);
      Shape t = s;
      t[d] += b[d];
      const bool first = coin(r);
      return push("cat(" + std::to_string(d) + ", in" + std::to_string(j) + ")",
                  [d, j, first](const Tensor& x, const std::vector<Tensor>& in) {
                    return first ? cat({x, in[j]}, d) : cat({in[j], x}, d);
                  },
                  t);
    }
    case 20: {  // swiglu with a new input of the same shape
      const size_t j = add_input(c, r, mesh, s);
      return push("swiglu(x, in" + std::to_string(j) + ")",
                  [j](const Tensor& x, const std::vector<Tensor>& in) { return swiglu(x, in[j]); }, s);
    }
    case 21: {  // attention / RoPE on a 4-d value [B, H, T, D] (q = k = v = x, causal)
      if (nd != 4) return false;
      if (coin(r)) {
        const bool causal = coin(r);
        return push(std::string("sdpa(x, x, x") + (causal ? ", causal)" : ")"), [causal](const Tensor& x, const auto&) {
          return scaled_dot_product_attention(x, x, x, causal);
        }, s);
      }
      if (s[3] % 2) return false;
      const size_t jc = add_input(c, r, mesh, {s[2], s[3]});
      const size_t js = add_input(c, r, mesh, {s[2], s[3]});
      return push("rotary_embedding(x, in" + std::to_string(jc) + ", in" + std::to_string(js) + ")",
                  [jc, js](const Tensor& x, const std::vector<Tensor>& in) {
                    return rotary_embedding(x, in[jc], in[js]);
                  },
                  s);
    }
    case 22: {  // to 4-d for attention: unsqueeze / reshape of a smaller value
      if (nd >= 4) return false;
      Shape t = s;
      while (t.size() < 4) t.insert(t.begin(), 1);
      return push("reshape(" + detail::cat(t) + ")", [t](const Tensor& x, const auto&) { return reshape(x, t); }, t);
    }
    default: {  // dropout (the same Philox mask on every mesh: the runner reseeds both runs)
      return push("dropout(0.3)", [](const Tensor& x, const auto&) { return dropout(x, 0.3, true); }, s);
    }
  }
}

namespace detail_ops {
/// max |a - b| <= tol * (1 + max |b|); a NaN anywhere in one but not the other differs.
inline bool close(const Tensor& a, const Tensor& b, double& diff) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double scale = 1;
  diff = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i])) {
      diff = INFINITY;
      return false;
    }
    if (std::isnan(va[i])) continue;
    if (std::isinf(vb[i]) || std::isinf(va[i])) {
      if (va[i] != vb[i]) diff = INFINITY;
      continue;
    }
    scale = std::max(scale, std::abs(vb[i]));
    diff = std::max(diff, std::abs(va[i] - vb[i]));
  }
  return diff <= kPropertyRelTol * scale;
}
}  // namespace detail_ops

inline Outcome run_case(const Chain& c, const DeviceMesh& mesh, uint64_t seed, std::string& msg) {
  // Single process.
  std::vector<Tensor> a;
  for (const auto& t : c.fulls) a.push_back(t.detach().clone().set_requires_grad(is_floating(t.dtype())));
  Tensor ref, w;
  try {
    manual_seed(seed);
    ref = c.run(a);
    w = normal(ref.sizes(), 0.0, 1.0, TensorOptions(ref.dtype()));
    sum(mul(ref, w)).backward();
  } catch (const Error& e) {
    msg = e.what();
    return Outcome::invalid;  // the chain is not valid on one process either (e.g. view of a transposed tensor)
  }
  // Distributed.
  std::vector<Tensor> b;
  Tensor out;
  try {
    for (size_t i = 0; i < c.fulls.size(); ++i) {
      Tensor x = c.pls[i].empty() ? c.fulls[i].detach().clone() : make_input(c.fulls[i], mesh, c.pls[i]);
      if (is_floating(c.fulls[i].dtype())) x.set_requires_grad(true);
      b.push_back(x);
    }
    manual_seed(seed);
    out = c.run(b);
  } catch (const Error& e) {
    msg = e.what();
    // The one combination dtr (like PyTorch DTensor) refuses: a view that needs communication.
    if (msg.find("without communication") != std::string::npos && msg.find("use reshape") != std::string::npos)
      return Outcome::rejected;
    msg = "forward raised: " + msg;
    return Outcome::fail;
  }
  try {
    if (!out.is_distributed()) {
      msg = "output is not distributed";
      return Outcome::fail;
    }
    const Placements out_pl = placements(out);
    Tensor got = full_tensor(out);
    double diff = 0;
    if (got.sizes() != ref.sizes() || !detail_ops::close(got, ref.detach(), diff)) {
      msg = "forward differs (max diff " + std::to_string(diff) + ", output " + placements_str(out_pl) + ")";
      return Outcome::fail;
    }
    Tensor wd = distribute_tensor(w, mesh, without_partial(out_pl), std::nullopt);
    sum(mul(out, wd)).backward();
    for (size_t i = 0; i < c.fulls.size(); ++i) {
      if (!a[i].requires_grad() || !a[i].grad().defined()) continue;
      if (!b[i].grad().defined()) {
        msg = "no gradient for input " + std::to_string(i);
        return Outcome::fail;
      }
      if (c.pls[i].empty()) {  // a plain input gets a plain (full) gradient
        if (b[i].grad().is_distributed() || !detail_ops::close(b[i].grad(), a[i].grad(), diff)) {
          msg = "gradient of plain input " + std::to_string(i) + " differs or is distributed";
          return Outcome::fail;
        }
        continue;
      }
      if (placements(b[i].grad()) != without_partial(placements(b[i]))) {
        msg = "gradient of input " + std::to_string(i) + " has placements " + placements_str(placements(b[i].grad()));
        return Outcome::fail;
      }
      if (!detail_ops::close(full_tensor(b[i].grad()), a[i].grad(), diff)) {
        msg = "gradient of input " + std::to_string(i) + " differs (max diff " + std::to_string(diff) + ")";
        return Outcome::fail;
      }
    }
  } catch (const Error& e) {
    msg = std::string("backward / compare raised: ") + e.what();
    return Outcome::fail;
  }
  return Outcome::pass;
}

}  // namespace dtr::testing::property
