#include "sched/hardware.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "graph/op_registry.h"

namespace meshtrain::sched {

double HardwareProfile::rank_share(int world_size) const { return shared_host ? 1.0 / std::max(1, world_size) : 1.0; }

double HardwareProfile::busy_share(int world_size, int computing) const {
  const double share = rank_share(world_size);
  if (!shared_host || host_cores <= 0) return share;
  const double threads = std::max(1, host_cores / std::max(1, world_size));
  return std::max(share, std::min(threads / host_cores, 1.0 / std::max(1, computing)));
}

int HardwareProfile::host_count(const std::vector<int64_t>& group) const {
  std::set<int64_t> hosts;
  for (int64_t r : group) hosts.insert(r / devices_per_host);
  return static_cast<int>(hosts.size());
}

double HardwareProfile::collective_us(comm::OpType kind, double bytes, const std::vector<int64_t>& group,
                                      int world_size, bool others_compute) const {
  const int ranks = static_cast<int>(group.size());
  if (ranks <= 1) return 0;
  if (collectives == CollectiveModel::measured) return measured.us(kind, bytes, ranks, world_size, others_compute);
  return nccl_collective_us(kind, bytes, ranks, host_count(group), nccl);
}

double HardwareProfile::collective_floor_us(comm::OpType kind, double bytes, const std::vector<int64_t>& group) const {
  if (group.size() <= 1 || collectives == CollectiveModel::measured) return 0;
  return nccl_collective_floor_us(kind, bytes, static_cast<int>(group.size()), host_count(group), nccl);
}

namespace {

// The built-in profiles: configs/hardware/*.toml, embedded at build time
// (src/CMakeLists.txt), each file saying where its figures come from.
constexpr const char* kBuiltins[] = {
#include "sched/builtin_hardware.inc"
};

// A TOML value as its file shows it (1e-300, nan, "text"), for messages.
std::string toml_value_text(const toml::node& n) {
  std::ostringstream out;
  n.visit([&](auto&& v) { out << v; });
  return out.str();
}

struct Reader {
  const toml::table& root;
  std::string origin;
  std::set<std::string> used;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InvalidArgument(fmt::format("hardware profile {}: {} {}", origin, key, what));
  }
  const toml::node* find(const std::string& key) {
    used.insert(key);
    return root.at_path(key).node();
  }
  // Rates, sizes and fractions: finite, and within a range no device leaves
  // (a bandwidth of 1e-300 GB/s would make every collective take forever).
  static constexpr double kLargest = 1e12, kSmallestPositive = 1e-6;
  double number(const std::string& key, double fallback, bool positive = false) {
    const toml::node* n = find(key);
    if (!n) return fallback;
    const auto v = n->value<double>();
    const bool ok = v && std::isfinite(*v) && *v <= kLargest && (positive ? *v >= kSmallestPositive : *v >= 0);
    if (!ok)
      fail(key, fmt::format("must be a number {} and at most {:g}, got {}", positive ? "of at least 1e-06" : ">= 0",
                            kLargest, toml_value_text(*n)));
    return *v;
  }
  double fraction(const std::string& key, double fallback) {  // of a peak: (0, 1]
    const double v = number(key, fallback, true);
    if (v > 1) fail(key, fmt::format("is a fraction of the peak, at most 1, got {}", v));
    return v;
  }
  int integer(const std::string& key, int fallback, int most) {
    const toml::node* n = find(key);
    if (!n) return fallback;
    const auto v = n->value<int64_t>();
    if (!v || *v < 1 || *v > most)
      fail(key, fmt::format("must be an integer from 1 to {}, got {}", most, toml_value_text(*n)));
    return static_cast<int>(*v);
  }
  std::string text(const std::string& key, const std::string& fallback) {
    const toml::node* n = find(key);
    if (!n) return fallback;
    const auto v = n->value<std::string>();
    if (!v) fail(key, "must be a string");
    return *v;
  }
  bool flag(const std::string& key, bool fallback) {
    const toml::node* n = find(key);
    if (!n) return fallback;
    const auto v = n->value<bool>();
    if (!v) fail(key, "must be true or false");
    return *v;
  }
  std::vector<double> numbers(const toml::table& t, const std::string& key, const std::string& where) {
    const toml::array* a = t[key].as_array();
    if (!a) fail(where + "." + key, "must be an array of numbers");
    std::vector<double> out;
    for (const auto& e : *a) {
      const auto v = e.value<double>();
      if (!v || !std::isfinite(*v) || *v < 0 || *v > kLargest)
        fail(where + "." + key, fmt::format("must hold numbers from 0 to {:g}, not {}", kLargest, toml_value_text(e)));
      out.push_back(*v);
    }
    return out;
  }
};

// Every key of the document that the reader did not ask for.
void unknown_keys(const toml::table& t, const std::string& prefix, const std::set<std::string>& used,
                  std::vector<std::string>& out) {
  for (const auto& [k, v] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (used.count(key)) continue;
    if (const toml::table* sub = v.as_table())
      unknown_keys(*sub, key, used, out);
    else
      out.push_back(key);
  }
}

// A table of ops' numbers ([device.op_efficiency], [device.op_call_us]):
// each key an op's name, each value as `value` checks it.
template <typename Value>
std::map<std::string, double> op_table(Reader& r, const std::string& table, Value&& value) {
  r.used.insert(table);
  std::map<std::string, double> out;
  if (const toml::table* ops = r.root.at_path(table).as_table())
    for (const auto& [op, v] : *ops) {
      const std::string key = fmt::format("{}.{}", table, op.str());
      try {
        graph::find_op(std::string(op.str()));
      } catch (const InvalidArgument& e) {
        r.fail(key, fmt::format("names no op: {}", e.what()));
      }
      out[std::string(op.str())] = value(key, v);
    }
  return out;
}

}  // namespace

