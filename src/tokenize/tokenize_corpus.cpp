#include "tokenize/tokenize_corpus.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <regex>
#include <thread>

#include "core/error.h"
#include "core/file_io.h"

namespace meshtrain::tokenize {

namespace fs = std::filesystem;

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Runs fn(i, worker) for i in [0, n) on `threads` threads, the caller's
// (worker 0) calling `step` after each of its own; rethrows the error of
// the lowest i that failed (the same whatever the thread count).
void parallel_for(size_t n, int threads, const std::function<void(size_t, int)>& fn,
                  const std::function<void()>& step) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  size_t first_failure = n;
  std::exception_ptr error;
  const auto work = [&](int worker) {
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      try {
        fn(i, worker);
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (i < first_failure) first_failure = i, error = std::current_exception();
        failed.store(true);
      }
      if (worker == 0) step();
    }
  };
  std::vector<std::jthread> helpers;
  for (int w = 1; w < std::min<int64_t>(threads, static_cast<int64_t>(n)); ++w) helpers.emplace_back(work, w);
  work(0);
  helpers.clear();  // joins
  if (error) std::rethrow_exception(error);
}

bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec)) return true;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// The shards (train_NNNNNN.bin, val_NNNNNN.bin) in `dir`.
std::vector<fs::path> shards_in(const std::string& dir) {
  static const std::regex name(R"((train|val)_[0-9]{6,}\.bin)");
  std::vector<fs::path> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (std::regex_match(e.path().filename().string(), name)) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  return found;
}

void prepare_out_dir(const CorpusOptions& o) {
  MT_CHECK(!o.out_dir.empty(), "--out: give the folder the shards go to");
  for (const std::string& input : o.inputs)
    MT_CHECK(!same_path(o.out_dir, input),
             "--out {} is also the input {}: the shards would go among the text they come from; choose another folder",
             o.out_dir, input);
  MT_CHECK(!fs::exists(o.out_dir) || fs::is_directory(o.out_dir), "--out {} exists and is not a folder", o.out_dir);
  const std::vector<fs::path> old = shards_in(o.out_dir);
  MT_CHECK(o.overwrite || old.empty(),
           "--out {} holds shards already ({}{}); give --overwrite to replace them, or another folder", o.out_dir,
           old.empty() ? "" : old.front().filename().string(),
           old.size() > 1 ? fmt::format(" and {} more", old.size() - 1) : "");
  check_writable_directory(o.out_dir, "--out");
}

// A part of a document to encode: the text's bytes [begin, end).
struct Item {
  size_t doc, begin, end;
};

// Each document whole, or cut where the tokenizer allows into parts of about `chunk` bytes.
std::vector<Item> items_of(const std::vector<std::string>& texts, const Tokenizer& tokenizer, size_t chunk) {
  std::vector<Item> items;
  for (size_t d = 0; d < texts.size(); ++d) {
    const std::string_view text = texts[d];
    size_t begin = 0;
    while (text.size() - begin > 2 * chunk) {
      const size_t cut = tokenizer.cut_point(text, begin + chunk);
      if (cut == std::string_view::npos || cut >= text.size()) break;
      items.push_back({d, begin, cut});
      begin = cut;
    }
    items.push_back({d, begin, text.size()});
  }
  return items;
}

}  // namespace

bool in_validation_split(uint64_t seed, int64_t index, double fraction) {
  if (fraction <= 0) return false;
  const uint64_t h = splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(index));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

namespace {

// One call of tokenize_corpus: batches of documents read, made text,
// encoded on the threads, then written in input order.
class CorpusRun {
 public:
  CorpusRun(const Tokenizer& tokenizer, const CorpusOptions& o,
            const std::function<void(const CorpusProgress&)>& progress)
      : tokenizer_(tokenizer),
        o_(o),
        progress_(progress),
        inputs_(find_inputs(o.inputs)),
        threads_(std::max(1, o.threads)),
        train_(o.out_dir, "train", o.shard_tokens, tokenizer.max_token_id()),
        val_(o.out_dir, "val", o.shard_tokens, tokenizer.max_token_id()) {
    summary_.files = static_cast<int64_t>(inputs_.size());
    for (const InputFile& f : inputs_) summary_.bytes += f.bytes;
    summary_.format = llmc_shard_format_for(tokenizer.max_token_id());
    for (int t = 0; t < threads_; ++t) encoders_.push_back(tokenizer.encoder());
  }

