// `meshtrain layout` and `meshtrain plan`: local shapes/offsets of a layout
// and the redistribution plan between two layouts, without running anything.
#pragma once

#include <string>
#include <vector>

#include "cli/command.h"

namespace meshtrain::cli {

struct LayoutCommand {
  std::string mesh;  // "4,2"
  std::string shape;
  std::string placements;
  bool json = false;
};
int run_layout(const LayoutCommand& c);

struct PlanCommand {
  std::string mesh;
  std::string shape;
  std::string from, to;
  std::string dtype = "f32";
  std::string planner = "dijkstra";
  int devices_per_host = 8;
  std::vector<std::string> links;  // "DIM:LATENCY_US:BANDWIDTH_GBPS"
  double all_to_all_penalty_us = 0.0;
  bool merge = true;
  bool json = false;
};
int run_plan(const PlanCommand& c);

// `meshtrain layout` and `meshtrain plan`, added to `app` with their options.
Command add_layout_command(CLI::App& app);
Command add_plan_command(CLI::App& app);

}  // namespace meshtrain::cli