double SyncLateness::us(int64_t world, int64_t ranks, double interval_us) const {
  if (ranks < 2 || interval_us <= 0) return 0;
  const auto first = tables.lower_bound({world, 0}), end = tables.lower_bound({world + 1, 0});
  if (first == end) return 0;  // nothing for a job of this size
  auto it = tables.lower_bound({world, ranks});
  if (it == end) it = std::prev(end);
  const std::vector<Point>& points = it->second;
  if (points.empty()) return 0;
  const auto above =
      std::find_if(points.begin(), points.end(), [&](const Point& p) { return p.interval_us >= interval_us; });
  double share;
  if (above == points.begin())
    share = above->share;
  else if (above == points.end())
    share = points.back().share;
  else {
    const Point& below = *(above - 1);
    const double t = (interval_us - below.interval_us) / (above->interval_us - below.interval_us);
    share = below.share + t * (above->share - below.share);
  }
  return share * interval_us;
}

SyncLateness SyncLateness::over(const SyncLateness& base) const {
  SyncLateness out = *this;
  for (const auto& [key, points] : base.tables) out.tables.emplace(key, points);  // keeps this one's
  return out;
}

std::vector<SyncLateness::Point> checked_lateness(SyncLateness::Key key, const std::vector<double>& interval_us,
                                                  const std::vector<double>& share) {
  const auto [world, ranks] = key;
  MT_CHECK(ranks >= 2 && ranks <= world && world <= (1 << 24),
           "for groups of {} ranks in a job of {}: need 2 <= ranks <= world <= 2^24", ranks, world);
  MT_CHECK(!interval_us.empty() && interval_us.size() == share.size(),
           "for groups of {} ranks in a job of {}: interval_us and share must be as long, and not empty", ranks, world);
  std::vector<SyncLateness::Point> points;
  for (size_t i = 0; i < interval_us.size(); ++i) {
    MT_CHECK(std::isfinite(interval_us[i]) && interval_us[i] > 0 && interval_us[i] <= 1e12 &&
                 (i == 0 || interval_us[i] > interval_us[i - 1]),
             "for groups of {} ranks in a job of {}: intervals must be positive and increase, got {} after {}", ranks,
             world, interval_us[i], i == 0 ? 0.0 : interval_us[i - 1]);
    MT_CHECK(std::isfinite(share[i]) && share[i] >= 0 && share[i] <= static_cast<double>(ranks - 1),
             "for groups of {} ranks in a job of {}: a share must be a number from 0 to {} (a fraction of the "
             "stretch, not a percentage), got {}",
             ranks, world, ranks - 1, share[i]);
    points.push_back({interval_us[i], share[i]});
  }
  return points;
}

