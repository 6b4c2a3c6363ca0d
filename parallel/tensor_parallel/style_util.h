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

/// Pre-hook: the first input becomes a DTensor in `input_layout` (plain tensors are wrapped,
/// with global last dim `last_dim` when > 0) and is redistributed to `desired` when given.
void install_input_hook(nn::Module& m, const DeviceMesh& mesh, Placement input_layout,
                        std::optional<Placement> desired, int64_t last_dim = -1);
/// Post-hook: the first output is redistributed to `output_layout` (when given) and turned
/// into its local tensor when `use_local_output`.
void install_output_hook(nn::Module& m, std::optional<Placement> output_layout, bool use_local_output);

/// Errors naming the module when it is not of one of `types`.
void check_type(const nn::Module& m, const std::string& fqn, const std::string& style,
                std::initializer_list<const char*> types);

}  // namespace dtr::tp
