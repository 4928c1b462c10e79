#include "train/data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "core/hash.h"
#include "core/llmc_shard.h"

namespace meshtrain::train {

namespace {
namespace fs = std::filesystem;
using ShardFormat = LlmcShardFormat;
constexpr const auto& kShardFormats = kLlmcShardFormats;
constexpr uint64_t kHeaderBytes = kLlmcHeaderBytes;
constexpr uint64_t kReleaseStride = 64 << 20;

std::string supported_shards() {
  return fmt::format("version {} of magic {} ({}) or version {} of magic {} ({})", kShardFormats[0].version,
                     kShardFormats[0].magic, kShardFormats[0].name, kShardFormats[1].version, kShardFormats[1].magic,
                     kShardFormats[1].name);
}

bool is_glob(const std::string& path) { return path.find_first_of("*?[") != std::string::npos; }

// The sorted matches of glob pattern `pattern`; sets `rc` to glob(3)'s return.
std::vector<std::string> matches_of(const std::string& pattern, int& rc) {
  glob_t g{};
  rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

// The sorted matches of glob pattern `pattern` that are regular files.
std::vector<std::string> glob_files(const std::string& pattern, const std::string& key) {
  int rc = 0;
  const std::vector<std::string> out = matches_of(pattern, rc);
  MT_CHECK(rc == 0 || rc == GLOB_NOMATCH, "{} {}: the glob failed (glob(3) error {})", key, pattern, rc);
  MT_CHECK(!out.empty(), "{} {}: the glob matches no file", key, pattern);
  for (const std::string& f : out)
    MT_CHECK(fs::is_regular_file(f), "{} {}: {} is not a file; a glob must match token shards only", key, pattern, f);
  return out;
}

// The sorted .bin files of directory `dir`; refuses meshtrain tokenize's output folder whole (its train_ and val_
// shards), suggesting the glob of the split `key` reads (validation.path: val_, else train_).
std::vector<std::string> directory_shards(const std::string& dir, const std::string& key) {
  std::vector<std::string> out;
  bool train = false, val = false;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".bin") continue;
    out.push_back(e.path().string());
    const std::string name = e.path().filename().string();
    train = train || name.starts_with("train_");
    val = val || name.starts_with("val_");
  }
  MT_CHECK(!out.empty(), "{} {} is a directory with no .bin token shard in it", key, dir);
  const bool validation = key == "validation.path";
  MT_CHECK(!(train && val),
           "{} {} holds both train_ and val_ shards (meshtrain tokenize's splits); give the {} split's, {} = \"{}\"",
           key, dir, validation ? "validation" : "training", key,
           (fs::path(dir) / (validation ? "val_*.bin" : "train_*.bin")).string());
  std::sort(out.begin(), out.end());
  return out;
}

// The files `path` names: itself, a directory's .bin shards or a glob's matches.
std::vector<std::string> list_files(const std::string& path, const std::string& key) {
  if (fs::is_directory(path)) return directory_shards(path, key);
  if (!fs::exists(path) && is_glob(path)) return glob_files(path, key);
  MT_CHECK(fs::exists(path), "data file '{}' does not exist", path);
  MT_CHECK(fs::is_regular_file(path),
           "data file '{}' is not a file; give a .txt file, an llm.c .bin token shard, a directory of shards or a "
           "glob of them",
           path);
  return {path};
}

// An open file descriptor, closed with it.
struct Fd {
  int fd;
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    MT_CHECK(fd >= 0, "cannot open data file '{}': {}", path, std::strerror(errno));
  }
  ~Fd() { ::close(fd); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  uint64_t size() const {
    struct stat st {};
    MT_CHECK(::fstat(fd, &st) == 0, "cannot stat a data file: {}", std::strerror(errno));
    return static_cast<uint64_t>(st.st_size);
  }
};

// The format of the llm.c shard at `path` (`size` bytes, starting with `header`) after its header's checks; sets
// the token count.
const ShardFormat& check_llmc_header(const std::string& path, uint64_t size, const int32_t (&header)[3],
                                     int64_t& count) {
  MT_CHECK(size >= kHeaderBytes, "data file {}: {} bytes is shorter than the 1024-byte llm.c header", path, size);
  const auto* format = std::find_if(std::begin(kShardFormats), std::end(kShardFormats),
                                    [&](const ShardFormat& f) { return f.magic == header[0]; });
  MT_CHECK(format != std::end(kShardFormats), "data file {}: bad magic {} (an llm.c token shard starts with {} or {})",
           path, header[0], kShardFormats[0].magic, kShardFormats[1].magic);
  MT_CHECK(header[1] == format->version,
           "data file {}: llm.c shard version {} of magic {} is not supported (expected {}; supported: {})", path,
           header[1], header[0], format->version, supported_shards());
  MT_CHECK(header[2] >= 0, "data file {}: the llm.c header gives a token count of {}; a shard holds 0 or more", path,
           header[2]);
  const uint64_t tokens = static_cast<uint64_t>(header[2]), bytes = tokens * format->width,
                 follow = size - kHeaderBytes;
  MT_CHECK(follow >= bytes,
           "data file {} is truncated: the header says {} tokens ({} bytes) but only {} bytes follow it", path, tokens,
           bytes, follow);
  MT_CHECK(follow == bytes,
           "data file {}: the header says {} tokens ({} bytes) but {} bytes follow it: {} bytes past the shard "
           "(shards appended to one file?); give one llm.c shard per file",
           path, tokens, bytes, follow, follow - bytes);
  count = static_cast<int64_t>(tokens);
  return *format;
}

// The largest of the `count` tokens of type T at `bytes`: a loop the compiler vectorises.
template <typename T>
T max_of(const char* bytes, size_t count) {
  T largest = 0;
  for (size_t i = 0; i < count; ++i) {
    T t;
    std::memcpy(&t, bytes + i * sizeof(T), sizeof(T));
    largest = std::max(largest, t);
  }
  return largest;
}

int64_t max_token_of(const char* bytes, size_t count, uint64_t width) {
  if (width == 1) return max_of<uint8_t>(bytes, count);
  if (width == 2) return max_of<uint16_t>(bytes, count);
  MT_ASSERT(width == 4, "no tokens of {} bytes", width);
  return max_of<uint32_t>(bytes, count);
}

template <typename T>
void widen(const unsigned char* bytes, int64_t count, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    T t;
    std::memcpy(&t, bytes + i * sizeof(T), sizeof(T));
    out[i] = t;
  }
}