HardwareProfile parse_hardware(const std::string& toml_text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    throw InvalidArgument(fmt::format("hardware profile {}: {}", origin, e.description()));
  }
  Reader r{root, origin, {}};
  HardwareProfile p;
  p.name = r.text("name", "");
  if (p.name.empty()) r.fail("name", "is required (a string)");
  p.description = r.text("description", "");
  p.peak_gflops_f32 = r.number("device.peak_gflops_f32", 0, true);
  if (!r.root.at_path("device.peak_gflops_f32")) r.fail("device.peak_gflops_f32", "is required");
  p.peak_gflops_bf16 = r.number("device.peak_gflops_bf16", 0);
  p.peak_gflops_fp8 = r.number("device.peak_gflops_fp8", 0);
  p.memory_gbps = r.number("device.memory_gbps", 0, true);
  if (!r.root.at_path("device.memory_gbps")) r.fail("device.memory_gbps", "is required");
  p.memory_gib = r.number("device.memory_gib", 0);
  p.compute_efficiency = r.fraction("device.compute_efficiency", p.compute_efficiency);
  p.memory_efficiency = r.fraction("device.memory_efficiency", p.memory_efficiency);
  p.devices_per_host = r.integer("device.devices_per_host", p.devices_per_host, 1 << 20);
  p.shared_host = r.flag("device.shared_host", false);
  p.host_cores = r.integer("device.cores", 0, 1 << 20);
  if (p.host_cores > 0 && !p.shared_host)
    r.fail("device.cores", "is for ranks that share a host's cores: set device.shared_host = true");
  p.op_efficiency = op_table(r, "device.op_efficiency", [&](const std::string& key, const toml::node& v) {
    const auto e = v.value<double>();
    if (!e || !std::isfinite(*e) || *e < Reader::kSmallestPositive || *e > 1)
      r.fail(key, fmt::format("must be a fraction of the peak, above 0 and at most 1, got {}", toml_value_text(v)));
    return *e;
  });
  p.op_call_us = op_table(r, "device.op_call_us", [&](const std::string& key, const toml::node& v) {
    const auto us = v.value<double>();
    if (!us || !std::isfinite(*us) || *us < 0 || *us > 1e6)
      r.fail(key, fmt::format("must be microseconds from 0 to 1e6, got {}", toml_value_text(v)));
    return *us;
  });
  const std::string model = r.text("collectives.model", "nccl");
  if (model == "nccl") {
    p.collectives = HardwareProfile::CollectiveModel::nccl;
    const std::string arch = r.text("collectives.arch", "hopper");
    const std::map<std::string, NcclLinks::Arch> arches{{"volta", NcclLinks::Arch::volta},
                                                        {"ampere", NcclLinks::Arch::ampere},
                                                        {"hopper", NcclLinks::Arch::hopper},
                                                        {"blackwell", NcclLinks::Arch::blackwell}};
    if (!arches.count(arch))
      r.fail("collectives.arch", fmt::format("'{}' is not volta, ampere, hopper or blackwell", arch));
    p.nccl.arch = arches.at(arch);
    p.nccl.intra_bus_gbps = r.number("collectives.intra_bus_gbps", p.nccl.intra_bus_gbps, true);
    p.nccl.inter_gbps = r.number("collectives.inter_gbps", p.nccl.inter_gbps, true);
    p.nccl.channels = r.integer("collectives.channels", p.nccl.channels, 1024);
    p.nccl.amd_host = r.flag("collectives.amd_host", false);
  } else if (model == "measured") {
    p.collectives = HardwareProfile::CollectiveModel::measured;
    r.used.insert("collectives.table");
    const toml::array* tables = root.at_path("collectives.table").as_array();
    if (!tables || tables->empty())
      r.fail("collectives.table", "must be an array of tables ([[collectives.table]]) with model = \"measured\"");
    for (const auto& entry : *tables) {
      const toml::table* t = entry.as_table();
      if (!t) r.fail("collectives.table", "must hold tables");
      for (const auto& [k, v] : *t)
        if (k.str() != "op" && k.str() != "ranks" && k.str() != "world" && k.str() != "others_compute" &&
            k.str() != "bytes" && k.str() != "us")
          r.fail(fmt::format("collectives.table.{}", k.str()),
                 "unknown (a table has op, ranks, world, others_compute, bytes and us)");
      const auto op = (*t)["op"].value<std::string>();
      const auto ranks = (*t)["ranks"].value<int64_t>();
      if (!op) r.fail("collectives.table.op", "is required (all_gather, reduce_scatter, all_reduce, all_to_all)");
      if (!ranks || *ranks < 2 || *ranks > (1 << 20))
        r.fail("collectives.table.ranks", "must be an integer from 2 to 2^20");
      const int64_t world = (*t)["world"].value<int64_t>().value_or(0);
      if (world != 0 && (world < *ranks || world % *ranks != 0 || world > (1 << 20)))
        r.fail("collectives.table.world", fmt::format("{} must be a multiple of ranks {}", world, *ranks));
      comm::OpType kind{};
      try {
        kind = costed_collective(*op);
      } catch (const InvalidArgument& e) {
        r.fail("collectives.table.op", e.what());
      }
      const std::vector<double> bytes = r.numbers(*t, "bytes", "collectives.table"),
                                us = r.numbers(*t, "us", "collectives.table");
      if (bytes.size() != us.size() || bytes.empty())
        r.fail("collectives.table",
               fmt::format("{} over {} ranks: bytes and us must be as long, and not empty", *op, *ranks));
      const toml::node_view<const toml::node> others_node = (*t)["others_compute"];
      if (others_node && !others_node.is_boolean()) r.fail("collectives.table.others_compute", "must be true or false");
      const bool others_compute = others_node.value_or(false);
      if (others_compute && world <= *ranks)
        r.fail("collectives.table.others_compute",
               fmt::format("needs a world larger than the group's {} ranks (the other ranks compute)", *ranks));
      const MeasuredCollectives::Key key{kind, static_cast<int>(*ranks), static_cast<int>(world), others_compute};
      if (p.measured.tables.count(key))
        r.fail("collectives.table", fmt::format("{} over {} ranks in a job of {}{}: given twice", *op, *ranks,
                                                world == 0 ? std::string("any size") : std::to_string(world),
                                                others_compute ? " while the others compute" : ""));
      auto& points = p.measured.tables[key];
      for (size_t i = 0; i < bytes.size(); ++i) {
        if (i > 0 && bytes[i] < bytes[i - 1] + 1)
          r.fail("collectives.table.bytes",
                 fmt::format("{} over {} ranks: sizes must increase, by a byte at least", *op, *ranks));
        points.emplace_back(bytes[i], us[i]);
      }
    }
  } else {
    r.fail("collectives.model", fmt::format("'{}' is not nccl or measured", model));
  }
  r.used.insert("device.sync_lateness");
  if (const toml::node* node = root.at_path("device.sync_lateness").node()) {
    const toml::array* groups = node->as_array();
    if (!groups || groups->empty())
      r.fail("device.sync_lateness", "must be an array of tables ([[device.sync_lateness]])");
    if (!p.shared_host)
      r.fail("device.sync_lateness", "is for ranks that share a host's cores: set device.shared_host = true");
    for (const toml::node& g : *groups) {
      const toml::table* t = g.as_table();
      if (!t) r.fail("device.sync_lateness", "must hold tables");
      for (const auto& [k, v] : *t)
        if (k.str() != "world" && k.str() != "ranks" && k.str() != "interval_us" && k.str() != "share")
          r.fail(fmt::format("device.sync_lateness.{}", k.str()),
                 "unknown (a table has world, ranks, interval_us and share)");
      SyncLateness::Key key;
      for (auto [name, field] : {std::pair{"world", &key.world}, std::pair{"ranks", &key.ranks}}) {
        const toml::node* n = t->get(name);
        if (!n) r.fail(fmt::format("device.sync_lateness.{}", name), "is required (an integer from 2 to 2^24)");
        const auto v = n->value<int64_t>();
        if (!v || !n->is_integer())
          r.fail(fmt::format("device.sync_lateness.{}", name),
                 fmt::format("must be an integer from 2 to 2^24, got {}", toml_value_text(*n)));
        *field = *v;
      }
      if (p.sync_lateness.tables.count(key))
        r.fail("device.sync_lateness",
               fmt::format("for groups of {} ranks in a job of {}: given twice", key.ranks, key.world));
      const std::vector<double> intervals = r.numbers(*t, "interval_us", "device.sync_lateness"),
                                shares = r.numbers(*t, "share", "device.sync_lateness");
      try {
        p.sync_lateness.tables[key] = checked_lateness(key, intervals, shares);
      } catch (const InvalidArgument& e) {
        r.fail("device.sync_lateness", e.what());
      }
    }
  }
  std::vector<std::string> unknown;
  unknown_keys(root, "", r.used, unknown);
  if (!unknown.empty()) r.fail(fmt::format("{}", fmt::join(unknown, ", ")), "unknown (see meshtrain estimate --help)");
  return p;
}

