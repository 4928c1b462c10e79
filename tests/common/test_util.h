// Small helpers for asserting on errors.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace mtest {

// The what() of the exception fn throws, or "(no error)".
inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace mtest
