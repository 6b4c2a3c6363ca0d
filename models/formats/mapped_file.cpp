#include "models/formats/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tensor/error.h"

namespace dtr {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DTR_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    DTR_ERROR("cannot stat '", path, "': ", std::strerror(e));
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      DTR_ERROR("cannot mmap '", path, "' (", f->size_, " bytes): ", std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid after close
  return f;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DTR_CHECK(fd_ >= 0, "cannot create '", tmp_, "': ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    DTR_CHECK(w > 0, "write to '", tmp_, "' failed at offset ", offset_, ": ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
    offset_ += static_cast<uint64_t>(w);
  }
}

void AtomicFileWriter::commit() {
  DTR_CHECK(::fsync(fd_) == 0, "fsync '", tmp_, "' failed: ", std::strerror(errno));
  DTR_CHECK(::close(fd_) == 0, "close '", tmp_, "' failed: ", std::strerror(errno));
  fd_ = -1;
  DTR_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename '", tmp_, "' to '", path_,
            "': ", std::strerror(errno));
  committed_ = true;
  const size_t slash = path_.rfind('/');
  fsync_directory(slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash)));
}

void release_mapped_range(const void* p, size_t n) {
  if (n == 0 || p == nullptr) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);  // advisory: a failure only keeps pages resident
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DTR_CHECK(fd >= 0, "cannot open directory '", dir, "' to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  DTR_CHECK(rc == 0 || e == EINVAL, "fsync of directory '", dir, "' failed: ", std::strerror(e));
}

std::string read_file_to_string(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DTR_CHECK(in.good(), "cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  DTR_CHECK(!in.bad(), "cannot read '", path, "'");
  return ss.str();
}

}  // namespace dtr
