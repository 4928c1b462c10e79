#include "sched/kernel_times.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
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
  MT_CHECK(std::filesystem::is_regular_file(path),
           "schedule.kernel_cache {}: is not a file; give the path of a JSON "
           "file (it is made when absent)",
           path);
  std::ifstream f(path);
  MT_CHECK(f.good(), "schedule.kernel_cache {}: cannot be read ({})", path, std::strerror(errno));
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& [key, us] : j.at("kernels").items()) {
      MT_CHECK(us.is_number() && us.get<double>() >= 0 && us.get<double>() <= 1e12,
               "entry '{}' is {}, not a time of 0 to 1e12 us", key, us.dump());
      times.us[key] = us.get<double>();
    }
    if (j.contains("sync_lateness")) {
      const nlohmann::json& groups = j.at("sync_lateness");
      MT_CHECK(groups.is_array(), "sync_lateness is not an array");
      for (const nlohmann::json& group : groups) {
        const SyncLateness::Key key{json_integer(group, "world", 2, 1 << 24), json_integer(group, "ranks", 2, 1 << 24)};
        MT_CHECK(!times.sync_lateness.tables.count(key), "sync_lateness for groups of {} ranks in a job of {} twice",
                 key.ranks, key.world);
        times.sync_lateness.tables[key] = checked_lateness(key, group.at("interval_us").get<std::vector<double>>(),
                                                           group.at("share").get<std::vector<double>>());
      }
    }
  } catch (const InternalError&) {  // a bug of ours, not the file's
    throw;
  } catch (const std::exception& e) {
    throw InvalidArgument(
        fmt::format("schedule.kernel_cache {}: not a kernel-time cache ({}); delete it to measure "
                    "again",
                    path, json_error_text(e)));
  }
  return times;
}

void save_kernel_times(const KernelTimes& times, const std::string& path) {
  nlohmann::json kernels = nlohmann::json::object();
  for (const auto& [key, us] : times.us) kernels[key] = us;
  nlohmann::json lateness = nlohmann::json::array();
  for (const auto& [key, points] : times.sync_lateness.tables) {
    nlohmann::json intervals = nlohmann::json::array(), shares = nlohmann::json::array();
    for (const SyncLateness::Point& p : points) {
      intervals.push_back(p.interval_us);
      shares.push_back(p.share);
    }
    lateness.push_back({{"world", key.world}, {"ranks", key.ranks}, {"interval_us", intervals}, {"share", shares}});
  }
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  nlohmann::json file{{"kernels", kernels}};
  if (!lateness.empty()) file["sync_lateness"] = lateness;
  write_file_atomically(path, file.dump(1) + "\n");
}

}  // namespace meshtrain::sched
