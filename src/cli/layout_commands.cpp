#include "cli/layout_commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "comm/types.h"
#include "core/dtype.h"
#include "core/error.h"
#include "sharding/local_chunk.h"
#include "sharding/planner.h"

namespace meshtrain::cli {

namespace {

// A plan step's collective as printed: its comm name, "none" for a local step.
std::string_view collective_label(const sharding::PlanStep& s) {
  return s.collective ? comm::op_type_name(*s.collective) : "none";
}

sharding::LinkParams parse_link(const std::string& text, int& dim) {
  double lat = 0, bw = 0;
  char extra = 0;
  MT_CHECK(std::sscanf(text.c_str(), "%d:%lf:%lf%c", &dim, &lat, &bw, &extra) == 3,
           "--link '{}': expected MESH_DIM:LATENCY_US:BANDWIDTH_GBPS, e.g. 0:2.7:25", text);
  MT_CHECK(std::isfinite(lat) && lat >= 0 && std::isfinite(bw) && bw > 0,
           "--link '{}': the latency must be a number >= 0 (microseconds) and the bandwidth a positive number "
           "(GB/s), got {} and {}",
           text, lat, bw);
  return {lat, bw};
}

}  // namespace

int run_layout(const LayoutCommand& c) {
  const sharding::DeviceMesh mesh(sharding::parse_mesh_shape(c.mesh));
  const auto shape = Shape::parse(c.shape, "--shape");
  const sharding::Layout layout = sharding::Layout::parse(c.placements, mesh.ndim());
  layout.validate(static_cast<int>(shape.rank()));
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  if (!c.json)
    fmt::print("layout {} of a ({}) tensor on mesh {}\n{:>5}  {:<12} {:<16} {}\n", layout.to_string(),
               fmt::join(shape.dims(), ", "), mesh.describe(), "rank", "coord", "local_shape", "global_offset");
  for (int r = 0; r < mesh.num_ranks(); ++r) {
    const auto coord = mesh.coordinate(r);
    const auto chunk = sharding::local_chunk(shape, layout, mesh, coord);
    if (c.json)
      ranks.push_back(
          {{"rank", r}, {"coord", coord}, {"local_shape", chunk.shape.dims()}, {"global_offset", chunk.offset}});
    else
      fmt::print("{:>5}  {:<12} {:<16} {}\n", r, fmt::format("[{}]", fmt::join(coord, ",")),
                 fmt::format("[{}]", fmt::join(chunk.shape.dims(), ",")),
                 fmt::format("[{}]", fmt::join(chunk.offset, ",")));
  }
  if (c.json) fmt::print("{}\n", nlohmann::ordered_json{{"ranks", ranks}}.dump());
  return 0;
}

int run_plan(const PlanCommand& c) {
  const sharding::DeviceMesh mesh(sharding::parse_mesh_shape(c.mesh));
  const auto shape = Shape::parse(c.shape, "--shape");
  const sharding::Layout from = sharding::Layout::parse(c.from, mesh.ndim());
  const sharding::Layout to = sharding::Layout::parse(c.to, mesh.ndim());
  MT_CHECK(c.devices_per_host >= 1, "--devices-per-host must be at least 1, got {}", c.devices_per_host);
  sharding::CostModel model = sharding::CostModel::for_mesh(mesh, c.devices_per_host);
  std::map<int, std::string> linked;  // mesh dim -> the --link that set it
  for (const auto& text : c.links) {
    int dim = -1;
    const auto link = parse_link(text, dim);
    MT_CHECK(dim >= 0 && dim < mesh.ndim(), "--link '{}': mesh dim {} is outside 0..{}", text, dim, mesh.ndim() - 1);
    MT_CHECK(!linked.count(dim), "--link '{}' and --link '{}' both set mesh dim {}; give one per dim", linked[dim],
             text, dim);
    linked[dim] = text;
    model.links[dim] = link;
  }
  MT_CHECK(c.all_to_all_penalty_us >= 0, "--all-to-all-penalty-us must be >= 0, got {}", c.all_to_all_penalty_us);
  model.all_to_all_penalty_us = c.all_to_all_penalty_us;
  const DType dtype = parse_dtype(c.dtype);
  sharding::Planner planner(mesh, model);
  sharding::PlanOptions options{sharding::parse_planner_kind(c.planner), c.merge};
  const auto plan = planner.plan(shape, dtype_size(dtype), from, to, options);
  if (c.json) {
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (const auto& s : plan->steps)
      steps.push_back({{"mesh_dim", s.mesh_dims.front()},
                       {"mesh_dims", s.mesh_dims},
                       {"from", s.from.to_string()},
                       {"to", s.to.to_string()},
                       {"collective", collective_label(s)},
                       {"bytes", static_cast<int64_t>(s.bytes)},
                       {"cost_us", s.cost_us},
                       {"layout", s.after.to_string()}});
    fmt::print(
        "{}\n",
        nlohmann::ordered_json{{"steps", steps}, {"total_cost_us", plan->total_cost_us}, {"trace", plan->trace(from)}}
            .dump());
    return 0;
  }
  fmt::print("plan {} -> {} for a ({}) {} tensor on mesh {} ({} planner)\n", from.to_string(), to.to_string(),
             fmt::join(shape.dims(), ", "), dtype_name(dtype), mesh.describe(), c.planner);
  if (plan->steps.empty())
    fmt::print("nothing to do: the layouts are equal\n");
  else
    fmt::print("{:<10} {:<18} {:<15} {:>12} {:>12}  {}\n", "mesh dim", "from -> to", "collective", "bytes", "cost_us",
               "layout after");
  for (const auto& s : plan->steps)
    fmt::print("{:<10} {:<18} {:<15} {:>12} {:>12.3f}  {}\n", fmt::format("{}", fmt::join(s.mesh_dims, "+")),
               fmt::format("{} -> {}", s.from.to_string(), s.to.to_string()), collective_label(s),
               static_cast<int64_t>(s.bytes), s.cost_us, s.after.to_string());
  fmt::print("total {:.3f} us   trace {}\n", plan->total_cost_us, plan->trace(from));
  return 0;
}

Command add_layout_command(CLI::App& app) {
  auto cmd = std::make_shared<LayoutCommand>();
  CLI::App* layout = app.add_subcommand(
      "layout", "Print every rank's mesh coordinate, local shape and global offset for a tensor layout");
  layout->add_option("--mesh", cmd->mesh, "Mesh shape, e.g. 4,2")->required();
  layout->add_option("--shape", cmd->shape, "Global tensor shape, e.g. 18,2")->required();
  layout
      ->add_option("--placements", cmd->placements,
                   "One placement per mesh dim in PyTorch notation: R, S(0), S(0)[1], _S(0, 3), P(sum)")
      ->required();
  layout->add_flag("--json", cmd->json, "Print JSON");

  return {layout, [cmd] { return run_layout(*cmd); }};
}

Command add_plan_command(CLI::App& app) {
  auto cmd = std::make_shared<PlanCommand>();
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Print the cheapest sequence of collectives that redistributes a tensor from one layout to another, "
      "with each step's bytes and estimated time (PyTorch DTensor's cost model)");
  plan->add_option("--mesh", cmd->mesh, "Mesh shape, e.g. 2,2,2")->required();
  plan->add_option("--shape", cmd->shape, "Global tensor shape, e.g. 8,8,8")->required();
  plan->add_option("--from", cmd->from, "Source layout, e.g. S(0)S(0)S(0)")->required();
  plan->add_option("--to", cmd->to, "Target layout, e.g. RS(0)S(0)")->required();
  plan->add_option("--dtype", cmd->dtype, "Element type")->capture_default_str();
  plan->add_option("--planner", cmd->planner, "dijkstra (optimal under the cost model) or greedy (PyTorch's default)")
      ->capture_default_str();
  plan->add_option("--devices-per-host", cmd->devices_per_host,
                   "Ranks per host: inner mesh dims within a host get intra-host links (87.7 GB/s, 0.6 us), "
                   "outer ones inter-host links (19.3 GB/s, 2.7 us)")
      ->capture_default_str();
  plan->add_option("--link", cmd->links,
                   "Override one mesh dim's link: DIM:LATENCY_US:BANDWIDTH_GBPS (repeatable, once per dim)");
  plan->add_option("--all-to-all-penalty-us", cmd->all_to_all_penalty_us,
                   "Extra cost of an all_to_all over an all_gather of the same bytes (PyTorch used 1.0 until 2026)")
      ->capture_default_str();
  plan->add_flag("!--no-merge", cmd->merge,
                 "Do not merge consecutive same collectives on adjacent mesh dims into one flattened-group collective");
  plan->add_flag("--json", cmd->json, "Print JSON");

  return {plan, [cmd] { return run_plan(*cmd); }};
}

}  // namespace meshtrain::cli
