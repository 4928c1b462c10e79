// `meshtrain tokenize`: text files or JSON lines to llm.c token shards of a
// train and a validation split, with a tiktoken BPE or SentencePiece
// tokenizer (tokenize/tokenize_corpus.h).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/command.h"

namespace meshtrain::cli {

// Added to `app` with its options.
Command add_tokenize_command(CLI::App& app);

}  // namespace meshtrain::cli
