// A thread-safe table of named definitions (ops, their kernels, later their
// sharding strategies) whose entries keep their address for the life of the
// program, so that graphs and executors can hold pointers to them.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace meshtrain {

template <typename T>
class NameRegistry {
 public:
  // Adds `value` under `name`; false (and nothing added) if the name is taken.
  bool add(const std::string& name, T value) {
    std::lock_guard lock(mu_);
    return items_.emplace(name, std::move(value)).second;
  }
  // The entry named `name`, or nullptr.
  const T* find(const std::string& name) const {
    std::lock_guard lock(mu_);
    auto it = items_.find(name);
    return it == items_.end() ? nullptr : &it->second;
  }
  // Every name, sorted.
  std::vector<std::string> name_list() const {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (const auto& [name, _] : items_) out.push_back(name);
    return out;
  }
  // Every name, sorted, joined by ", " (for error messages).
  std::string names() const {
    std::string out;
    for (const std::string& name : name_list()) out += (out.empty() ? "" : ", ") + name;
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, T> items_;  // node-based: entries never move
};

}  // namespace meshtrain
