// The text to tokenize: input files (.txt: one document each; .jsonl: one
// JSON object a line, its "text" field a document) found from the paths a
// user gives, read in order a batch at a time, and each document's text
// checked for UTF-8 (or repaired as Python's decode(errors="replace") does).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace meshtrain::tokenize {

struct InputFile {
  std::string path;
  bool json_lines = false;
  uint64_t bytes = 0;
};

// The input files of `paths`: each a .txt or .jsonl file, or a folder
// searched recursively for them (sorted by path; other files passed over).
// Throws for a path that is none of these, or a folder with none.
std::vector<InputFile> find_inputs(const std::vector<std::string>& paths);

// A document as read: a whole .txt file, or one line of a .jsonl file.
struct RawDocument {
  std::string bytes;
  size_t file = 0;      // index into the inputs
  int64_t line = 0;     // 1-based line of a .jsonl file; 0 for a .txt file
  uint64_t offset = 0;  // of its first byte in the file
};

class DocumentReader {
 public:
  explicit DocumentReader(const std::vector<InputFile>& files) : files_(files) {}
  // Appends documents to `batch` until their bytes reach `max_bytes` (at
  // least one document); false when there are no more.
  bool next_batch(std::vector<RawDocument>& batch, size_t max_bytes);

 private:
  bool next(RawDocument& doc);
  const std::vector<InputFile>& files_;
  size_t file_ = 0;
  std::ifstream lines_;  // the open .jsonl file
  int64_t line_ = 0;
  uint64_t offset_ = 0;
};

enum class InvalidUtf8 { refuse, replace };

// The text of `doc` (its bytes are taken): its bytes (a .txt) or its "text"
// field (a .jsonl line), valid UTF-8. Throws naming the file, line and byte offset of invalid UTF-8
// (refuse) or of a line that is not a JSON object with a string "text".
std::string document_text(RawDocument& doc, const InputFile& file, InvalidUtf8 invalid);

}  // namespace meshtrain::tokenize
