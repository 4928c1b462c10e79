#include "core/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/hash.h"

namespace meshtrain {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temporary_(path_ + ".tmp") {
  MT_CHECK(!path_.empty(), "an output file was given an empty path; give the path of a file to write");
  MT_CHECK(!std::filesystem::is_directory(path_), "cannot write {}: it is a folder; give the path of a file", path_);
  // Renaming over a device, a FIFO or a socket would replace the node with a regular file.
  std::error_code ec;
  MT_CHECK(!std::filesystem::exists(path_, ec) || std::filesystem::is_regular_file(path_, ec),
           "cannot write {}: it is not a regular file (a device, FIFO or socket), which writing would replace; give "
           "the path of a file",
           path_);
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create " + temporary_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void AtomicFile::fail(const std::string& what, int error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temporary_.c_str());
  throw Error(fmt::format("writing {} failed: {}: {}{}; nothing was written under that name", path_, what,
                          std::strerror(error), error == ENOSPC || error == EDQUOT ? " (the disk is full)" : ""));
}

void AtomicFile::write(const void* data, size_t bytes) {
  MT_CHECK(fd_ >= 0, "AtomicFile {}: write after commit", path_);
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write", n < 0 ? errno : EIO);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  MT_CHECK(fd_ >= 0, "AtomicFile {}: committed twice", path_);
  if (::fsync(fd_) != 0) fail("flush to disk", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    throw Error(
        fmt::format("writing {} failed: close: {}; nothing was written under that name", path_, std::strerror(error)));
  }
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    throw Error(fmt::format("writing {} failed: rename from {}: {}; nothing was written under that name", path_,
                            temporary_, std::strerror(error)));
  }
}

std::string read_small_file(const std::string& path, size_t max_bytes, std::string_view what) {
  std::error_code ec;
  MT_CHECK(!std::filesystem::is_directory(path, ec), "{} {}: it is a folder, not a file", what, path);
  const auto size = std::filesystem::file_size(path, ec);
  MT_CHECK(!ec, "{} {}: cannot read it ({})", what, path, ec.message());
  MT_CHECK(size <= max_bytes, "{} {}: {} bytes, more than the {} bytes it may have", what, path, size, max_bytes);
  std::ifstream in(path, std::ios::binary);
  std::string text(size, '\0');
  MT_CHECK(in && in.read(text.data(), static_cast<std::streamsize>(size)), "{} {}: cannot read it", what, path);
  return text;
}

void write_file_atomically(const std::string& path, std::string_view text) {
  AtomicFile file(path);
  file.write(text);
  file.commit();
}

void check_writable_directory(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "{} {} cannot be created: {}", what, dir, ec.message());
  const std::string probe = (std::filesystem::path(dir) / ".meshtrain_write_check").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MT_CHECK(fd >= 0, "{} {} is not writable ({}); choose another or fix its permissions before training", what, dir,
           std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_output_file(const std::string& path, const std::string& what) {
  MT_CHECK(!path.empty(), "{} is empty; give the path of a file to write", what);
  MT_CHECK(!std::filesystem::is_directory(path), "{} {} is a folder; give the path of a file to write", what, path);
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  check_writable_directory(folder.empty() ? "." : folder.string(), "the folder of " + what);
}

std::optional<std::string> read_and_digest(int fd, const std::function<void(std::string_view)>& each_piece) {
  constexpr size_t kPiece = 1 << 20;
  const std::unique_ptr<char[]> buffer(new char[kPiece]);
  Fnv1a sum;
  int64_t bytes = 0;
  for (;;) {
    size_t filled = 0;  // a piece is filled whole, so that only the last is short
    while (filled < kPiece) {
      const ssize_t n = ::read(fd, buffer.get() + filled, kPiece - filled);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return std::nullopt;
      if (n == 0) break;
      filled += static_cast<size_t>(n);
    }
    if (filled == 0) break;
    const std::string_view piece(buffer.get(), filled);
    sum.add(piece);
    bytes += static_cast<int64_t>(filled);
    if (each_piece) each_piece(piece);
    if (filled < kPiece) break;
  }
  return fmt::format("{} bytes, FNV-1a {:016x}", bytes, sum.hash);
}

std::string file_digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "(not readable)";
  const std::optional<std::string> digest = read_and_digest(fd, nullptr);
  ::close(fd);
  return digest.value_or("(not readable)");
}

MappedFile::MappedFile(const std::string& path, std::string_view what) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd_ >= 0, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  // A throw from the constructor runs no destructor: the fd is closed here.
  const auto fail = [&](const std::string& why) {
    ::close(fd_);
    throw InvalidArgument(fmt::format("cannot map {} '{}' into memory: {}", what, path, why));
  };
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("it is not a regular file");
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (p == MAP_FAILED) fail(fmt::format("{} ({} bytes)", std::strerror(errno), size_));
  data_ = static_cast<unsigned char*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::advise(uint64_t begin, uint64_t end, int advice) const {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  end = std::min(end, size_);
  begin -= begin % page;
  if (data_ && begin < end) ::madvise(data_ + begin, end - begin, advice);
}

void check_not_an_input(const std::string& output, const std::string& what, const std::vector<InputPath>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(output, ec);
  const bool out_exists = fs::exists(output, ec);
  for (const InputPath& input : inputs) {
    if (input.path.empty() || !fs::exists(input.path, ec)) continue;
    const fs::path in = fs::weakly_canonical(input.path, ec);
    const bool same = (out_exists && fs::equivalent(output, input.path, ec)) || out == in;
    MT_CHECK(!same, "{} {} is also {}: writing it would destroy that input; choose another path", what, output,
             input.what);
    if (!out_exists || !fs::is_directory(in, ec)) continue;
    const fs::path inside = out.lexically_relative(in);
    MT_CHECK(inside.empty() || *inside.begin() == "..",
             "{} {} is a file of {} ({}): writing it would destroy that input; choose another path", what, output,
             input.what, input.path);
  }
}

}  // namespace meshtrain