namespace {
// The built-in profiles, parsed once.
const std::vector<HardwareProfile>& builtins() {
  static const std::vector<HardwareProfile> profiles = [] {
    std::vector<HardwareProfile> out;
    for (const char* text : kBuiltins) out.push_back(parse_hardware(text, "built-in"));
    return out;
  }();
  return profiles;
}

const HardwareProfile* find_builtin(const std::string& name) {
  for (const HardwareProfile& p : builtins())
    if (p.name == name) return &p;
  return nullptr;
}
}  // namespace

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> names;
  for (const HardwareProfile& p : builtins()) names.push_back(p.name);
  return names;
}

HardwareProfile builtin_hardware(const std::string& name) {
  if (const HardwareProfile* p = find_builtin(name)) return *p;
  throw InvalidArgument(fmt::format("no built-in hardware profile '{}' (built in: {}; or give a profile file)", name,
                                    fmt::join(builtin_hardware_names(), ", ")));
}

HardwareProfile load_hardware(const std::string& name_or_path, const std::string& option) {
  if (const HardwareProfile* p = find_builtin(name_or_path)) return *p;
  MT_CHECK(!std::filesystem::is_directory(name_or_path),
           "{} '{}' is a directory; give a built-in profile ({}) or a "
           "profile file (TOML)",
           option, name_or_path, fmt::join(builtin_hardware_names(), ", "));
  MT_CHECK(std::filesystem::exists(name_or_path), "{} '{}' is neither a built-in profile ({}) nor a readable file",
           option, name_or_path, fmt::join(builtin_hardware_names(), ", "));
  // A regular file of at most 1 MiB: a device or a FIFO is refused, not read without end.
  return parse_hardware(read_small_file(name_or_path, 1 << 20, option), name_or_path);
}

}  // namespace meshtrain::sched
