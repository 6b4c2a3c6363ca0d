#pragma once
// Materialising a module built under MetaInitGuard (tensor/meta.h) after parallelisation: every
// parameter / buffer that is still meta (a plain tensor, or a DTensor whose local shard is meta,
// e.g. TP without FSDP) gets memory for its local block and is filled from its recipe. FSDP's
// shards are filled by fully_shard itself. parallelize_model calls it, so a meta-built model
// needs nothing else; a model used without parallelize_model calls it directly.
// Source: PyTorch's meta-device init + `to_empty` + `init_weights` (torchtitan), here with the
// recipe recorded at build time instead of re-running the init code.
#include "tensor/nn/module.h"

namespace dtr {

/// Materialises every meta parameter and buffer of `module` (tied tensors once); returns how
/// many tensors were materialised. Each rank allocates only its local blocks.
int64_t materialize_module(nn::Module& module);

/// True when some parameter or buffer of `module` (or its local shard) is still meta.
bool has_meta_tensors(const nn::Module& module);

}  // namespace dtr
