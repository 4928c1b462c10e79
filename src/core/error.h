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

// A broken invariant: a bug in meshtrain, never a fault of the input. It is
// not an Error, so that nothing which catches the user's errors (the
// commands' reports, the fuzzers' accepted rejections) mistakes it for one.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace meshtrain

// Throw ExcType with a fmt-formatted message when cond is false.
#define MT_CHECK_T(ExcType, cond, ...)                    \
  do {                                                    \
    if (!(cond)) throw ExcType(fmt::format(__VA_ARGS__)); \
  } while (0)
// A user error: input (config, file, option, argument) that cannot be used.
#define MT_CHECK(cond, ...) MT_CHECK_T(::meshtrain::InvalidArgument, cond, __VA_ARGS__)
// An invariant of meshtrain's own: false only through a bug. Names the place.
#define MT_ASSERT(cond, ...)                                                                                     \
  do {                                                                                                           \
    if (!(cond))                                                                                                 \
      throw ::meshtrain::InternalError(                                                                          \
          fmt::format("internal error at {}:{} ({}): {}", __FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__))); \
  } while (0)
