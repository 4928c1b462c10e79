// Files written whole or not at all: the bytes go to a temporary beside the
// file, are flushed to the disk and renamed over it. Any failure (opening,
// a write on a full disk, the flush, the close, the rename) removes the
// temporary and throws naming the file, and an earlier file of that name is
// left as it was. A path that names anything but a regular file (a folder,
// a device such as /dev/null, a FIFO) is refused before anything is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // not committed: the temporary is removed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  void commit();  // flush to disk, close, rename over the path

 private:
  [[noreturn]] void fail(const std::string& what, int error);
  std::string path_, temporary_;
  int fd_ = -1;
};

// The whole of the file at `path`, at most `max_bytes` of it; throws naming
// `what` (e.g. "parallel.pp_schedule_csv") and the path when it cannot be
// read or is larger.
std::string read_small_file(const std::string& path, size_t max_bytes, std::string_view what);

// `text` as the whole of `path`, through an AtomicFile.
void write_file_atomically(const std::string& path, std::string_view text);

// Throws naming `what` (e.g. "checkpoint.folder") when a file cannot be
// created in `dir` (made if missing): checked before work whose results go there.
void check_writable_directory(const std::string& dir, const std::string& what);
// The same for a file to be written at `path`: a path that is not empty nor a
// folder, in a folder where a file can be created.
void check_output_file(const std::string& path, const std::string& what);

// "N bytes, FNV-1a HHHHHHHHHHHHHHHH" of a file's contents (read in 1 MiB
// pieces), or "(not readable)": two files of one size but other bytes differ.
std::string file_digest(const std::string& path);
// Reads `fd` from its offset to the end once, handing `each_piece` the bytes
// in order in pieces of exactly 1 MiB (the last shorter; it may be null), and
// returns file_digest's string of them; nullopt when a read fails.
std::optional<std::string> read_and_digest(int fd, const std::function<void(std::string_view)>& each_piece);

// A file mapped read-only whole (nothing for an empty file), unmapped and
// closed when destroyed; its fd stays open for a streamed read of the same
// file. Throws naming `what` ("data file") and the path when it cannot be.
class MappedFile {
 public:
  MappedFile(const std::string& path, std::string_view what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  // madvise(`advice`: MADV_SEQUENTIAL, MADV_DONTNEED...) for the pages that
  // hold bytes [begin, end) of the mapping; advice only: a failure is ignored.
  void advise(uint64_t begin, uint64_t end, int advice) const;

 private:
  unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
};

// Something a command reads that an output must not replace: a file, or a
// folder whose files it must not replace. `what` names it ("data.path").
struct InputPath {
  std::string path;
  std::string what;
};
// Throws InvalidArgument when writing `output` (called `what`, "--out")
// would replace one of `inputs`: the same file by any name (links
// followed), the folder itself, or a file that exists in an input folder.
// Inputs that do not exist are passed over.
void check_not_an_input(const std::string& output, const std::string& what, const std::vector<InputPath>& inputs);

}  // namespace meshtrain
