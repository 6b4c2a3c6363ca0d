#pragma once
// MappedFile: a read-only memory map of a whole file, shared by the tensors that view it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace dtr {

/// A read-only, memory-mapped file. Cheap to share (std::shared_ptr); tensors that view its
/// bytes keep it alive through their deleter. An empty file maps to size() == 0, data() ==
/// nullptr. Errors: the file cannot be opened or mapped -> dtr::Error naming the path and
/// errno text.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

/// Drops this process's page-table entries for the mapped pages covering [p, p + n) (MADV_DONTNEED
/// on a read-only file map: the bytes stay in the page cache and read back the same), so a loader
/// that read a range does not keep it in its RSS. Page-rounded outwards; no-op for n == 0.
void release_mapped_range(const void* p, size_t n);

/// fsync of a directory, so that a rename or a new entry in it survives a crash / power loss.
/// Errors: dtr::Error naming the directory.
void fsync_directory(const std::string& dir);

/// Writes a file atomically: the bytes go to "<path>.tmp.<pid>", which is fsync'ed and renamed
/// over `path` only by commit() (the directory is fsync'ed after the rename), so a failure
/// (exception, crash) never leaves a half-written file under the final name. Errors: open /
/// write / rename failures -> dtr::Error naming the path.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();  // removes the temporary file if commit() was not reached
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  /// Appends bytes; throws dtr::Error on a short write.
  void write(const void* data, size_t n);
  /// Bytes written so far.
  uint64_t offset() const { return offset_; }
  /// Flushes, closes and renames the temporary file over the target.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  bool committed_ = false;
};

/// Reads a whole file into a string. Errors: cannot open / read -> dtr::Error naming the path.
std::string read_file_to_string(const std::string& path);

}  // namespace dtr