  CorpusSummary run() {
    prepare_out_dir(o_);
    DocumentReader reader(inputs_);
    std::vector<RawDocument> raw;
    const size_t batch_bytes = std::max<size_t>(16 << 20, static_cast<size_t>(threads_) * (4 << 20));
    while (reader.next_batch(raw, batch_bytes)) {
      std::vector<uint64_t> raw_bytes;
      for (const RawDocument& doc : raw) raw_bytes.push_back(doc.bytes.size() + (doc.line > 0 ? 1 : 0));
      const std::vector<std::string> texts = texts_of(raw);
      const std::vector<Item> items = items_of(texts, tokenizer_, o_.chunk_bytes);
      write(texts, items, encode(texts, items, raw_bytes));
      raw.clear();
      report();
    }
    finish();
    summary_.seconds = seconds();
    return summary_;
  }

 private:
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  void report() {
    progress_({bytes_done_.load(), summary_.bytes, documents_, tokens_done_.load() + train_.tokens() + val_.tokens(),
               seconds()});
  }

  std::vector<std::string> texts_of(std::vector<RawDocument>& raw) {
    std::vector<std::string> texts(raw.size());
    parallel_for(
        raw.size(), threads_,
        [&](size_t i, int) { texts[i] = document_text(raw[i], inputs_[raw[i].file], o_.invalid_utf8); }, [] {});
    return texts;
  }

  // Each item's ids; the progress counts each item's share of its document's bytes in the file.
  std::vector<std::vector<uint32_t>> encode(const std::vector<std::string>& texts, const std::vector<Item>& items,
                                            const std::vector<uint64_t>& raw_bytes) {
    std::vector<std::vector<uint32_t>> ids(items.size());
    const auto encode_item = [&](size_t i, int worker) {
      const Item& item = items[i];
      const std::string_view text = texts[item.doc];
      encoders_[worker]->encode(text.substr(item.begin, item.end - item.begin), ids[i]);
      bytes_done_ += text.empty() ? raw_bytes[item.doc] : raw_bytes[item.doc] * (item.end - item.begin) / text.size();
      tokens_done_ += static_cast<int64_t>(ids[i].size());
    };
    parallel_for(items.size(), threads_, encode_item, [&] { report(); });
    return ids;
  }

  // Each document's end-of-text and ids to its split's shards, in input order.
  void write(const std::vector<std::string>& texts, const std::vector<Item>& items,
             const std::vector<std::vector<uint32_t>>& ids) {
    size_t next = 0;
    for (size_t d = 0; d < texts.size(); ++d, ++documents_) {
      const bool held_out = in_validation_split(o_.seed, documents_, o_.val_fraction);
      if (texts[d].empty()) {
        ++summary_.empty_documents, ++next;
        continue;
      }
      ShardWriter& writer = held_out ? val_ : train_;
      (held_out ? summary_.val : summary_.train).documents++;
      if (o_.end_of_text) writer.append(std::span<const uint32_t>(&*o_.end_of_text, 1));
      for (; next < items.size() && items[next].doc == d; ++next) {
        writer.append(ids[next]);
        tokens_done_ -= static_cast<int64_t>(ids[next].size());
      }
    }
  }

  void finish() {
    MT_CHECK(train_.tokens() + val_.tokens() > 0,
             "the input holds no text to tokenize: {} file(s) of {} bytes, {} document(s), all empty", inputs_.size(),
             summary_.bytes, documents_);
    train_.finish();
    val_.finish();
    summary_.train.tokens = train_.tokens(), summary_.train.shards = train_.paths();
    summary_.val.tokens = val_.tokens(), summary_.val.shards = val_.paths();
    if (!o_.overwrite) return;
    std::vector<std::string> written = train_.paths();
    written.insert(written.end(), val_.paths().begin(), val_.paths().end());
    for (const fs::path& old : shards_in(o_.out_dir))
      if (std::none_of(written.begin(), written.end(), [&](const std::string& w) { return same_path(w, old); }))
        fs::remove(old);
  }

  const Tokenizer& tokenizer_;
  const CorpusOptions& o_;
  const std::function<void(const CorpusProgress&)>& progress_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const std::vector<InputFile> inputs_;
  const int threads_;
  std::vector<std::unique_ptr<Encoder>> encoders_;
  ShardWriter train_, val_;
  CorpusSummary summary_;
  std::atomic<uint64_t> bytes_done_{0};
  std::atomic<int64_t> tokens_done_{0};  // encoded, not yet written
  int64_t documents_ = 0;
};

}  // namespace

CorpusSummary tokenize_corpus(const Tokenizer& tokenizer, const CorpusOptions& options,
                              const std::function<void(const CorpusProgress&)>& progress) {
  MT_CHECK(options.val_fraction >= 0 && options.val_fraction <= 1, "--val-fraction {}: a fraction in [0, 1]",
           options.val_fraction);
  return CorpusRun(tokenizer, options, progress).run();
}

}  // namespace meshtrain::tokenize
