#pragma once
// Point-to-point transfer of activations and gradients between pipeline stages: a small header
// (dims, sizes, dtype) followed by the data, both with the same tag, so the receiver needs no
// shape of its own (micro-batches may differ in sequence length, SP shards in rows). MPI keeps
// messages between a pair of ranks with one tag in order, which is what lets one tag per
// (direction, stage) serve every micro-batch. Source: torch.distributed.pipelining's P2P ops
// (_batch_p2p), Megatron's variable-sequence-length shape exchange.
#include <memory>
#include <vector>

#include "runtime/process_group.h"

namespace dtr {

/// An in-flight send: the header and data tensors stay alive until wait().
struct PendingSend {
  std::vector<WorkPtr> works;
  std::vector<Tensor> keep;
  void wait();
};

/// Sends the plain (non-distributed) tensor `t` to group rank `dst` with `tag`, asynchronously.
/// Errors: a distributed tensor, more than 6 dims.
PendingSend send_tensor(ProcessGroup& pg, const Tensor& t, int dst, int tag);
/// Receives a tensor sent by send_tensor from group rank `src` with `tag` (blocks until it
/// arrived). Errors: a malformed header.
Tensor recv_tensor(ProcessGroup& pg, int src, int tag);

}  // namespace dtr
