// The output directory of a dtr-train run (see outputs.h).
#include "apps/train/outputs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tensor/error.h"

namespace fs = std::filesystem;

namespace dtr::train {
namespace {

constexpr const char* kLockName = ".dtr-train.lock";

bool nonempty_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && fs::file_size(p, ec) > 0;
}

}  // namespace

std::unique_ptr<OutputLock> OutputLock::acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DTR_CHECK(!ec, "checkpoint.checkpoint_dir: cannot create '", dir, "': ", ec.message());
  const std::string path = (fs::path(dir) / kLockName).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  DTR_CHECK(fd >= 0, "checkpoint.checkpoint_dir: cannot open the lock file '", path, "': ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char holder[256] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "unknown process";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    DTR_CHECK(e != EWOULDBLOCK, "checkpoint.checkpoint_dir '", dir, "' is in use by another dtr-train run (", who,
              " holds ", path, "); two runs must not write into one directory: wait for it or choose another "
              "checkpoint_dir");
    DTR_ERROR("checkpoint.checkpoint_dir: cannot lock '", path, "': ", std::strerror(e));
  }
  char host[128] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, me.data(), me.size(), 0);
  return std::unique_ptr<OutputLock>(new OutputLock(fd));
}

OutputLock::~OutputLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

bool has_checkpoint(const std::string& checkpoint_dir) {
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(checkpoint_dir, ec))
    if (e.path().filename().string().rfind("step_", 0) == 0 && fs::exists(e.path() / "metadata.json", ec)) return true;
  return false;
}

std::vector<std::string> earlier_outputs(const Recipe& r) {
  std::vector<std::string> out;
  std::error_code ec;
  if (nonempty_file(r.logging.metrics_file)) out.push_back(r.logging.metrics_file);
  if (fs::exists(r.logging.plot_file, ec)) out.push_back(r.logging.plot_file);
  const fs::path adapter(r.checkpoint.adapter_dir);
  if (fs::exists(adapter / "adapter_config.json", ec) || fs::exists(adapter / "adapter_model.safetensors", ec))
    out.push_back(adapter.string());
  const fs::path root(r.checkpoint.checkpoint_dir);
  if (fs::exists(root / "consolidated", ec)) out.push_back((root / "consolidated").string());
  if (r.checkpoint.enabled && fs::is_directory(root, ec)) {
    std::vector<std::string> steps;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) steps.push_back(e.path().string());
    std::sort(steps.begin(), steps.end());
    out.insert(out.end(), steps.begin(), steps.end());
  }
  return out;
}

std::vector<std::string> prepare_outputs(const Recipe& r, bool resume, bool overwrite,
                                         std::unique_ptr<OutputLock>& lock) {
  lock = OutputLock::acquire(r.checkpoint.checkpoint_dir);
  std::vector<std::string> notes;
  if (resume && r.checkpoint.enabled && has_checkpoint(r.checkpoint.checkpoint_dir)) return notes;
  const std::vector<std::string> old = earlier_outputs(r);
  if (old.empty()) return notes;
  std::string list;
  for (size_t i = 0; i < old.size() && i < 6; ++i) list += (i ? ", " : "") + old[i];
  if (old.size() > 6) list += ", ... (" + std::to_string(old.size()) + " in all)";
  DTR_CHECK(overwrite, "checkpoint.checkpoint_dir '", r.checkpoint.checkpoint_dir,
            "' holds the outputs of an earlier run that this run (starting at step 0",
            r.checkpoint.enabled ? (resume ? "" : ", --no-resume") : ", checkpoint.enabled: false",
            ") would overwrite: ", list, "; pass --overwrite to replace them, or choose another checkpoint_dir");
  std::error_code ec;
  for (const auto& p : old) {
    fs::remove_all(p, ec);
    DTR_CHECK(!ec, "--overwrite: cannot remove '", p, "': ", ec.message());
  }
  notes.push_back("--overwrite: removed the earlier run's " + list);
  return notes;
}

}  // namespace dtr::train
