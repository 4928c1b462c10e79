#include "sched/kernel_times.h"

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json_integer.h"
#include "graph/op_registry.h"

namespace meshtrain::sched {

namespace {
std::string infos_text(const graph::Graph& g, const std::vector<graph::ValueId>& values) {
  std::string out;
  for (graph::ValueId v : values) {
    const graph::ValueInfo& info = g.value(v).info;
    if (!out.empty()) out += ", ";
    out += fmt::format("{}:{}", info.shape.to_string(), dtype_name(info.dtype));
  }
  return out;
}
}  // namespace

std::string kernel_key(const graph::Graph& g, graph::NodeId id) {
  const graph::Node& node = g.node(id);
  const std::string attrs = node.attrs.to_string();
  return fmt::format("{}({})->({}){}{}", node.op->name, infos_text(g, node.inputs), infos_text(g, node.outputs),
                     attrs.empty() ? "" : " ", attrs);
}

uint64_t kernel_key_hash(const std::string& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::optional<double> KernelTimes::find(const std::string& key) const {
  const auto it = us.find(key);
  if (it == us.end()) return std::nullopt;
  return it->second;
}

KernelTimes load_kernel_times(const std::string& path) {
  KernelTimes times;
  if (!std::filesystem::exists(path)) return times;
  MT_CHECK(std::filesystem::is_regular_file(path), "schedule.kernel_cache {}: is not a file; give the path of a JSON "
           "file (it is made when absent)", path);
  std::ifstream f(path);
  MT_CHECK(f.good(), "schedule.kernel_cache {}: cannot be read ({})", path, std::strerror(errno));
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& [key, us] : j.at("kernels").items()) {
      MT_CHECK(us.is_number() && us.get<double>() >= 0, "entry '{}' is not a time >= 0", key);
      times.us[key] = us.get<double>();
    }
    if (j.contains("sync_lateness"))
      for (const nlohmann::json& group : j.at("sync_lateness")) {
        const auto ranks = group.at("ranks").get<int64_t>();
        const auto intervals = group.at("interval_us").get<std::vector<double>>();
        const auto shares = group.at("share").get<std::vector<double>>();
        times.sync_lateness.by_group_size[ranks] = checked_lateness(ranks, intervals, shares);
      }
  } catch (const std::exception& e) {
    throw InvalidArgument(fmt::format("schedule.kernel_cache {}: not a kernel-time cache ({}); delete it to measure "
                                      "again", path, json_error_text(e)));
  }
  return times;
}

void save_kernel_times(const KernelTimes& times, const std::string& path) {
  nlohmann::json kernels = nlohmann::json::object();
  for (const auto& [key, us] : times.us) kernels[key] = us;
  nlohmann::json lateness = nlohmann::json::array();
  for (const auto& [ranks, points] : times.sync_lateness.by_group_size) {
    nlohmann::json intervals = nlohmann::json::array(), shares = nlohmann::json::array();
    for (const SyncLateness::Point& p : points) {
      intervals.push_back(p.interval_us);
      shares.push_back(p.share);
    }
    lateness.push_back({{"ranks", ranks}, {"interval_us", intervals}, {"share", shares}});
  }
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  nlohmann::json file{{"kernels", kernels}};
  if (!lateness.empty()) file["sync_lateness"] = lateness;
  write_file_atomically(path, file.dump(1) + "\n");
}

}  // namespace meshtrain::sched
