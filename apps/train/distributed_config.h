#pragma once
// The reader of a recipe's `distributed:` section (NeMo Automodel's key names) into a
// MeshContext (parallel/mesh_context.h): degrees, strategy, activation checkpointing, FSDP2
// options. Parsing only; the sizes are checked by ParallelDims / MeshContext::validate.
#include <cstdint>
#include <functional>
#include <string>

#include "parallel/mesh_context.h"

namespace YAML {
class Node;
}

namespace dtr::train {

/// Parses and validates `distributed` (a YAML map or null; `where` names it in errors, e.g.
/// "configs/x.yaml: distributed"). dp_size not given (or null): world / (tp*cp*pp).
/// Errors (dtr::Error, one line naming the key and the numbers): unknown key, wrong type, an
/// unknown strategy or activation_checkpointing value, and every MeshContext::validate error.
/// Does not create process groups.
MeshContext parse_distributed(const YAML::Node& distributed, int64_t world_size, const std::string& where);

/// The same with a label per key: where_of(k) names distributed.<k> in errors about that key
/// (e.g. "--set distributed.tp_size: distributed"), where_of("") the section as a whole (the
/// mesh-size checks, which involve several keys).
MeshContext parse_distributed(const YAML::Node& distributed, int64_t world_size,
                              const std::function<std::string(const std::string&)>& where_of);

}  // namespace dtr::train
