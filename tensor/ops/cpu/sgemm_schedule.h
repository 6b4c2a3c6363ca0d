#pragma once
// How the threads of one SGEMM parallel region share the work (the AVX-512 kernel of sgemm.h and
// the AVX2 one of sgemm_avx2.h): pieces of C are handed out from shared atomic counters as
// threads become free, instead of one static part per thread, so a core slowed by another tenant
// of the machine (the two vCPUs of a shared VM often run 10-40% apart) does less of the work
// instead of holding the others at the join. Which thread computes a piece never changes a
// result: each C tile is one kernel call per K block and the K blocks of a tile are applied in
// order.
#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace dtr::cpu::sgemm_detail {

/// Chunks of `items` (panels) handed out from one counter per list (a list: one K block); the
/// caller orders the lists with a barrier.
class Chunks {
 public:
  Chunks(int64_t lists, int64_t items, int64_t chunk)
      : next_(std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(lists))), items_(items), chunk_(chunk) {
    for (int64_t i = 0; i < lists; ++i) next_[i].store(0, std::memory_order_relaxed);
  }
  /// The next chunk [b, e) of list l; false when the list is exhausted.
  bool take(int64_t l, int64_t& b, int64_t& e) {
    b = next_[l].fetch_add(chunk_, std::memory_order_relaxed);
    e = std::min(items_, b + chunk_);
    return b < items_;
  }

 private:
  std::unique_ptr<std::atomic<int64_t>[]> next_;
  int64_t items_, chunk_;
};

/// Items (K block kb, tile t) for `blocks` K blocks over `tiles` disjoint parts of C, handed out
/// from one counter in K-block order (all tiles of block 0, then of block 1, ...). A tile takes
/// block kb only after its block kb - 1 finished (wait_turn / finish), which keeps each C element's
/// sum in K order without a barrier between blocks: a thread moves on to the next block's tiles
/// while another finishes this block. No deadlock, given that each thread finishes an item before
/// it takes the next: the oldest item in flight never waits (its predecessor was handed out
/// earlier, so it is finished).
class TileQueue {
 public:
  TileQueue(int64_t blocks, int64_t tiles)
      : done_(std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(tiles))), blocks_(blocks), tiles_(tiles) {
    for (int64_t t = 0; t < tiles; ++t) done_[t].store(0, std::memory_order_relaxed);
  }
  /// The next item; false when all were handed out.
  bool take(int64_t& kb, int64_t& tile) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    kb = i / tiles_;
    tile = i % tiles_;
    return kb < blocks_;
  }
  /// Waits until tile's K block kb - 1 is finished (its C writes visible to this thread).
  void wait_turn(int64_t kb, int64_t tile) {
    // Spin 1024 pauses (a few to ~60 us, by microarchitecture), then yield the core: on a loaded
    // machine the thread being waited for may be descheduled.
    for (int spins = 0; done_[tile].load(std::memory_order_acquire) < kb;) {
      if (spins < 1024) {
        _mm_pause();
        ++spins;
      } else {
        sched_yield();
      }
    }
  }
  /// Marks tile's K block kb finished.
  void finish(int64_t kb, int64_t tile) { done_[tile].store(kb + 1, std::memory_order_release); }

 private:
  std::atomic<int64_t> next_{0};
  std::unique_ptr<std::atomic<int64_t>[]> done_;
  int64_t blocks_, tiles_;
};

}  // namespace dtr::cpu::sgemm_detail