// A shard's format as the dataset compares them: header bytes and token width (and the magic and version).
struct Format {
  uint64_t header = 0, width = 1;
  int32_t magic = 0, version = 0;
  std::string text() const {
    return magic == 0 ? std::string("bytes (.txt)") : fmt::format("llm.c magic {} version {}", magic, version);
  }
  bool operator==(const Format&) const = default;
};

// Reads shard `s` once (streamed, not mapped): checks its header, its digest and largest token.
Format scan_shard(TokenDataset::Shard& s, bool text) {
  Fd file(s.path);
  const uint64_t size = file.size();
  Format f;
  if (text) {
    s.tokens = static_cast<int64_t>(size);
  } else {
    int32_t header[3] = {};
    if (size >= sizeof(header))
      MT_CHECK(::pread(file.fd, header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)),
               "data file {}: could not read its header: {}", s.path, std::strerror(errno));
    const ShardFormat& format = check_llmc_header(s.path, size, header, s.tokens);
    f = {kHeaderBytes, format.width, format.magic, format.version};
  }
  const uint64_t end = f.header + static_cast<uint64_t>(s.tokens) * f.width;
  uint64_t at = 0;  // the bytes read so far
  const std::optional<std::string> digest = read_and_digest(file.fd, [&](std::string_view piece) {
    const uint64_t start = at;  // the piece's offset in the file
    at += piece.size();
    const uint64_t from = std::max(start, f.header), to = std::min(at, end);
    if (from < to)  // whole tokens: pieces of 1 MiB but the last, the header 1024 bytes
      s.max_token = std::max(s.max_token, max_token_of(piece.data() + (from - start), (to - from) / f.width, f.width));
  });
  MT_CHECK(digest, "data file {}: could not read its {} bytes: {}", s.path, size, std::strerror(errno));
  MT_CHECK(at == size, "data file {} changed while it was read: {} bytes, then {}", s.path, size, at);
  s.digest = *digest;
  return f;
}

// splitmix64: a seed's bits spread, so that nearby seeds and epochs draw unrelated orders.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A draw in [0, bound) from `rng`, without modulo bias (rejection), the same on every platform.
uint64_t below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  for (;;)
    if (const uint64_t r = rng(); r < limit) return r % bound;
}
}  // namespace

std::vector<std::string> glob_matches(const std::string& path) {
  std::error_code ec;
  if (!is_glob(path) || fs::exists(path, ec)) return {};
  int rc = 0;
  return matches_of(path, rc);
}

