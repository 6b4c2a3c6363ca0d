// The communication watchdog (see watchdog.h).
#include "runtime/watchdog.h"

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/env.h"
#include "runtime/work_queue.h"

namespace dtr {
namespace {

using Clock = std::chrono::steady_clock;

/// comm_timeout_s(), or its default when DTR_COMM_TIMEOUT_S is bad (dtr::init reported that
/// already; the watchdog runs in destructors and must not throw).
double timeout_or_default() {
  try {
    return comm_timeout_s();
  } catch (...) {
    return 600.0;
  }
}

/// One thread sleeping until the earliest armed deadline. Never destroyed (a joinable thread
/// in a static destructor would terminate the process at exit).
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();
    return *w;
  }
  unsigned long long arm(std::string what, std::string group) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_or_default()));
    std::lock_guard<std::mutex> lk(mu_);
    const unsigned long long id = next_++;
    armed_[id] = {deadline, std::move(what), std::move(group)};
    cv_.notify_all();
    return id;
  }
  void disarm(unsigned long long id) {
    std::lock_guard<std::mutex> lk(mu_);
    armed_.erase(id);
  }

 private:
  struct Entry {
    Clock::time_point deadline;
    std::string what, group;
  };
  Watchdog() { std::thread([this] { loop(); }).detach(); }
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (armed_.empty()) {
        cv_.wait(lk);
        continue;
      }
      auto first = armed_.begin();
      for (auto it = armed_.begin(); it != armed_.end(); ++it)
        if (it->second.deadline < first->second.deadline) first = it;
      if (Clock::now() >= first->second.deadline) {
        const Entry e = first->second;
        lk.unlock();
        comm_timed_out(e.what, e.group);
      }
      const Clock::time_point until = first->second.deadline;  // the entry may go while waiting
      cv_.wait_until(lk, until);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<unsigned long long, Entry> armed_;
  unsigned long long next_ = 0;
};

}  // namespace

CommDeadline::CommDeadline(std::string what, std::string group)
    : id_(Watchdog::get().arm(std::move(what), std::move(group))) {}

CommDeadline::~CommDeadline() { Watchdog::get().disarm(id_); }

void comm_timed_out(const std::string& what, const std::string& group) {
  std::fprintf(stderr, "[rank %d] collective %s on group %s timed out after %g s (set DTR_COMM_TIMEOUT_S)\n",
               dtr::rank(), what.c_str(), group.c_str(), timeout_or_default());
  std::fflush(stderr);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

}  // namespace dtr
