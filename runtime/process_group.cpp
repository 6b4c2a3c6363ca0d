#include "runtime/process_group.h"

namespace dtr {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::AVG: return "avg";
    case ReduceOp::MAX: return "max";
    case ReduceOp::MIN: return "min";
    case ReduceOp::PRODUCT: return "product";
  }
  return "?";
}

const char* comm_kind_name(CommKind k) {
  switch (k) {
    case CommKind::all_reduce: return "all_reduce";
    case CommKind::all_gather: return "all_gather";
    case CommKind::reduce_scatter: return "reduce_scatter";
    case CommKind::broadcast: return "broadcast";
    case CommKind::all_to_all: return "all_to_all";
    case CommKind::send: return "send";
    case CommKind::recv: return "recv";
    case CommKind::barrier: return "barrier";
  }
  return "?";
}

}  // namespace dtr
