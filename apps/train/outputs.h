#pragma once
// The output directory of a dtr-train run (checkpoint.checkpoint_dir): held by one run at a
// time, and never overwritten silently.
//   - Lock: rank 0 holds an exclusive flock on <checkpoint_dir>/.dtr-train.lock (holder's pid
//     and host written into it) for the whole run; a second run on the same directory stops
//     at start with an error naming the holder, instead of interleaving checkpoints and metrics.
//   - Earlier outputs: a run that starts from step 0 (no checkpoint to resume, checkpoint
//     disabled, or --no-resume) while the files of an earlier run are there (metrics file, loss
//     plot, adapter, consolidated export, step_N checkpoints when checkpointing) refuses to
//     start and lists them (Hugging Face Trainer's rule for a non-empty output_dir);
//     --overwrite removes them first and says so. A run that resumes continues its own files.
#include <memory>
#include <string>
#include <vector>

#include "apps/train/recipe.h"

namespace dtr::train {

/// The lock on an output directory; released when destroyed (or when the process ends).
class OutputLock {
 public:
  /// Creates `dir` if needed and takes the lock without waiting. Errors: the directory cannot
  /// be created / the lock file opened; another process holds it (the message names it).
  static std::unique_ptr<OutputLock> acquire(const std::string& dir);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  explicit OutputLock(int fd) : fd_(fd) {}
  int fd_;
};

/// The outputs of an earlier run that a run starting at step 0 with recipe `r` would
/// overwrite (paths, in a fixed order; empty when there are none).
std::vector<std::string> earlier_outputs(const Recipe& r);

/// True when `checkpoint_dir` holds a step_N directory with a metadata.json (a run resumes).
bool has_checkpoint(const std::string& checkpoint_dir);

/// Rank 0's start-up check of the output directory: takes the lock (kept in `lock`), then
/// refuses or (overwrite) removes earlier outputs when the run will not resume. Returns the
/// notes to print (removed paths). Errors: dtr::Error with the one-line message.
std::vector<std::string> prepare_outputs(const Recipe& r, bool resume, bool overwrite,
                                         std::unique_ptr<OutputLock>& lock);

}  // namespace dtr::train
