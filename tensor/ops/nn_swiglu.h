#pragma once
// The joined form of swiglu (ops.h has swiglu(gate, up)); kept out of ops.h as only the MoE
// experts use it.
#include "tensor/tensor.h"

namespace dtr {

/// swiglu of the two halves of the last dim of `gate_up` [..., 2I] (gate first, then up) ->
/// [..., I]: the MoE experts' joined gate_up projection (Megatron-LM's SwiGLU on chunk(x, 2, -1)).
/// Its gradient is formed as one [..., 2I] tensor by one op (swiglu_joined_backward), not as
/// two zero-filled narrow gradients summed. Errors: an odd or empty last dim, a non-floating dtype.
Tensor swiglu(const Tensor& gate_up);

}  // namespace dtr
