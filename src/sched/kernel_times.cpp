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

double KernelTimes::lateness_us(int64_t ranks, double interval_us) const {
  if (sync_lateness.empty() || interval_us <= 0) return 0;
  const auto it = sync_lateness.lower_bound(ranks);
  const std::vector<LatenessPoint>& points = it != sync_lateness.end() ? it->second : sync_lateness.rbegin()->second;
  if (points.empty()) return 0;
  const auto above = std::find_if(points.begin(), points.end(),
                                  [&](const LatenessPoint& p) { return p.interval_us >= interval_us; });
  double share;
  if (above == points.begin()) share = above->share;
  else if (above == points.end()) share = points.back().share;
  else {
    const LatenessPoint& below = *(above - 1);
    const double t = (interval_us - below.interval_us) / (above->interval_us - below.interval_us);
    share = below.share + t * (above->share - below.share);
  }
  return share * interval_us;
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
  } catch (const std::exception& e) {
    throw InvalidArgument(fmt::format("schedule.kernel_cache {}: not a kernel-time cache ({}); delete it to measure "
                                      "again", path, json_error_text(e)));
  }
  return times;
}

void save_kernel_times(const KernelTimes& times, const std::string& path) {
  nlohmann::json kernels = nlohmann::json::object();
  for (const auto& [key, us] : times.us) kernels[key] = us;
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  write_file_atomically(path, nlohmann::json{{"kernels", kernels}}.dump(1) + "\n");
}

}  // namespace meshtrain::sched
