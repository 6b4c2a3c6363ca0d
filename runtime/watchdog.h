#pragma once
// Bounds on blocking communication that has no Work handle: raw MPI calls made on the
// caller's thread (the all-ranks max behind control decisions, communicator creation, the
// NCCL id broadcast, MPI_Finalize). A CommDeadline armed around such a call makes a watchdog
// thread abort the job when the call outlives comm_timeout_s(), with the same message as a
// timed-out Work::wait, so a stopped or hung peer never hangs the other ranks forever.
#include <string>

namespace dtr {

/// Scope guard: armed at construction, disarmed at destruction. When still armed
/// comm_timeout_s() seconds after construction, the watchdog calls comm_timed_out(what, group).
/// Cheap (one mutex lock on each side); the watchdog thread starts on first use.
class CommDeadline {
 public:
  CommDeadline(std::string what, std::string group);
  ~CommDeadline();
  CommDeadline(const CommDeadline&) = delete;
  CommDeadline& operator=(const CommDeadline&) = delete;

 private:
  unsigned long long id_;
};

/// Prints "[rank N] collective WHAT on group GROUP timed out after T s (set DTR_COMM_TIMEOUT_S)"
/// and aborts the job (MPI_Abort with code 3; _Exit(3) without MPI).
[[noreturn]] void comm_timed_out(const std::string& what, const std::string& group);

}  // namespace dtr
