// Pipeline point-to-point transfers (see p2p.h).
#include "parallel/pipeline/p2p.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {
namespace {
constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeader = kMaxDims + 2;  // ndim, sizes[6], dtype
}  // namespace

void PendingSend::wait() {
  for (auto& w : works) w->wait();
  works.clear();
  keep.clear();
}

PendingSend send_tensor(ProcessGroup& pg, const Tensor& t, int dst, int tag) {
  DTR_CHECK(!t.is_distributed(), "pipeline send: stage outputs must be plain tensors, got a distributed tensor ",
            t.sizes(), " (use_local_output on the stage's last TP style)");
  DTR_CHECK(t.dim() <= kMaxDims, "pipeline send: at most ", kMaxDims, " dims, got ", t.sizes());
  NoGradGuard ng;
  std::vector<int64_t> h(kHeader, 0);
  h[0] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[1 + d] = t.size(d);
  h[kHeader - 1] = static_cast<int64_t>(t.dtype());
  PendingSend s;
  Tensor header = from_vector<int64_t>(h, {kHeader});
  Tensor data = t.detach().contiguous();
  s.works.push_back(pg.send(header, dst, tag));
  s.works.push_back(pg.send(data, dst, tag));
  s.keep = {header, data};
  return s;
}

Tensor recv_tensor(ProcessGroup& pg, int src, int tag) {
  Tensor header = zeros({kHeader}, DType::i64);
  pg.recv(header, src, tag)->wait();
  const std::vector<int64_t> h = header.to_vector<int64_t>();
  DTR_CHECK(h[0] >= 0 && h[0] <= kMaxDims && h[kHeader - 1] >= 0 && h[kHeader - 1] <= static_cast<int64_t>(DType::bool_),
            "pipeline recv from rank ", src, " (tag ", tag, "): malformed header");
  Shape shape(h.begin() + 1, h.begin() + 1 + h[0]);
  Tensor data = zeros(shape, static_cast<DType>(h[kHeader - 1]));
  pg.recv(data, src, tag)->wait();
  return data;
}

}  // namespace dtr
