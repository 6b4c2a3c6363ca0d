#include "runtime/work_queue.h"

#include <mpi.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "runtime/env.h"
#include "runtime/watchdog.h"
#include "tensor/error.h"
#include "tensor/env_vars.h"

namespace dtr {
namespace {

std::atomic<int> g_debug{-1};

}  // namespace

double comm_timeout_s() {
  static const double t = env::number("DTR_COMM_TIMEOUT_S", 600.0);
  return t;
}

bool comm_debug() {
  int d = g_debug.load();
  if (d < 0) {
    d = env::flag("DTR_COMM_DEBUG") ? 1 : 0;
    g_debug.store(d);
  }
  return d == 1;
}
void set_comm_debug(bool on) { g_debug.store(on ? 1 : 0); }

// ---- QueuedWork --------------------------------------------------------------------------------
void QueuedWork::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  const auto timeout = std::chrono::duration<double>(comm_timeout_s());
  if (!cv_.wait_for(lk, timeout, [&] { return done_; })) comm_timed_out(what_, group_);
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      DTR_ERROR(what_, " on group ", group_, " failed: ", e.what());
    }
  }
}

bool QueuedWork::is_completed() {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

void QueuedWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

std::shared_ptr<QueuedWork> QueuedWork::completed(std::string what, std::string group) {
  auto w = std::make_shared<QueuedWork>(std::move(what), std::move(group));
  w->finish(nullptr);
  return w;
}

// ---- WorkQueue ---------------------------------------------------------------------------------
WorkQueue::WorkQueue(std::string group) : group_(std::move(group)) {
  thread_ = std::thread([this] { loop(); });
}

WorkQueue::~WorkQueue() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
    // A task stuck in MPI (dead peer) must not hang process exit forever.
    const auto timeout = std::chrono::duration<double>(comm_timeout_s());
    if (!cv_.wait_for(lk, timeout, [&] { return items_.empty(); }))
      comm_timed_out(items_.front().work->what() + " (draining at group destruction)", group_);
  }
  thread_.join();
}

WorkPtr WorkQueue::enqueue(const std::string& what, std::function<void()> task) {
  auto w = std::make_shared<QueuedWork>(what, group_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    items_.push_back({w, std::move(task)});
  }
  cv_.notify_all();
  return w;
}

void WorkQueue::loop() {
  omp_set_num_threads(1);  // staging copies here must not spawn a second OpenMP team per group
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !items_.empty(); });
      if (items_.empty()) return;  // stop_ and drained
      item.work = items_.front().work;  // front stays (with its Work) until done: the destructor reads it
      item.task = std::move(items_.front().task);
    }
    std::exception_ptr err;
    try {
      item.task();
    } catch (...) {
      err = std::current_exception();
    }
    item.task = nullptr;  // release staging buffers before signalling
    {
      std::lock_guard<std::mutex> lk(mu_);
      items_.pop_front();
    }
    cv_.notify_all();
    item.work->finish(err);
  }
}

}  // namespace dtr
