// Context parallelism: load-balanced sequence slices and attention over all-gathered K/V (see
// context_parallel.h).
#include "parallel/context_parallel.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

/// Index in the rank-ordered gathered sequence (rank r's chunks r, 2P-1-r at 2r, 2r+1) of chunk
/// i of the sequence order.
int64_t gathered_chunk(int64_t i, int64_t P) { return i < P ? 2 * i : 2 * (2 * P - 1 - i) + 1; }

}  // namespace

Tensor context_parallel_shard(const Tensor& x, int64_t dim, int64_t cp_size, int64_t cp_rank) {
  const int64_t d = wrap_dim(dim, x.dim(), "context_parallel_shard");
  DTR_CHECK(cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size, "context_parallel_shard: cp_rank ", cp_rank,
            " outside [0, cp_size=", cp_size, ")");
  if (cp_size == 1) return x;
  const int64_t T = x.size(d);
  DTR_CHECK(T % (2 * cp_size) == 0, "context_parallel_shard: sequence length ", T, " (dim ", d, " of ", x.sizes(),
            ") is not divisible by 2 * cp_size = ", 2 * cp_size);
  const int64_t c = T / (2 * cp_size);
  return cat({narrow(x, d, cp_rank * c, c), narrow(x, d, (2 * cp_size - 1 - cp_rank) * c, c)}, d);
}

Tensor all_gather_along(const Tensor& x, int64_t dim, const std::shared_ptr<ProcessGroup>& pg) {
  DTR_CHECK(!x.is_distributed() && x.dim() >= 1, "all_gather_along: expected a plain tensor with dim >= 1, got ",
            x.sizes());
  const int64_t d = wrap_dim(dim, x.dim(), "all_gather_along");
  const int64_t P = pg->size();
  if (P == 1) return x;
  Tensor out;
  {
    NoGradGuard ng;
    Tensor in = transpose(x.detach(), 0, d).contiguous();  // the gathered dim first: rank blocks contiguous
    Shape s = in.sizes();
    s[0] *= P;
    Tensor g = empty(s, TensorOptions(x.dtype()).with_device(x.device()));
    pg->all_gather(g, in)->wait();
    out = transpose(g, 0, d);
  }
  if (needs_grad({x}))
    record("all_gather_along", {x}, out, [d, pg](const std::vector<Tensor>& g, const std::vector<bool>&) {
      NoGradGuard ng;
      Tensor in = transpose(g[0], 0, d).contiguous();
      Shape s = in.sizes();
      s[0] /= pg->size();
      Tensor r = empty(s, TensorOptions(in.dtype()).with_device(in.device()));
      pg->reduce_scatter(r, in, ReduceOp::SUM)->wait();
      return std::vector<Tensor>{transpose(r, 0, d)};
    });
  return out;
}

Tensor context_parallel_unshard(const Tensor& local, int64_t dim, const std::shared_ptr<ProcessGroup>& pg) {
  const int64_t d = wrap_dim(dim, local.dim(), "context_parallel_unshard");
  const int64_t P = pg->size();
  if (P == 1) return local;
  DTR_CHECK(local.size(d) % 2 == 0, "context_parallel_unshard: local sequence length ", local.size(d), " (dim ", d,
            " of ", local.sizes(), ") is odd; a load-balanced slice holds two equal chunks");
  std::vector<Tensor> chunks = chunk(all_gather_along(local, d, pg), 2 * P, d);
  std::vector<Tensor> ordered;
  for (int64_t i = 0; i < 2 * P; ++i) ordered.push_back(chunks[gathered_chunk(i, P)]);
  return cat(ordered, d);
}

std::vector<int64_t> context_parallel_positions(int64_t local_len, int64_t cp_size, int64_t cp_rank) {
  std::vector<int64_t> pos(local_len);
  if (cp_size == 1) {
    for (int64_t i = 0; i < local_len; ++i) pos[i] = i;
    return pos;
  }
  DTR_CHECK(local_len % 2 == 0, "context_parallel_positions: local sequence length ", local_len,
            " is odd; a load-balanced slice holds two equal chunks");
  const int64_t c = local_len / 2;
  for (int64_t i = 0; i < c; ++i) {
    pos[i] = cp_rank * c + i;
    pos[c + i] = (2 * cp_size - 1 - cp_rank) * c + i;
  }
  return pos;
}

Tensor context_parallel_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::shared_ptr<ProcessGroup>& pg, bool is_causal, std::optional<double> scale,
                                  int64_t window, const Tensor& document_ids) {
  DTR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "context_parallel_attention: expected q [B, Hq, T, D], ",
            "k/v [B, Hkv, T, D], got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  const int64_t P = pg->size(), r = pg->rank(), Tl = q.size(2);
  SdpaMask mask;
  if (P == 1) {
    mask.q_document_ids = document_ids;
    return scaled_dot_product_attention(q, k, v, is_causal, scale, window, mask);
  }
  DTR_CHECK(k.size(2) == Tl && v.size(2) == Tl, "context_parallel_attention: q, k, v hold different local lengths: q ",
            q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  DTR_CHECK(Tl % 2 == 0, "context_parallel_attention: local sequence length ", Tl,
            " is odd; a load-balanced slice holds two equal chunks");
  const Tensor kf = context_parallel_unshard(k, 2, pg);  // [B, Hkv, P * Tl, D], sequence order
  const Tensor vf = context_parallel_unshard(v, 2, pg);
  Tensor kd;  // [B, P * Tl]: the keys' document ids, sequence order
  if (document_ids.defined()) {
    DTR_CHECK(document_ids.dim() == 2 && document_ids.size(1) == Tl, "context_parallel_attention: document_ids ",
              document_ids.sizes(), " must be [B, ", Tl, "] (this rank's slice)");
    NoGradGuard ng;
    kd = context_parallel_unshard(document_ids, 1, pg).contiguous();
  }
  if (!is_causal) {
    mask.q_document_ids = document_ids;
    mask.k_document_ids = kd;
    return scaled_dot_product_attention(q, kf, vf, false, scale, window, mask);
  }
  // Query chunk i (global positions [i c, (i + 1) c)) against keys [0, (i + 1) c): bottom-right
  // causal alignment is the global-position mask.
  const int64_t c = Tl / 2;
  std::vector<Tensor> outs;
  for (int64_t h = 0; h < 2; ++h) {
    const int64_t i = h == 0 ? r : 2 * P - 1 - r;
    const int64_t keys = (i + 1) * c;
    if (kd.defined()) {
      mask.q_document_ids = narrow(document_ids, 1, h * c, c).contiguous();
      mask.k_document_ids = narrow(kd, 1, 0, keys).contiguous();
    }
    outs.push_back(scaled_dot_product_attention(narrow(q, 2, h * c, c), narrow(kf, 2, 0, keys), narrow(vf, 2, 0, keys),
                                                true, scale, window, mask));
  }
  return cat(outs, 2);
}

int apply_context_parallel(nn::Module& model, const DeviceMesh& cp_mesh) {
  DTR_CHECK(cp_mesh.ndim() == 1, "apply_context_parallel: expected a 1-d cp mesh, got ", cp_mesh.str());
  int n = 0;
  for (auto& [fqn, m] : model.named_modules())
    if (auto* a = dynamic_cast<ContextParallelModule*>(m.get())) {
      a->set_context_parallel(cp_mesh.group(0));
      ++n;
    }
  return n;
}

}  // namespace dtr
