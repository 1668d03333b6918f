#include "file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "kshard/error.hpp"

namespace kshard::detail {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

namespace {
[[noreturn]] void fail(const char* what, const std::filesystem::path& p, int err,
                       const char* expected) {
  throw Error(std::string("cannot ") + what + " '" + p.string() + "': " + errno_text(err),
              expected);
}
constexpr const char* kWritable = "a writable file system with free space";
constexpr const char* kReadable = "a readable file";
}  // namespace

File File::create(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create", path, errno, kWritable);
  return File(fd, path);
}

File File::open_read(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("open", path, errno, kReadable);
  return File(fd, path);
}

File::File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), written_(o.written_) {
  o.fd_ = -1;
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    written_ = o.written_;
    o.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_all(const void* data, std::size_t n) {
  pwrite_all(data, n, written_);
  written_ += std::int64_t(n);
}

void File::pwrite_all(const void* data, std::size_t n, std::int64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write", path_, errno, kWritable);
    }
    if (w == 0) fail("write", path_, ENOSPC, kWritable);
    p += w;
    n -= std::size_t(w);
    offset += w;
  }
}

void File::pread_all(void* data, std::size_t n, std::int64_t offset) const {
  char* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, p + done, n - done, off_t(offset + std::int64_t(done)));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("read", path_, errno, kReadable);
    }
    if (r == 0)
      throw Error("'" + path_.string() + "' is truncated: " + std::to_string(n) +
                      " bytes wanted at offset " + std::to_string(offset) + ", the file ends at " +
                      std::to_string(offset + std::int64_t(done)),
                  "the file as it was saved");
    done += std::size_t(r);
  }
}

std::int64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("stat", path_, errno, kReadable);
  return std::int64_t(st.st_size);
}

void File::sync() {
  if (::fsync(fd_) != 0) fail("fsync", path_, errno, kWritable);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", path_, errno, kWritable);
}

void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory", dir, errno, kWritable);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync directories (EINVAL): nothing to make durable then.
  if (rc != 0 && err != EINVAL) fail("fsync directory", dir, err, kWritable);
}

std::uint32_t crc32_of(const void* data, std::size_t n) {
  return std::uint32_t(::crc32_z(0L, static_cast<const Bytef*>(data), n));
}

std::string read_text_file(const std::filesystem::path& path) {
  File f = File::open_read(path);
  const std::int64_t n = f.size();
  std::string s(std::size_t(n), '\0');
  if (n > 0) f.pread_all(s.data(), std::size_t(n), 0);
  return s;
}

void write_text_file(const std::filesystem::path& path, const std::string& text, bool sync) {
  File f = File::create(path);
  f.write_all(text.data(), text.size());
  if (sync) f.sync();
  f.close();
}

}  // namespace kshard::detail
