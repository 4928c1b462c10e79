// `meshtrain tokenize` as a library call: input files to llm.c shards of
// train and validation splits, on many threads, with the same output for
// any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tokenize/corpus.h"
#include "tokenize/shard_writer.h"
#include "tokenize/tokenizer.h"

namespace meshtrain::tokenize {

struct CorpusOptions {
  std::vector<std::string> inputs;  // files and folders (corpus.h)
  std::string out_dir;
  int64_t shard_tokens = 100'000'000;   // llm.c's shard size
  double val_fraction = 0.0;            // of the documents, for the validation split
  uint64_t seed = 0;                    // which documents those are
  std::optional<uint32_t> end_of_text;  // the id before every document; none: no token
  InvalidUtf8 invalid_utf8 = InvalidUtf8::refuse;
  int threads = 1;
  bool overwrite = false;                // replace shards already in out_dir (else refuse)
  size_t chunk_bytes = size_t{1} << 20;  // a longer document is cut where the tokenizer allows
};

struct CorpusProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  int64_t documents = 0, tokens = 0;
  double seconds = 0;
};

struct SplitSummary {
  int64_t documents = 0, tokens = 0;
  std::vector<std::string> shards;
};

struct CorpusSummary {
  int64_t files = 0, empty_documents = 0;
  uint64_t bytes = 0;
  SplitSummary train, val;
  ShardFormat format{};
  double seconds = 0;
};

// Whether document `index` (0-based, in input order) goes to the validation
// split: a hash of (seed, index) under the fraction.
bool in_validation_split(uint64_t seed, int64_t index, double fraction);

// Tokenizes the inputs into out_dir/train_NNNNNN.bin and val_NNNNNN.bin.
// Each document is preceded by end_of_text (as llm.c's scripts write
// shards); an empty one is passed over. `progress` is called from the
// calling thread now and then. Throws for an empty input, an out_dir that is
// an input, shards already there (unless overwrite), and bad text.
CorpusSummary tokenize_corpus(const Tokenizer& tokenizer, const CorpusOptions& options,
                              const std::function<void(const CorpusProgress&)>& progress);

}  // namespace meshtrain::tokenize