TokenDataset::TokenDataset(const std::string& path, int64_t batch, int64_t seq_len, int64_t seed,
                           const std::string& key)
    : key_(key), batch_(batch), seq_len_(seq_len), seed_(seed) {
  list_and_scan(path);
  const int64_t n = batch * seq_len;
  if (shards_.size() == 1)
    MT_CHECK(shards_[0].tokens >= n + 1,
             "data file {} holds {} tokens, fewer than one batch needs (batch_size {} x seq_len {} + 1)", path,
             shards_[0].tokens, batch, seq_len);
  int64_t longest = 0;
  for (const Shard& s : shards_) longest = std::max(longest, s.tokens);
  MT_CHECK(longest >= n + 1,
           "{} {}: no shard holds one batch (batch_size {} x seq_len {} + 1 tokens); the longest holds {}", key_, path,
           batch, seq_len, longest);
  order_ = order(0);
  while (batches_in(current()) == 0) ++place_;  // a shard shorter than a batch is passed over
}

TokenDataset::~TokenDataset() = default;

void TokenDataset::list_and_scan(const std::string& path) {
  const std::vector<std::string> files = list_files(path, key_);
  const bool one = files.size() == 1, text = one && fs::path(files[0]).extension() != ".bin";
  std::set<std::string> names;
  for (const std::string& f : files) names.insert(fs::path(f).filename().string());
  std::optional<Format> first;
  for (const std::string& f : files) {
    MT_CHECK(one || fs::path(f).extension() == ".bin",
             "{} {}: {} is not an llm.c .bin shard; a .txt file is read only alone", key_, path, f);
    Shard& s = shards_.emplace_back();
    s.path = f;
    s.name = names.size() == files.size() ? fs::path(f).filename().string() : f;
    const Format format = scan_shard(s, text);
    if (!first) first = format;
    MT_CHECK(format == *first, "{} {}: shard {} is {} but shard {} is {}: every shard must have one format", key_, path,
             s.name, format.text(), shards_[0].name, first->text());
  }
  header_ = first->header;
  width_ = first->width;
  if (one) {
    digest_ = shards_[0].digest;
    return;
  }
  Fnv1a sum;
  for (const Shard& s : shards_) sum.add(s.name + '\t' + s.digest + '\n');
  digest_ = fmt::format("{} shards, FNV-1a {:016x} of their names and digests", shards_.size(), sum.hash);
}

int64_t TokenDataset::num_tokens() const {
  int64_t n = 0;
  for (const Shard& s : shards_) n += s.tokens;
  return n;
}

int64_t TokenDataset::max_token() const {
  int64_t m = -1;
  for (const Shard& s : shards_) m = std::max(m, s.max_token);
  return m;
}

void TokenDataset::check_vocabulary(int64_t vocab_size) const {
  for (const Shard& s : shards_)
    MT_CHECK(s.max_token < vocab_size, "data file {} holds token {} but model.vocab_size is {}", s.path, s.max_token,
             vocab_size);
}

int64_t TokenDataset::batches_in(int64_t s) const {
  return std::max<int64_t>(0, (shards_[static_cast<size_t>(s)].tokens - 1) / (batch_ * seq_len_));
}

