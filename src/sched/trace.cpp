#include "sched/trace.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::sched {

namespace {
constexpr int kComputeTrack = 1;
constexpr int kCommunicationTrack = 2;

nlohmann::json track_name(int rank, int track, const char* name) {
  return {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", track}, {"args", {{"name", name}}}};
}

nlohmann::json rank_tracks(int rank) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
  events.push_back(track_name(rank, kComputeTrack, "compute"));
  events.push_back(track_name(rank, kCommunicationTrack, "communication"));
  return events;
}
}  // namespace

std::string chrome_trace_events(const std::vector<NamedSpan>& spans, int rank) {
  nlohmann::json events = rank_tracks(rank);
  for (const NamedSpan& span : spans)
    events.push_back({{"ph", "X"},
                      {"name", span.name},
                      {"cat", span.communication ? "communication" : "kernel"},
                      {"pid", rank},
                      {"tid", span.communication ? kCommunicationTrack : kComputeTrack},
                      {"ts", span.begin_us},
                      {"dur", span.end_us - span.begin_us}});
  return events.dump();
}

std::string chrome_trace_events(const graph::Graph& g, const std::vector<graph::NodeSpan>& spans, int rank) {
  nlohmann::json events = rank_tracks(rank);
  std::map<graph::NodeId, double> started_at;  // a collective's start node -> when it started
  for (const graph::NodeSpan& span : spans) {
    MT_CHECK(span.node.valid() && static_cast<size_t>(span.node.index) < g.num_node_ids(),
             "trace: node {} is not in the graph", span.node.index);
    const graph::Node& node = g.node(span.node);
    nlohmann::json args{{"node", span.node.index}, {"phase", std::string(graph::phase_name(node.phase))}};
    if (!node.scope.empty()) args["scope"] = node.scope;
    if (!node.outputs.empty()) args["output"] = g.describe_value(node.outputs[0]);
    const char* category = node.op->is_collective ? "collective start" : node.op->is_wait ? "wait" : "kernel";
    events.push_back({{"ph", "X"},
                      {"name", node.op->name},
                      {"cat", category},
                      {"pid", rank},
                      {"tid", kComputeTrack},
                      {"ts", span.begin_us},
                      {"dur", span.end_us - span.begin_us},
                      {"args", std::move(args)}});
    if (node.op->is_collective) started_at[span.node] = span.begin_us;
    if (!node.op->is_wait) continue;
    // The collective it completes, in flight from its start to here. Several
    // can be in flight at once: async events, each on a lane of its own.
    const graph::NodeId start = g.value(node.inputs[0]).producer;
    const auto it = started_at.find(start);
    if (it == started_at.end()) continue;
    const graph::Node& collective = g.node(start);
    nlohmann::json begin{{"ph", "b"},
                         {"name", collective.op->name},
                         {"cat", "communication"},
                         {"id", start.index},
                         {"pid", rank},
                         {"tid", kCommunicationTrack},
                         {"ts", it->second},
                         {"args", {{"node", start.index}, {"attrs", collective.attrs.to_string()}}}};
    nlohmann::json end{{"ph", "e"},   {"name", collective.op->name}, {"cat", "communication"}, {"id", start.index},
                       {"pid", rank}, {"tid", kCommunicationTrack},  {"ts", span.end_us}};
    events.push_back(std::move(begin));
    events.push_back(std::move(end));
  }
  return events.dump();
}

std::string chrome_trace(const std::vector<std::string>& rank_events) {
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& text : rank_events) {
    nlohmann::json events = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    MT_CHECK(events.is_array(), "trace: a rank's events are not a JSON array");
    for (auto& e : events) all.push_back(std::move(e));
  }
  return nlohmann::json{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(all)}}.dump();
}

}  // namespace meshtrain::sched
