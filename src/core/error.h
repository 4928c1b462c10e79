// Errors that say what was asked, what was wrong and what to do about it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace meshtrain {

// Base of every error meshtrain throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Input the caller gave was invalid (shape, dtype, rank, option...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A collective or point-to-point operation failed (mismatch across ranks, backend error).
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective did not complete within its timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace meshtrain

// Throw ExcType with a fmt-formatted message when cond is false.
#define MT_CHECK_T(ExcType, cond, ...)                     \
  do {                                                     \
    if (!(cond)) throw ExcType(fmt::format(__VA_ARGS__));  \
  } while (0)
#define MT_CHECK(cond, ...) MT_CHECK_T(::meshtrain::InvalidArgument, cond, __VA_ARGS__)
