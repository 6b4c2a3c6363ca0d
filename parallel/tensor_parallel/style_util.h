#pragma once
// Helpers shared by the tensor-parallel styles: distributing a module's parameters and
// installing input / output redistribution hooks.
#include "parallel/tensor_parallel/style.h"

namespace dtr::tp {

/// Replaces parameter `name` of `m` (if it exists) by a distributed tensor with `pl` on
/// `mesh`: broadcast from mesh rank 0 then sliced (distribute_tensor), or, with `local_only`,
/// wrapped without communication (from_local). requires_grad is kept. A parameter that is
/// already distributed is left alone; a tensor met before (tied weights) reuses its copy.
void distribute_param(nn::Module& m, const std::string& name, const DeviceMesh& mesh, const Placements& pl,
                      DistributeMemo& memo, bool local_only = false);

/// Wraps this rank's plain shard `x` as a DTensor with `pl` on the 1-d `mesh`. Shard(d): the
/// global size of dim d is `global_dim` when > 0, else the sum of the ranks' local sizes (one
/// all_gather of one int64 over the mesh), so uneven torch.chunk shards (a sequence length not
/// divisible by tp) get their exact global shape. Replicate / Partial: no communication.
/// Errors (naming `where`): local sizes that are not torch.chunk's split of their sum.
Tensor wrap_local_shard(const Tensor& x, const DeviceMesh& mesh, Placement pl, const std::string& where,
                        int64_t global_dim = -1);

/// Pre-hook: the first input becomes a DTensor in `input_layout` (plain tensors are wrapped by
/// wrap_local_shard, with global last dim `last_dim` when > 0) and is redistributed to `desired`
/// when given. `where` names the module and style in errors.
void install_input_hook(nn::Module& m, const DeviceMesh& mesh, Placement input_layout,
                        std::optional<Placement> desired, const std::string& where, int64_t last_dim = -1);
/// Post-hook: the first output is redistributed to `output_layout` (when given) and turned
/// into its local tensor when `use_local_output`.
void install_output_hook(nn::Module& m, std::optional<Placement> output_layout, bool use_local_output);

/// Errors naming the module when it is not of one of `types`.
void check_type(const nn::Module& m, const std::string& fqn, const std::string& style,
                std::initializer_list<const char*> types);

}  // namespace dtr::tp
