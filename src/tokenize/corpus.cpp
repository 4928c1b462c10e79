#include "tokenize/corpus.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenize/utf8.h"

namespace meshtrain::tokenize {

namespace fs = std::filesystem;

namespace {

bool is_text(const fs::path& p) { return p.extension() == ".txt"; }
bool is_json_lines(const fs::path& p) { return p.extension() == ".jsonl"; }

InputFile input_of(const fs::path& p) { return {p.string(), is_json_lines(p), fs::file_size(p)}; }

std::vector<InputFile> inputs_in_folder(const std::string& dir) {
  std::vector<fs::path> found;
  for (const fs::directory_entry& e :
       fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink))
    if (e.is_regular_file() && (is_text(e.path()) || is_json_lines(e.path()))) found.push_back(e.path());
  MT_CHECK(!found.empty(), "input folder {} holds no .txt or .jsonl files (searched with its subfolders)", dir);
  std::sort(found.begin(), found.end());
  std::vector<InputFile> inputs;
  for (const fs::path& p : found) inputs.push_back(input_of(p));
  return inputs;
}

std::string bytes_at(std::string_view text, size_t at) {
  std::string hex;
  for (size_t i = at; i < std::min(text.size(), at + 4); ++i)
    hex += fmt::format("{}{:02X}", hex.empty() ? "" : " ", static_cast<unsigned char>(text[i]));
  return hex;
}

std::string where(const RawDocument& doc, const InputFile& file) {
  return doc.line > 0 ? fmt::format("{} line {}", file.path, doc.line) : file.path;
}

std::string checked_utf8(RawDocument& doc, const InputFile& file, InvalidUtf8 invalid) {
  const std::optional<size_t> bad = first_invalid_utf8(doc.bytes);
  if (!bad) return std::move(doc.bytes);
  MT_CHECK(invalid == InvalidUtf8::replace,
           "{}: byte {} of the file is not valid UTF-8 (bytes {}); fix the text, or give --invalid-utf8 replace to "
           "replace each invalid sequence by U+FFFD as Python's bytes.decode('utf-8', errors='replace') does",
           where(doc, file), doc.offset + *bad, bytes_at(doc.bytes, *bad));
  return replace_invalid_utf8(doc.bytes);
}

std::string text_field(const std::string& line, const RawDocument& doc, const InputFile& file) {
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not JSON: {}", where(doc, file), e.what()));
  }
  MT_CHECK(object.is_object(), "{}: a JSON {} where a JSON lines file holds one object a line, with a \"text\" field",
           where(doc, file), object.type_name());
  const auto text = object.find("text");
  MT_CHECK(text != object.end(), "{}: the object has no \"text\" field", where(doc, file));
  MT_CHECK(text->is_string(), "{}: \"text\" is a JSON {}, not a string", where(doc, file), text->type_name());
  return text->get<std::string>();
}

}  // namespace

std::vector<InputFile> find_inputs(const std::vector<std::string>& paths) {
  MT_CHECK(!paths.empty(), "no input given: name .txt or .jsonl files, or folders of them");
  std::vector<InputFile> inputs;
  for (const std::string& path : paths) {
    MT_CHECK(fs::exists(path), "input {} does not exist", path);
    if (fs::is_directory(path)) {
      for (InputFile& f : inputs_in_folder(path)) inputs.push_back(std::move(f));
      continue;
    }
    MT_CHECK(fs::is_regular_file(path), "input {} is not a file or folder", path);
    MT_CHECK(is_text(path) || is_json_lines(path),
             "input {}: tokenize reads .txt files (a document each) and .jsonl files (a \"text\" field a line)", path);
    inputs.push_back(input_of(path));
  }
  return inputs;
}

bool DocumentReader::next(RawDocument& doc) {
  while (file_ < files_.size()) {
    const InputFile& f = files_[file_];
    if (!f.json_lines) {
      std::ifstream in(f.path, std::ios::binary);
      MT_CHECK(in, "cannot open input {}", f.path);
      doc.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      MT_CHECK(!in.bad(), "cannot read input {}", f.path);
      doc.file = file_++, doc.line = 0, doc.offset = 0;
      return true;
    }
    if (!lines_.is_open()) {
      lines_.open(f.path, std::ios::binary);
      MT_CHECK(lines_, "cannot open input {}", f.path);
      line_ = 0, offset_ = 0;
    }
    std::string line;
    while (std::getline(lines_, line)) {
      const uint64_t at = offset_;
      offset_ += line.size() + 1, ++line_;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line: no document
      doc.bytes = std::move(line);
      doc.file = file_, doc.line = line_, doc.offset = at;
      return true;
    }
    MT_CHECK(!lines_.bad(), "cannot read input {} after line {}", f.path, line_);
    lines_.close();
    ++file_;
  }
  return false;
}

bool DocumentReader::next_batch(std::vector<RawDocument>& batch, size_t max_bytes) {
  size_t bytes = 0;
  RawDocument doc;
  while (bytes < max_bytes && next(doc)) {
    bytes += doc.bytes.size() + 1;
    batch.push_back(std::move(doc));
    doc = RawDocument{};
  }
  return !batch.empty();
}

std::string document_text(RawDocument& doc, const InputFile& file, InvalidUtf8 invalid) {
  std::string text = checked_utf8(doc, file, invalid);
  return file.json_lines ? text_field(text, doc, file) : text;
}

}  // namespace meshtrain::tokenize
