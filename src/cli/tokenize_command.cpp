#include "cli/tokenize_command.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "tokenize/tokenize_corpus.h"

namespace meshtrain::cli {

namespace {

struct TokenizeCommand {
  std::vector<std::string> inputs;
  std::string tokenizer, tokenizer_type = "auto", tokenizer_config, out, eot, invalid_utf8 = "refuse";
  int64_t shard_tokens = 100'000'000;
  double val_fraction = 0.01;
  uint64_t seed = 0;
  int threads = 0;
  bool encode_specials = false, overwrite = false, quiet = false;
};

// What `meshtrain tokenize --help` says after the options.
constexpr const char* kTokenizeFooter =
    "Each .txt file is one document; each line of a .jsonl file is a JSON object whose \"text\" field is one\n"
    "(blank lines are passed over). A folder is searched, with its subfolders, for both, in path order.\n"
    "Tokenizer (--tokenizer FILE; --tokenizer-type auto tells the two kinds apart by content):\n"
    "  tiktoken BPE: one 'base64-token rank' per line (OpenAI's .tiktoken files, Llama 3's tokenizer.model).\n"
    "    Text is split by the pattern (default: Llama 3's, cl100k_base's as first published; a PCRE2 pattern, \\s\n"
    "    meaning Unicode White_Space as in tiktoken), then each piece is merged by rank. Special tokens default to\n"
    "    Llama 3.1's 256, numbered from the count of ranks (<|begin_of_text|>, <|end_of_text|>, ...).\n"
    "    --tokenizer-config FILE.json sets either: {\"pattern\": \"...\", \"special_tokens\": {\"<|endoftext|>\":\n"
    "    100257}}. Special tokens written in the text are ordinary text (tiktoken's encode_ordinary, as llm.c's\n"
    "    scripts tokenize) unless --encode-specials is given.\n"
    "  SentencePiece model (Llama 2, Mistral): ids as its encode(text), no BOS or EOS added.\n"
    "Every document is preceded by the end-of-text token (as llm.c's shards are): --eot NAME|ID|none; by\n"
    "default <|end_of_text|> or <|endoftext|> (tiktoken) or the model's EOS piece (SentencePiece).\n"
    "Output: OUT/train_000000.bin, ... and OUT/val_000000.bin, ... llm.c shards of --shard-tokens tokens\n"
    "(the last of each split shorter; a document may continue into the next shard): uint16 ids (magic\n"
    "20240520, version 1) when the tokenizer's largest id is under 65536, else uint32 (magic 20240801,\n"
    "version 7), as `meshtrain train` reads them; and OUT/tokenize.json, what was done. A shard is held in\n"
    "memory until written (4 bytes a token at most). --val-fraction of the documents, chosen by a hash of\n"
    "--seed and each document's index, go to the validation split. The shards are the same for any\n"
    "--threads (default: every core this process may use; a document over 2 MiB is cut between threads only\n"
    "where the ids stay those of the whole: after a line feed followed by a letter, with the Llama 3 pattern).\n"
    "Text that is not UTF-8 is refused naming the file (and line) and byte; --invalid-utf8 replace instead\n"
    "replaces each invalid sequence by U+FFFD as Python's bytes.decode('utf-8', errors='replace') does, so\n"
    "that the ids equal tiktoken's and sentencepiece's on text Python read that way.\n"
    "Progress goes to stderr (a line updated in place on a terminal, else a line every 10 s); a summary to\n"
    "stdout. Refused: an empty input, an --out that is an input, --out holding shards (unless --overwrite,\n"
    "which also removes its old shards that this run did not write).";

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

tokenize::TokenizerKind kind_of(const std::string& name) {
  if (name == "tiktoken") return tokenize::TokenizerKind::tiktoken;
  if (name == "sentencepiece") return tokenize::TokenizerKind::sentencepiece;
  MT_CHECK(name == "auto", "tokenize --tokenizer-type {}: give auto, tiktoken or sentencepiece", name);
  return tokenize::TokenizerKind::automatic;
}

// The id of --eot (a token's text, an id, or none), or the tokenizer's default.
std::optional<uint32_t> end_of_text(const tokenize::Tokenizer& t, const std::string& eot) {
  if (eot == "none") return std::nullopt;
  if (!eot.empty() && std::all_of(eot.begin(), eot.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    const uint64_t id = std::stoull(eot);
    MT_CHECK(id <= t.max_token_id(), "tokenize --eot {}: the tokenizer's ids go up to {}", eot, t.max_token_id());
    return static_cast<uint32_t>(id);
  }
  const std::optional<std::string> name = eot.empty() ? t.default_end_of_text() : eot;
  MT_CHECK(name, "tokenize: the tokenizer has no end-of-text token of its own; give --eot NAME|ID (or none)");
  const std::optional<uint32_t> id = t.token_id(*name);
  MT_CHECK(id, "tokenize --eot {}: the tokenizer has no token {:?}; give a special token's text, an id, or none", *name,
           *name);
  return id;
}

std::string decimal_amount(double bytes) {
  return bytes >= 1e9 ? fmt::format("{:.2f} GB", bytes / 1e9) : fmt::format("{:.1f} MB", bytes / 1e6);
}

// Prints progress to stderr: in place on a terminal (every 0.2 s), else a line every 10 s.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet) : quiet_(quiet), live_(isatty(STDERR_FILENO) != 0), next_(live_ ? 0.5 : 10.0) {}
  void operator()(const tokenize::CorpusProgress& p) {
    if (quiet_ || p.seconds < next_) return;
    next_ = p.seconds + (live_ ? 0.2 : 10.0);
    const double percent = p.bytes_total ? 100.0 * static_cast<double>(p.bytes_done) / p.bytes_total : 100.0;
    fmt::print(stderr, "{}tokenize: {:5.1f}% of {}, {} documents, {} tokens, {:.0f} tokens/s{}", live_ ? "\r" : "",
               percent, decimal_amount(static_cast<double>(p.bytes_total)), p.documents, p.tokens,
               static_cast<double>(p.tokens) / std::max(p.seconds, 1e-9), live_ ? "  " : "\n");
    shown_ = true;
  }
  void end() {
    if (shown_ && live_) fmt::print(stderr, "\n");
  }

 private:
  bool quiet_, live_, shown_ = false;
  double next_;  // seconds: nothing is shown for a run shorter than the first
};

nlohmann::ordered_json split_json(const tokenize::SplitSummary& s) {
  std::vector<std::string> names;
  for (const std::string& p : s.shards) names.push_back(std::filesystem::path(p).filename().string());
  return {{"documents", s.documents}, {"tokens", s.tokens}, {"shards", names}};
}

void write_record(const TokenizeCommand& c, const tokenize::Tokenizer& t, const tokenize::CorpusOptions& o,
                  const tokenize::CorpusSummary& s) {
  const nlohmann::ordered_json record{
      {"tokenizer", c.tokenizer},
      {"tokenizer_description", t.describe()},
      {"max_token_id", t.max_token_id()},
      {"end_of_text", o.end_of_text ? nlohmann::ordered_json(*o.end_of_text) : nlohmann::ordered_json(nullptr)},
      {"shard_format", {{"magic", s.format.magic}, {"version", s.format.version}, {"bytes_per_token", s.format.width}}},
      {"shard_tokens", o.shard_tokens},
      {"val_fraction", o.val_fraction},
      {"seed", o.seed},
      {"input_files", s.files},
      {"input_bytes", s.bytes},
      {"empty_documents", s.empty_documents},
      {"train", split_json(s.train)},
      {"val", split_json(s.val)}};
  write_file_atomically(o.out_dir + "/tokenize.json", record.dump(1) + "\n");
}

int run_tokenize(const TokenizeCommand& c) {
  MT_CHECK(c.invalid_utf8 == "refuse" || c.invalid_utf8 == "replace",
           "tokenize --invalid-utf8 {}: give refuse or replace", c.invalid_utf8);
  MT_CHECK(c.threads >= 0, "tokenize --threads {}: give a count, or 0 for every core", c.threads);
  check_not_an_input(c.out, "--out",
                     {{c.tokenizer, "the --tokenizer file"}, {c.tokenizer_config, "the --tokenizer-config file"}});
  const auto tokenizer =
      tokenize::load_tokenizer(c.tokenizer, kind_of(c.tokenizer_type), c.tokenizer_config, c.encode_specials);
  tokenize::CorpusOptions o;
  o.inputs = c.inputs, o.out_dir = c.out, o.shard_tokens = c.shard_tokens, o.val_fraction = c.val_fraction;
  o.seed = c.seed, o.end_of_text = end_of_text(*tokenizer, c.eot), o.overwrite = c.overwrite;
  o.invalid_utf8 = c.invalid_utf8 == "replace" ? tokenize::InvalidUtf8::replace : tokenize::InvalidUtf8::refuse;
  o.threads = c.threads > 0 ? c.threads : usable_cores();
  ProgressLine progress(c.quiet);
  const tokenize::CorpusSummary s =
      tokenize::tokenize_corpus(*tokenizer, o, [&](const tokenize::CorpusProgress& p) { progress(p); });
  progress.end();
  write_record(c, *tokenizer, o, s);
  const int64_t tokens = s.train.tokens + s.val.tokens;
  fmt::print("{}\n", tokenizer->describe());
  fmt::print("tokenized {} documents ({} of {} files) into {} tokens in {:.1f} s on {} threads: {:.0f} tokens/s\n",
             s.train.documents + s.val.documents, decimal_amount(static_cast<double>(s.bytes)), s.files, tokens,
             s.seconds, o.threads, static_cast<double>(tokens) / std::max(s.seconds, 1e-9));
  fmt::print(
      "train: {} documents, {} tokens in {} shards; val: {} documents, {} tokens in {} shards ({}-bit ids) in {}\n",
      s.train.documents, s.train.tokens, s.train.shards.size(), s.val.documents, s.val.tokens, s.val.shards.size(),
      8 * s.format.width, c.out);
  if (s.empty_documents > 0) fmt::print("passed over {} empty documents\n", s.empty_documents);
  if (s.val.tokens == 0 && o.val_fraction > 0)
    fmt::print("note: no document went to the validation split (--val-fraction {} of {} documents)\n", o.val_fraction,
               s.train.documents);
  if (s.train.tokens == 0) fmt::print("note: no document went to the train split\n");
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto c = std::make_shared<TokenizeCommand>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text files or JSON lines into llm.c .bin token shards (train and validation splits) with a "
      "tiktoken BPE file or a SentencePiece model: meshtrain tokenize INPUT... --tokenizer FILE --out DIR");
  cmd->footer(kTokenizeFooter);
  cmd->add_option("inputs", c->inputs, "Text (.txt), JSON lines (.jsonl) or folders of them")
      ->required()
      ->type_name("INPUT");
  cmd->add_option("--tokenizer", c->tokenizer, "A tiktoken BPE file or a SentencePiece model")
      ->required()
      ->type_name("FILE");
  cmd->add_option("--out", c->out, "The folder the shards go to (made if missing)")->required()->type_name("DIR");
  cmd->add_option("--tokenizer-type", c->tokenizer_type, "auto, tiktoken or sentencepiece")
      ->capture_default_str()
      ->type_name("KIND");
  cmd->add_option("--tokenizer-config", c->tokenizer_config,
                  "JSON with the split \"pattern\" and \"special_tokens\" of a tiktoken file")
      ->type_name("FILE");
  cmd->add_option("--shard-tokens", c->shard_tokens, "Tokens a shard holds")->capture_default_str()->type_name("N");
  cmd->add_option("--val-fraction", c->val_fraction, "Fraction of the documents held out for validation")
      ->capture_default_str()
      ->type_name("F");
  cmd->add_option("--seed", c->seed, "Which documents are held out")->capture_default_str()->type_name("N");
  cmd->add_option("--eot", c->eot, "The token before each document: its text, an id, or none")->type_name("TOKEN");
  cmd->add_flag("--encode-specials", c->encode_specials, "Special tokens in the text become their ids (tiktoken)");
  cmd->add_option("--invalid-utf8", c->invalid_utf8, "refuse, or replace (by U+FFFD, as Python does)")
      ->capture_default_str()
      ->type_name("MODE");
  cmd->add_option("--threads", c->threads, "Threads (0: every core this process may use)")
      ->capture_default_str()
      ->type_name("N");
  cmd->add_flag("--overwrite", c->overwrite, "Replace the shards already in --out");
  cmd->add_flag("--quiet", c->quiet, "No progress on stderr");
  return {cmd, [c] { return run_tokenize(*c); }};
}

}  // namespace meshtrain::cli
