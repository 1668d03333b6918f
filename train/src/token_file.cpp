#include "kshard/train/token_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "kshard/mesh/agree.hpp"
#include "kshard/error.hpp"

namespace kshard {
namespace {

// splitmix64: counter-based, so an offset depends only on its key.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string quoted(const std::string& path) { return "token file '" + path + "'"; }

}  // namespace

TokenDType TokenFile::parse_dtype(const std::string& name) {
  if (name == "uint16") return TokenDType::u16;
  if (name == "uint32") return TokenDType::u32;
  throw Error("token dtype '" + name + "' is unknown", "uint16 or uint32");
}

const char* TokenFile::dtype_name(TokenDType dtype) noexcept {
  return dtype == TokenDType::u16 ? "uint16" : "uint32";
}

TokenFile::TokenFile(std::string path, TokenDType dtype, std::int64_t vocab,
                     std::int64_t min_tokens)
    : path_(std::move(path)), dtype_(dtype), vocab_(vocab) {
  if (dtype_ != TokenDType::u16 && dtype_ != TokenDType::u32)
    throw Error(quoted(path_) + " with token dtype " + std::to_string(int(dtype_)),
                "uint16 or uint32");
  if (vocab_ < 1) throw Error(quoted(path_) + " with vocab " + std::to_string(vocab_), "vocab >= 1");
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw Error(quoted(path_) + " cannot be opened: " + std::strerror(errno),
                "a readable file of little-endian token ids");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw Error(quoted(path_) + " is not a regular file", "a flat file of token ids");
  }
  const std::int64_t bytes = std::int64_t(st.st_size), width = std::int64_t(dtype_);
  if (bytes % width != 0) {
    ::close(fd_);
    fd_ = -1;
    throw Error(quoted(path_) + " has " + std::to_string(bytes) + " bytes, not a multiple of " +
                    std::to_string(width) + " (" + dtype_name(dtype_) + ")",
                "a file of whole " + std::string(dtype_name(dtype_)) +
                    " token ids (is --data-dtype right?)");
  }
  tokens_ = bytes / width;
  if (tokens_ < min_tokens) {
    ::close(fd_);
    fd_ = -1;
    throw Error(quoted(path_) + " holds " + std::to_string(tokens_) + " tokens",
                "at least " + std::to_string(min_tokens) + " (e.g. one window of seq + 1)");
  }
}

TokenFile TokenFile::open(const Communicator& comm, const std::string& path, TokenDType dtype,
                          std::int64_t vocab, std::int64_t min_tokens) {
  std::exception_ptr failure;
  std::unique_ptr<TokenFile> f;
  try {
    f = std::make_unique<TokenFile>(path, dtype, vocab, min_tokens);
  } catch (...) {
    failure = std::current_exception();
  }
  agree_ok(comm, failure, "opening " + quoted(path));
  // Every rank must read the same data: compare the sizes.
  agree_same(comm, "opening " + quoted(path) + " on " + comm.name(),
             {{"the number of tokens", f->num_tokens()}}, "the same file on every rank");
  return std::move(*f);
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)), dtype_(o.dtype_), vocab_(o.vocab_), tokens_(o.tokens_),
      fd_(std::exchange(o.fd_, -1)) {}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    dtype_ = o.dtype_;
    vocab_ = o.vocab_;
    tokens_ = o.tokens_;
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

std::string TokenFile::describe() const {
  return quoted(path_) + " (" + dtype_name(dtype_) + ", " + std::to_string(tokens_) + " tokens)";
}

void TokenFile::read(std::int64_t first, std::int64_t n, std::int32_t* out) const {
  if (fd_ < 0) throw Error("read from a closed " + quoted(path_), "an open TokenFile");
  if (first < 0 || n < 0 || first + n > tokens_)
    throw Error(quoted(path_) + ": tokens [" + std::to_string(first) + ", " +
                    std::to_string(first + n) + ") asked for",
                "a range inside its " + std::to_string(tokens_) + " tokens");
  const std::size_t width = std::size_t(dtype_);
  std::vector<unsigned char> raw(std::size_t(n) * width);
  std::size_t done = 0;
  while (done < raw.size()) {
    const ssize_t got = ::pread(fd_, raw.data() + done, raw.size() - done,
                                off_t(std::size_t(first) * width + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw Error(quoted(path_) + ": reading tokens [" + std::to_string(first) + ", " +
                      std::to_string(first + n) + ") failed" +
                      (got < 0 ? std::string(": ") + std::strerror(errno) : ": end of file"),
                  "a readable file that does not shrink while training");
    done += std::size_t(got);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const unsigned char* b = raw.data() + std::size_t(i) * width;
    // Little-endian whatever the host's byte order.
    std::uint32_t v = std::uint32_t(b[0]) | std::uint32_t(b[1]) << 8;
    if (width == 4) v |= std::uint32_t(b[2]) << 16 | std::uint32_t(b[3]) << 24;
    if (std::int64_t(v) >= vocab_)
      throw Error(quoted(path_) + ": token " + std::to_string(first + i) + " is id " +
                      std::to_string(v),
                  "ids below the vocabulary size " + std::to_string(vocab_) +
                      " (is --vocab or --data-dtype right?)");
    out[i] = std::int32_t(v);
  }
}

std::int64_t TokenFile::window_offset(std::uint64_t seed, std::int64_t g, std::int64_t seq) const {
  if (seq < 1 || tokens_ < seq + 1)
    throw Error(quoted(path_) + " holds " + std::to_string(tokens_) + " tokens for windows of " +
                    std::to_string(seq + 1),
                "at least seq + 1 tokens");
  const std::uint64_t starts = std::uint64_t(tokens_ - seq);  // offsets 0 .. N - seq - 1
  return std::int64_t(mix(mix(seed ^ 0x746f6b656e66696cULL) + std::uint64_t(g)) % starts);
}

void TokenFile::fill(std::uint64_t seed, std::int64_t first, std::int64_t count, std::int64_t seq,
                     std::int32_t* ids, std::int32_t* targets) const {
  std::vector<std::int32_t> w(std::size_t(seq + 1));
  for (std::int64_t i = 0; i < count; ++i) {
    read(window_offset(seed, first + i, seq), seq + 1, w.data());
    std::copy(w.begin(), w.end() - 1, ids + i * seq);
    std::copy(w.begin() + 1, w.end(), targets + i * seq);
  }
}

void TokenFile::fill_eval(std::int64_t first, std::int64_t count, std::int64_t seq,
                          std::int32_t* ids, std::int32_t* targets) const {
  std::vector<std::int32_t> w(std::size_t(seq + 1));
  for (std::int64_t i = 0; i < count; ++i) {
    read((first + i) * seq, seq + 1, w.data());
    std::copy(w.begin(), w.end() - 1, ids + i * seq);
    std::copy(w.begin() + 1, w.end(), targets + i * seq);
  }
}

}  // namespace kshard
