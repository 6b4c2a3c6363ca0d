#pragma once
// WorkQueue: the communication thread of a process group. Tasks run one at a time in issue
// order on a dedicated thread (the CPU analogue of a NCCL stream); each task has a Work
// handle whose wait() blocks on a condition variable with the communication timeout.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/process_group.h"

namespace dtr {

/// Work of one task on a WorkQueue. wait() blocks up to comm_timeout_s(); on expiry it prints
/// "[rank N] collective X on group G timed out after T s" and aborts the job (MPI_Abort), so a
/// dead or hung peer never hangs the survivors forever. An error raised by the task is
/// rethrown by wait() as dtr::Error naming the collective and the group.
class QueuedWork : public Work {
 public:
  QueuedWork(std::string what, std::string group) : what_(std::move(what)), group_(std::move(group)) {}
  void wait() override;
  bool is_completed() override;
  /// Called by the queue thread when the task finished (error: nullptr on success).
  void finish(std::exception_ptr error);
  const std::string& what() const { return what_; }
  /// A Work that is already complete (size-1 groups, empty operations).
  static std::shared_ptr<QueuedWork> completed(std::string what, std::string group);

 private:
  std::string what_, group_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class WorkQueue {
 public:
  /// `group` names the owning group in messages.
  explicit WorkQueue(std::string group);
  /// Drains the queue (bounded by the communication timeout) and joins the thread.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;
  /// Enqueues `task` (run on the queue thread) and returns its Work immediately.
  WorkPtr enqueue(const std::string& what, std::function<void()> task);

 private:
  struct Item {
    std::shared_ptr<QueuedWork> work;
    std::function<void()> task;
  };
  void loop();
  std::string group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stop_ = false;
  std::thread thread_;
};

/// The communication timeout in seconds: env DTR_COMM_TIMEOUT_S (default 600), read once.
double comm_timeout_s();
/// Debug mode: env DTR_COMM_DEBUG=1 makes every collective first compare (kind, numel, dtype)
/// across the group's ranks and raise a clear error on all ranks when they differ. Read once;
/// set_comm_debug overrides (tests).
bool comm_debug();
void set_comm_debug(bool on);

}  // namespace dtr
