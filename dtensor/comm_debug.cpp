#include "dtensor/comm_debug.h"

#include <cstdlib>
#include <sstream>

#include "tensor/env_vars.h"

namespace dtr {
namespace {
thread_local CommDebugMode* t_active = nullptr;
}

CommDebugMode::CommDebugMode() : prev_(t_active) { t_active = this; }
CommDebugMode::~CommDebugMode() { t_active = prev_; }

int64_t CommDebugMode::total() const {
  int64_t s = 0;
  for (auto c : counts_) s += c;
  return s;
}

std::string CommDebugMode::str() const {
  std::ostringstream os;
  for (int k = 0; k < kNumCommKinds; ++k)
    if (counts_[k]) os << comm_kind_name(static_cast<CommKind>(k)) << "=" << counts_[k] << " ";
  return os.str();
}

void comm_debug_note(CommKind kind) {
  for (CommDebugMode* m = t_active; m; m = m->prev_) ++m->counts_[static_cast<int>(kind)];
}

bool dtensor_debug_enabled() {
  static const bool on = env::flag("DTR_DTENSOR_DEBUG");
  return on;
}

}  // namespace dtr