std::vector<int64_t> TokenDataset::order(int64_t epoch) const {
  std::vector<int64_t> out(shards_.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(i);
  if (out.size() < 2) return out;
  std::mt19937_64 rng(mix(mix(static_cast<uint64_t>(seed_)) ^ static_cast<uint64_t>(epoch)));
  for (size_t i = out.size() - 1; i > 0; --i) std::swap(out[i], out[below(rng, i + 1)]);  // Fisher-Yates
  return out;
}

DataCursor TokenDataset::cursor() const {
  return {epoch_, place_, shards_[static_cast<size_t>(current())].name, offset_};
}

void TokenDataset::set_cursor(const DataCursor& c) {
  const int64_t n = batch_ * seq_len_, count = static_cast<int64_t>(shards_.size());
  MT_CHECK(c.epoch >= 0 && c.shard_index >= 0 && c.shard_index < count,
           "data cursor: epoch {}, shard {} of {}: out of range for data.path's {} shards", c.epoch, c.shard_index,
           count, count);
  std::vector<int64_t> order_then = order(c.epoch);
  const Shard& s = shards_[static_cast<size_t>(order_then[static_cast<size_t>(c.shard_index)])];
  // One file is known by its contents alone (its digest), as before datasets of shards: a renamed one resumes.
  if (!c.shard.empty() && c.shard != s.name && count > 1) {
    const bool known = std::any_of(shards_.begin(), shards_.end(), [&](const Shard& x) { return x.name == c.shard; });
    MT_CHECK(known, "data cursor names shard '{}', which is not in data.path (its {} shards)", c.shard, count);
    throw InvalidArgument(fmt::format(
        "data cursor names shard '{}' at place {} of epoch {}, where this dataset's order has '{}': the shards or "
        "training.seed changed since the checkpoint",
        c.shard, c.shard_index, c.epoch, s.name));
  }
  MT_CHECK(c.offset >= 0 && c.offset % n == 0 && c.offset + n + 1 <= s.tokens,
           "data cursor {} is not where a batch of {} tokens starts in {} tokens of data: the data file or "
           "data.batch_size x data.seq_len changed since the checkpoint",
           c.offset, n, s.tokens);
  order_ = std::move(order_then);
  epoch_ = c.epoch;
  place_ = c.shard_index;
  offset_ = c.offset;
  map_.reset();
  mapped_ = -1;
  released_ = 0;
}

const MappedFile& TokenDataset::mapped() {
  const Shard& s = shards_[static_cast<size_t>(current())];
  if (mapped_ != current()) {
    map_.reset();  // one shard mapped at a time
    map_ = std::make_unique<MappedFile>(s.path, "data file");
    mapped_ = current();
    released_ = 0;
    map_->advise(0, map_->size(), MADV_SEQUENTIAL);
  }
  // A file cut short under a mapping would end the run with SIGBUS: a clear error instead.
  struct stat st {};
  MT_CHECK(::fstat(map_->fd(), &st) == 0 && static_cast<uint64_t>(st.st_size) == byte_of(s.tokens) &&
               map_->size() == byte_of(s.tokens),
           "data file {} changed while training: {} bytes when read, {} now", s.path, byte_of(s.tokens), st.st_size);
  return *map_;
}

void TokenDataset::read_rows(const MappedFile& file, int64_t first, int64_t count, int64_t* out) const {
  const unsigned char* bytes = file.data() + byte_of(first);
  if (width_ == 1) widen<uint8_t>(bytes, count, out);
  if (width_ == 2) widen<uint16_t>(bytes, count, out);
  if (width_ == 4) widen<uint32_t>(bytes, count, out);
}

void TokenDataset::next(Tensor& inputs, Tensor& targets, std::span<const RowRange> rows) {
  const int64_t n = batch_ * seq_len_;
  auto in = inputs.data<int64_t>(), out = targets.data<int64_t>();
  MT_CHECK(static_cast<int64_t>(in.size()) == n && static_cast<int64_t>(out.size()) == n,
           "TokenDataset::next: batch tensors must hold {} tokens", n);
  const RowRange all{0, batch_};
  if (rows.empty()) rows = {&all, 1};
  const MappedFile& file = mapped();
  for (const RowRange& r : rows) {
    MT_ASSERT(0 <= r.begin && r.begin <= r.end && r.end <= batch_, "rows [{}, {}) of a batch of {}", r.begin, r.end,
              batch_);
    const int64_t first = offset_ + r.begin * seq_len_, count = (r.end - r.begin) * seq_len_;
    read_rows(file, first, count, in.data() + r.begin * seq_len_);
    read_rows(file, first + 1, count, out.data() + r.begin * seq_len_);
    if (observer_ && count > 0) observer_(current(), first, count);
  }
  advance();
}

void TokenDataset::advance() {
  offset_ += batch_ * seq_len_;
  if (offset_ / (batch_ * seq_len_) < batches_in(current())) return release_behind(false);
  const int64_t was = current();
  offset_ = 0;
  do {
    if (++place_ == static_cast<int64_t>(order_.size())) {
      order_ = order(++epoch_);
      place_ = 0;
    }
  } while (batches_in(current()) == 0);
  if (current() == was) return release_behind(true);  // one shard: wrapped
  map_.reset();                                       // unmapped: its pages are given back
  mapped_ = -1;
}

void TokenDataset::release_behind(bool wrapped) {
  const uint64_t upto = wrapped ? map_->size() : byte_of(offset_);
  if (upto >= released_ + kReleaseStride) {
    map_->advise(released_, upto, MADV_DONTNEED);
    released_ = upto;
  }
  if (wrapped) released_ = 0;
}

namespace {
// The path, once it names a regular file.
const std::string& existing_file(const std::string& path) {
  MT_CHECK(fs::exists(path), "data file '{}' does not exist", path);
  MT_CHECK(fs::is_regular_file(path), "data file '{}' is not a file; give a .txt file or an llm.c .bin token shard",
           path);
  return path;
}
}  // namespace

TokenLoader::TokenLoader(const std::string& path, int64_t batch, int64_t seq_len)
    : data_(existing_file(path), batch, seq_len) {
  MT_CHECK(data_.shards().size() == 1, "data file {}: TokenLoader reads one file, not {} shards", path,
           data_.shards().size());
}

}  // namespace meshtrain::train
