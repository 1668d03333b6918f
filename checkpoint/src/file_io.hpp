#pragma once
// POSIX file I/O for checkpoints: std::ofstream cannot fsync and hides short
// writes, and positional reads let each rank read only the ranges it owns.
// Every failure is a kshard::Error naming the file and the system's reason.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace kshard::detail {

class File {
 public:
  /// Creates (truncates) a file for writing.
  static File create(const std::filesystem::path& path);
  static File open_read(const std::filesystem::path& path);
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::filesystem::path& path() const noexcept { return path_; }
  /// Writes all n bytes at the current end (retries short writes and EINTR).
  void write_all(const void* data, std::size_t n);
  void pwrite_all(const void* data, std::size_t n, std::int64_t offset);
  /// Reads exactly n bytes at offset; a short read is a truncated file.
  void pread_all(void* data, std::size_t n, std::int64_t offset) const;
  std::int64_t size() const;
  void sync();
  /// Closes, reporting an error (close can fail on network file systems).
  void close();

 private:
  File(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::filesystem::path path_;
  std::int64_t written_ = 0;
};

/// fsync of a directory, so a rename or a new entry in it is durable.
void fsync_directory(const std::filesystem::path& dir);
/// "No such file or directory (errno 2)".
std::string errno_text(int err);
/// zlib's crc32 of a byte range.
std::uint32_t crc32_of(const void* data, std::size_t n);
/// Reads a whole (small) file into a string.
std::string read_text_file(const std::filesystem::path& path);
/// Writes a whole file and fsyncs it (when sync).
void write_text_file(const std::filesystem::path& path, const std::string& text, bool sync);

}  // namespace kshard::detail
