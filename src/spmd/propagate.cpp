#include "spmd/propagate.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "graph/extract.h"

namespace meshtrain::spmd {

namespace {

using sharding::Placement;

constexpr double kNodeUs = 1e-3;  // the least a redistribution costs

// Every full-mesh candidate: one of `per_dim` for each mesh dim, first dim
// slowest, so the enumeration order (and the tie-break) is fixed.
// A mesh dim of one rank splits nothing: there a node only runs replicated,
// so such dims never carry shards or partial sums.
void for_each_combination(const std::vector<DimStrategy>& per_dim, const sharding::DeviceMesh& mesh,
                          const std::function<void(const std::vector<const DimStrategy*>&)>& fn) {
  const int ndim = mesh.ndim();
  auto all_replicate = [](const DimStrategy& s) {
    auto replicate = [](const Placement& p) { return p.is_replicate(); };
    return std::all_of(s.inputs.begin(), s.inputs.end(), replicate) &&
           std::all_of(s.outputs.begin(), s.outputs.end(), replicate);
  };
  const DimStrategy& replicated = *std::find_if(per_dim.begin(), per_dim.end(), all_replicate);  // always listed
  std::vector<const DimStrategy*> chosen(static_cast<size_t>(ndim));
  std::function<void(int)> rec = [&](int m) {
    if (m == ndim) return fn(chosen);
    if (mesh.size(m) == 1) {
      chosen[static_cast<size_t>(m)] = &replicated;
      return rec(m + 1);
    }
    for (const DimStrategy& s : per_dim) {
      chosen[static_cast<size_t>(m)] = &s;
      rec(m + 1);
    }
  };
  rec(0);
}

// Whether every split a candidate requires to be even is: the dim divides by
// the product of the mesh dims that shard it.
bool splits_evenly(const std::vector<const DimStrategy*>& c, const sharding::DeviceMesh& mesh,
                   const graph::ValueInfos& in) {
  for (const DimStrategy* s : c)
    for (const EvenSplit& e : s->even_splits) {
      int64_t shards = 1;
      for (int m = 0; m < mesh.ndim(); ++m) {
        const Placement& p = c[static_cast<size_t>(m)]->inputs[static_cast<size_t>(e.input)];
        if (p.is_sharding() && p.dim == e.dim) shards *= mesh.size(m);
      }
      if (in[static_cast<size_t>(e.input)].shape[static_cast<size_t>(e.dim)] % (shards * e.multiple) != 0) return false;
    }
  return true;
}

// The share of a node's work the busiest rank does under candidate `c`:
// each mesh dim that splits an output divides it, a shard by the torch.chunk
// rule (a dim of n split s ways gives the first ranks ceil(n / s) of it, so
// 2 rows over 8 ranks leave one rank half the work, not an eighth), a
// partial sum (a split contraction) evenly.
double busiest_share(const std::vector<const DimStrategy*>& c, const sharding::DeviceMesh& mesh,
                     const graph::ValueInfos& outs) {
  double share = 1;
  std::map<std::pair<size_t, int>, int64_t> shards;  // (output, tensor dim) -> the ways it is split
  for (int m = 0; m < mesh.ndim(); ++m) {
    const std::vector<Placement>& ps = c[static_cast<size_t>(m)]->outputs;
    const auto split = std::find_if(ps.begin(), ps.end(), [](const Placement& p) { return !p.is_replicate(); });
    if (split == ps.end()) continue;
    if (split->is_sharding()) {
      const std::pair<size_t, int> where{static_cast<size_t>(split - ps.begin()), split->dim};
      shards.try_emplace(where, 1).first->second *= mesh.size(m);
    } else {
      share /= static_cast<double>(mesh.size(m));
    }
  }
  for (const auto& [where, ways] : shards) {
    const int64_t n = outs[where.first].shape[static_cast<size_t>(where.second)];
    if (n > 0) share *= static_cast<double>((n + ways - 1) / ways) / static_cast<double>(n);
  }
  return share;
}

Layout layout_of(const std::vector<const DimStrategy*>& c, bool output, size_t k) {
  std::vector<Placement> ps;
  for (const DimStrategy* s : c) ps.push_back(output ? s->outputs[k] : s->inputs[k]);
  return Layout::from_placements(std::move(ps));
}

// The mesh dims that shard one tensor dim together (two or more), in the
// order they apply, for each such tensor dim of `l`.
std::vector<std::vector<int>> shard_sequences(const Layout& l) {
  std::set<int> tensor_dims;
  for (const Placement& p : l.placements)
    if (p.is_sharding()) tensor_dims.insert(p.dim);
  std::vector<std::vector<int>> out;
  for (int d : tensor_dims)
    if (std::vector<int> seq = l.shard_sequence(d); seq.size() >= 2) out.push_back(std::move(seq));
  return out;
}

// Where several mesh dims shard one tensor dim of `l`, they apply in the
// first of `preferred` over the same mesh dims (else in mesh-dim order).
// A candidate orders all its operands so, after its inputs' current
// layouts: every operand of an op sees the same shard order (a tp-then-FSDP
// weight's gradient, moments and update stay tp-then-FSDP).
void order_like(Layout& l, const std::vector<std::vector<int>>& preferred) {
  for (const std::vector<int>& seq : shard_sequences(l)) {
    std::vector<int> set = seq;
    std::sort(set.begin(), set.end());
    for (const std::vector<int>& p : preferred) {
      std::vector<int> p_set = p;
      std::sort(p_set.begin(), p_set.end());
      if (p_set != set) continue;
      for (size_t i = 0; i < p.size(); ++i) l.order[static_cast<size_t>(p[i])] = static_cast<int>(i);
      break;
    }
  }
}

// A redistribution the planner can do: a Partial target only where the
// source already has that Partial.
bool reachable(const Layout& from, const Layout& to) {
  for (int m = 0; m < to.mesh_ndim(); ++m)
    if (to.placements[static_cast<size_t>(m)].is_partial() &&
        !(from.placements[static_cast<size_t>(m)] == to.placements[static_cast<size_t>(m)]))
      return false;
  return true;
}

bool has_partial(const Layout& l) {
  return std::any_of(l.placements.begin(), l.placements.end(), [](const Placement& p) { return p.is_partial(); });
}

// The bandwidth part of the cheapest plan that reduces every Partial of `l`
// away (to Replicate, or to a shard of the first dim): the plan's cost less
// that of the same plan moving no bytes. Only the bytes count, because
// pending sums add up before one reduction pays the latency (a gradient
// norm's partial sums of squares).
double reduction_bandwidth_us(sharding::Planner& planner, const graph::ValueInfo& v, const Layout& l) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<Placement> targets{Placement::replicate()};
  if (v.shape.rank() > 0) targets.push_back(Placement::shard(0));
  for (const Placement& target : targets) {
    std::vector<Placement> placements = l.placements;
    for (Placement& p : placements)
      if (p.is_partial()) p = target;
    const Layout reduced = Layout::from_placements(std::move(placements));
    const double cost = planner.plan(v.shape, dtype_size(v.dtype), l, reduced)->total_cost_us;
    const double latency = planner.plan(v.shape, 0, l, reduced)->total_cost_us;
    best = std::min(best, cost - latency);
  }
  return std::max(0.0, best);
}

// Each node's readers, by the operand they read a value as.
struct Reader {
  graph::NodeId node;
  size_t operand;
};
std::map<graph::ValueId, std::vector<Reader>> readers_of(const graph::Graph& g) {
  std::map<graph::ValueId, std::vector<Reader>> readers;
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    if (node.recomputes.valid()) continue;  // laid out as the node it recomputes
    for (size_t k = 0; k < node.inputs.size(); ++k) readers[node.inputs[k]].push_back({n, k});
  }
  return readers;
}

// One step of look-ahead: what a value laid out as `have` costs its readers
// before they can run, each redistributing it to the nearest layout one of
// its strategies reads it in (the least they pay, whatever their other
// inputs do). A node so does not pick a layout only an expensive
// redistribution undoes (an LM head split by vocabulary over data parallel,
// its logits moved back to rows by an all_to_all as large as they are,
// because gathering its input was cheaper than gathering its weight).
class ReaderCost {
 public:
  ReaderCost(const graph::Graph& g, sharding::Planner& planner) : g_(g), planner_(planner), readers_(readers_of(g)) {}

  // The nodes that read v (none: nullptr).
  const std::vector<Reader>* readers(graph::ValueId v) const {
    const auto it = readers_.find(v);
    return it == readers_.end() ? nullptr : &it->second;
  }

  double of(graph::ValueId v, const Layout& have) {
    const auto it = readers_.find(v);
    if (it == readers_.end()) return 0;
    const graph::ValueInfo& info = g_.value(v).info;
    const std::string key = key_of(have);
    const std::vector<std::vector<int>> preferred = shard_sequences(have);
    double total = 0;
    for (const Reader& r : it->second) {
      const Accepted& accepted = accepted_by(r);
      if (accepted.keys.count(key)) continue;
      // The nearest, planning only those whose lower bound may beat it.
      std::vector<std::pair<double, Layout>> wants;
      for (Layout want : accepted.layouts) {
        order_like(want, preferred);
        if (!reachable(have, want)) continue;
        const double floor = planner_.lower_bound_us(info.shape, dtype_size(info.dtype), have, want);
        wants.emplace_back(floor, std::move(want));
      }
      std::stable_sort(wants.begin(), wants.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      double least = std::numeric_limits<double>::infinity();
      for (const auto& [floor, want] : wants) {
        if (floor >= least) break;
        least = std::min(least, planner_.plan(info.shape, dtype_size(info.dtype), have, want)->total_cost_us);
      }
      if (least < std::numeric_limits<double>::infinity()) total += least;
    }
    return total;
  }

 private:
  struct Accepted {
    std::vector<Layout> layouts;  // in mesh-dim shard order
    std::set<std::string> keys;
  };
  static std::string key_of(const Layout& l) { return Layout::from_placements(l.placements).to_string(); }

  const Accepted& accepted_by(const Reader& r) {
    const std::pair<int32_t, size_t> at{r.node.index, r.operand};
    if (const auto it = accepted_.find(at); it != accepted_.end()) return it->second;
    const graph::Node& node = g_.node(r.node);
    const graph::ValueInfos in = graph::value_infos(g_, node.inputs), outs = graph::value_infos(g_, node.outputs);
    const std::vector<DimStrategy> per_dim = dim_strategies(StrategyQuery{*node.op, in, outs, node.attrs});
    Accepted accepted;
    for_each_combination(per_dim, planner_.mesh(), [&](const std::vector<const DimStrategy*>& c) {
      if (!splits_evenly(c, planner_.mesh(), in)) return;
      Layout l = layout_of(c, false, r.operand);
      if (accepted.keys.insert(key_of(l)).second) accepted.layouts.push_back(std::move(l));
    });
    return accepted_.emplace(at, std::move(accepted)).first->second;
  }

  const graph::Graph& g_;
  sharding::Planner& planner_;
  std::map<graph::ValueId, std::vector<Reader>> readers_;
  std::map<std::pair<int32_t, size_t>, Accepted> accepted_;
};

// Everything a node's choice of strategy depends on, as text: its op and
// attrs, its operands' shapes, dtypes and layouts, which of its inputs are
// pinned, the layouts its outputs must take, and its outputs' readers (op,
// attrs, operands: what the look-ahead costs). Nodes of the same key (a
// layer's node in every layer) choose alike, so one choice serves them all.
std::string choice_key(const graph::Graph& g, const graph::Node& node, const std::map<graph::ValueId, Layout>& values,
                       const std::map<graph::ValueId, Layout>& pinned, const std::map<graph::ValueId, Layout>& deliver,
                       const ReaderCost& reader_cost) {
  auto info = [&](graph::ValueId v) {
    const graph::ValueInfo& i = g.value(v).info;
    return fmt::format("{}{}", dtype_name(i.dtype), i.shape.to_string());
  };
  auto exact = [](const Layout& l) { return fmt::format("{}{}", l.to_string(), l.order); };
  auto op = [&](const graph::Node& n) { return fmt::format("{}{}", n.op->name, n.attrs.to_string()); };
  std::string key = op(node);
  auto out = std::back_inserter(key);
  for (graph::ValueId v : node.inputs)
    fmt::format_to(out, "|{} {}{}", info(v), exact(values.at(v)), pinned.count(v) ? " pinned" : "");
  for (graph::ValueId v : node.outputs) {
    fmt::format_to(out, "|>{}", info(v));
    for (const auto* wanted : {&pinned, &deliver})
      if (const auto it = wanted->find(v); it != wanted->end()) fmt::format_to(out, " as {}", exact(it->second));
    if (const std::vector<Reader>* readers = reader_cost.readers(v))
      for (const Reader& r : *readers) {
        const graph::Node& reader = g.node(r.node);
        fmt::format_to(out, " read by {} as {} of", op(reader), r.operand);
        for (graph::ValueId in : reader.inputs) fmt::format_to(out, " {}", info(in));
        fmt::format_to(out, " to");
        for (graph::ValueId o : reader.outputs) fmt::format_to(out, " {}", info(o));
      }
  }
  return key;
}

// Per input of `node`: whether its redistribution counts at
// PropagationOptions::parameter_share, being a parameter or computed from
// them alone (`from_parameters`), read by a forward node or, with
// share_in_backward, any node.
std::vector<bool> shared_inputs(const graph::Node& node, const std::vector<bool>& from_parameters,
                                const PropagationOptions& options) {
  std::vector<bool> shared;
  for (graph::ValueId v : node.inputs)
    shared.push_back(options.parameter_share != 1 &&
                     (options.share_in_backward || node.phase == graph::Phase::forward) &&
                     from_parameters[static_cast<size_t>(v.index)]);
  return shared;
}

// One node's choice of strategy: every full-mesh candidate that splits
// evenly, tried in the order of the least each can cost (its compute, and
// the least each redistribution of an input costs), and given up as soon
// as what it has cost so far cannot beat the best found. The winner is
// the candidate of least cost, ties to the first in enumeration order,
// exactly as trying them all in that order would find it.
class NodeChoice {
 public:
  NodeChoice(const graph::Graph& g, graph::NodeId n, sharding::Planner& planner,
             const std::map<graph::ValueId, Layout>& values, const std::map<graph::ValueId, Layout>& pinned,
             const std::map<graph::ValueId, Layout>& deliver, ReaderCost& reader_cost,
             const PropagationOptions& options, std::vector<bool> shared_inputs)
      : node_(g.node(n)),
        planner_(planner),
        values_(values),
        pinned_(pinned),
        deliver_(deliver),
        reader_cost_(reader_cost),
        in_(graph::value_infos(g, node_.inputs)),
        outs_(graph::value_infos(g, node_.outputs)),
        per_dim_(dim_strategies(StrategyQuery{*node_.op, in_, outs_, node_.attrs})),
        flops_(graph::op_flops(*node_.op, in_, outs_, node_.attrs)),
        flops_per_us_(options.flops_per_us),
        shared_(std::move(shared_inputs)),
        options_(options) {
    for (graph::ValueId v : node_.inputs)
      for (std::vector<int>& seq : shard_sequences(values_.at(v))) preferred_.push_back(std::move(seq));
    const bool all = !shared_.empty() && std::all_of(shared_.begin(), shared_.end(), [](bool b) { return b; });
    node_share_ = all ? options.parameter_share : 1.0;
  }

  // The best candidate and its cost (infinity: none is legal).
  std::pair<NodeSharding, double> best() {
    std::vector<Candidate> candidates = enumerate();
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      return a.floor != b.floor ? a.floor < b.floor : a.index < b.index;
    });
    for (Candidate& c : candidates) {
      if (c.floor > best_cost_) break;
      if (!beaten(c.floor, c.index)) cost(c);
    }
    return {std::move(best_), best_cost_};
  }

 private:
  struct Candidate {
    std::vector<const DimStrategy*> strategies;
    size_t index;           // in enumeration order
    NodeSharding sharding;  // its inputs' layouts and compute so far
    double floor;           // the least its cost can be
  };

  // What redistributing input k from `have` to `want` counts of its cost:
  // parameter_share for a value from parameters that changes only on the
  // dims it may be gathered over at that share, else all of it.
  double share(size_t k, const Layout& have, const Layout& want) const {
    if (!shared_[k]) return 1;
    for (int m = 0; m < have.mesh_ndim(); ++m)
      if (!(have.placements[m] == want.placements[m]) &&
          std::find(options_.parameter_gather_dims.begin(), options_.parameter_gather_dims.end(), m) ==
              options_.parameter_gather_dims.end())
        return 1;
    return options_.parameter_share;
  }

  // Whether a candidate that costs at least `cost` cannot win.
  bool beaten(double cost, size_t index) const {
    return cost > best_cost_ || (cost == best_cost_ && index > best_index_);
  }

  // Every legal candidate with the layouts it reads its inputs in.
  std::vector<Candidate> enumerate() {
    const sharding::DeviceMesh& mesh = planner_.mesh();
    std::vector<Candidate> out;
    size_t index = 0;
    for_each_combination(per_dim_, mesh, [&](const std::vector<const DimStrategy*>& c) {
      const size_t at = index++;
      if (!splits_evenly(c, mesh, in_)) return;
      Candidate cand{c, at, {}, 0};
      double nodes_us = 0;  // summed as the redistributions will be, each at least kNodeUs
      for (size_t k = 0; k < in_.size(); ++k) {
        const Layout& have = values_.at(node_.inputs[k]);
        Layout want = layout_of(c, false, k);
        order_like(want, preferred_);
        if (!reachable(have, want)) return;
        // A value pinned as a pending sum is read as it is: its reduction
        // belongs after this node (bf16 gradients widened, then reduced).
        if (!(have == want) && pinned_.count(node_.inputs[k]) && has_partial(have)) return;
        if (!(have == want))
          nodes_us +=
              share(k, have, want) * planner_.lower_bound_us(in_[k].shape, dtype_size(in_[k].dtype), have, want) +
              kNodeUs;
        cand.sharding.inputs.push_back(std::move(want));
      }
      cand.sharding.compute_us = node_share_ * flops_ * busiest_share(c, mesh, outs_) / flops_per_us_;
      cand.floor = nodes_us + cand.sharding.compute_us;
      out.push_back(std::move(cand));
    });
    return out;
  }

  // Costs a candidate, until what it has cost so far cannot win; keeps it
  // when it wins.
  void cost(Candidate& c) {
    NodeSharding& cand = c.sharding;
    for (size_t k = 0; k < in_.size(); ++k) {
      const Layout& have = values_.at(node_.inputs[k]);
      const Layout& want = cand.inputs[k];
      // Each redistribution is a node, a copy at least (the planner prices a
      // local shard at 0): of candidates that cost the same, the one that
      // leaves its inputs as they are wins.
      if (have == want) continue;
      cand.redistribute_us +=
          share(k, have, want) * planner_.plan(in_[k].shape, dtype_size(in_[k].dtype), have, want)->total_cost_us +
          kNodeUs;
      if (beaten(cand.redistribute_us + cand.compute_us, c.index)) return;
    }
    const double own = cand.redistribute_us + cand.compute_us;
    // An output pinned or delivered in a given layout (the residual stream,
    // an updated parameter) costs its redistribution to it too, so a node
    // does not pick a layout it must then undo.
    double deliver_us = 0;
    for (size_t k = 0; k < outs_.size(); ++k) {
      cand.outputs.push_back(layout_of(c.strategies, true, k));
      order_like(cand.outputs.back(), preferred_);
      bool wanted_as_is = false;
      for (const std::map<graph::ValueId, Layout>* wanted : {&pinned_, &deliver_}) {
        const auto d = wanted->find(node_.outputs[k]);
        if (d == wanted->end()) continue;
        wanted_as_is = true;
        if (d->second == cand.outputs.back()) continue;
        if (d->second.mesh_ndim() != planner_.mesh().ndim() || !reachable(cand.outputs.back(), d->second)) return;
        deliver_us +=
            planner_.plan(outs_[k].shape, dtype_size(outs_[k].dtype), cand.outputs.back(), d->second)->total_cost_us;
      }
      // A pending sum is reduced by some later reader: it costs at least
      // its cheapest reduction, so a node does not trade a small input
      // redistribution for a sum as large as its output (an LM head split
      // over its contraction makes every rank a partial sum of all the
      // logits).
      if (!wanted_as_is)
        deliver_us += has_partial(cand.outputs.back()) ? reduction_bandwidth_us(planner_, outs_[k], cand.outputs.back())
                                                       : reader_cost_.of(node_.outputs[k], cand.outputs.back());
      if (beaten(own + deliver_us, c.index)) return;
    }
    const double total = own + deliver_us;
    if (total == std::numeric_limits<double>::infinity() || beaten(total, c.index)) return;
    best_cost_ = total;
    best_index_ = c.index;
    best_ = std::move(cand);
  }

  const graph::Node& node_;
  sharding::Planner& planner_;
  const std::map<graph::ValueId, Layout>& values_;
  const std::map<graph::ValueId, Layout>& pinned_;
  const std::map<graph::ValueId, Layout>& deliver_;
  ReaderCost& reader_cost_;
  const graph::ValueInfos in_, outs_;
  const std::vector<DimStrategy> per_dim_;
  const double flops_, flops_per_us_;
  std::vector<std::vector<int>> preferred_;  // the shard orders of the inputs' layouts
  const std::vector<bool> shared_;           // per input: shared_inputs
  const PropagationOptions& options_;
  double node_share_ = 1;  // parameter_share if every input is shared
  NodeSharding best_;
  double best_cost_ = std::numeric_limits<double>::infinity();
  size_t best_index_ = std::numeric_limits<size_t>::max();
};
}  // namespace

std::optional<ChoiceCache::Choice> ChoiceCache::find(const std::string& key) const {
  std::lock_guard lock(mu_);
  const auto it = choices_.find(key);
  if (it == choices_.end()) return std::nullopt;
  return it->second;
}

void ChoiceCache::add(const std::string& key, const Choice& choice) {
  std::lock_guard lock(mu_);
  if (choices_.size() >= kMaxChoices) choices_.clear();
  choices_.emplace(key, choice);
}

size_t ChoiceCache::size() const {
  std::lock_guard lock(mu_);
  return choices_.size();
}

std::shared_ptr<ChoiceCache> shared_choices(const std::shared_ptr<sharding::Planner>& planner) {
  static std::mutex mu;
  static std::vector<std::pair<std::shared_ptr<sharding::Planner>, std::shared_ptr<ChoiceCache>>> caches;
  std::lock_guard lock(mu);
  for (const auto& [p, cache] : caches)
    if (p == planner) return cache;
  return caches.emplace_back(planner, std::make_shared<ChoiceCache>()).second;
}

Sharding propagate(const graph::Graph& g, sharding::Planner& planner, const std::map<graph::ValueId, Layout>& given,
                   const std::map<graph::ValueId, Layout>& deliver, const PropagationOptions& options) {
  const sharding::DeviceMesh& mesh = planner.mesh();
  Sharding out;
  const Layout replicated = Layout::from_placements(std::vector<Placement>(static_cast<size_t>(mesh.ndim())));
  std::map<graph::ValueId, Layout> pinned;
  for (const auto& [v, l] : given) {
    MT_CHECK(v.valid() && v.index < g.num_values(),
             "propagate: a layout is given for value {}, which is not in the graph", v.index);
    MT_CHECK(l.mesh_ndim() == mesh.ndim(), "propagate: {} has layout {} for a {}-d mesh", g.describe_value(v),
             l.to_string(), mesh.ndim());
    l.validate(static_cast<int>(g.value(v).info.shape.rank()));
    if (g.value(v).kind == graph::ValueKind::intermediate) pinned[v] = l;
  }
  for (int i = 0; i < g.num_values(); ++i) {
    const graph::ValueId v(i);
    if (g.value(v).kind == graph::ValueKind::intermediate) continue;
    const auto it = given.find(v);
    out.values[v] = it == given.end() ? replicated : it->second;
  }
  ReaderCost reader_cost(g, planner);
  // With a shared cache, everything else a choice depends on: the options (the planner is the cache's).
  const std::string options_key =
      options.choices ? fmt::format("{}|{}|{}|{}|", options.flops_per_us, options.parameter_share,
                                    fmt::join(options.parameter_gather_dims, ","), options.share_in_backward)
                      : std::string();
  const std::vector<bool> from_parameters = graph::from_parameters(g, options.share_in_backward).values;
  std::unordered_map<std::string, ChoiceCache::Choice> choices;  // choice_key -> the choice
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    if (node.recomputes.valid()) {
      // Laid out as the node it recomputes, so it computes the same bits.
      const graph::Node& original = g.node(node.recomputes);
      const NodeSharding& as = out.nodes.at(node.recomputes);
      for (size_t k = 0; k < node.inputs.size(); ++k)
        MT_CHECK(reachable(out.values.at(node.inputs[k]), as.inputs[k]),
                 "propagate: node {} ({}) recomputes node {}, but its input {} comes as {}, which cannot become {}",
                 n.index, node.op->name, node.recomputes.index, k, out.values.at(node.inputs[k]).to_string(),
                 as.inputs[k].to_string());
      for (size_t k = 0; k < node.outputs.size(); ++k) out.values[node.outputs[k]] = out.values.at(original.outputs[k]);
      out.nodes[n] = as;
      continue;
    }
    std::vector<bool> shared = shared_inputs(node, from_parameters, options);
    std::string key = choice_key(g, node, out.values, pinned, deliver, reader_cost);
    if (options.parameter_share != 1)
      for (const bool b : shared) key += b ? "|p" : "|-";
    auto chosen = choices.find(key);
    if (chosen == choices.end()) {
      const std::string shared_key = options.choices ? options_key + key : std::string();
      std::optional<ChoiceCache::Choice> known = options.choices ? options.choices->find(shared_key) : std::nullopt;
      if (!known) {
        known = NodeChoice{g, n, planner, out.values, pinned, deliver, reader_cost, options, std::move(shared)}.best();
        if (options.choices) options.choices->add(shared_key, *known);
      }
      chosen = choices.emplace(key, std::move(*known)).first;
    }
    auto [best, best_cost] = chosen->second;
    if (best_cost == std::numeric_limits<double>::infinity()) {
      std::string asked;
      for (graph::ValueId v : node.outputs)
        if (const auto d = deliver.find(v); d != deliver.end())
          asked += fmt::format(", whose output {} must be delivered as {}", g.describe_value(v), d->second.to_string());
      throw InvalidArgument(
          fmt::format("propagate: no legal strategy for node {} ({}){}", n.index, node.op->name, asked));
    }
    best.has_rule = has_strategy_rule(node.op->name);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const auto pin = pinned.find(node.outputs[k]);
      out.values[node.outputs[k]] = pin == pinned.end() ? best.outputs[k] : pin->second;
    }
    out.nodes[n] = std::move(best);
  }
  for (graph::ValueId v : g.outputs()) {
    const auto it = deliver.find(v);
    const Layout& want = it == deliver.end() ? out.values.at(v) : it->second;
    MT_CHECK(want.mesh_ndim() == mesh.ndim() && reachable(out.values.at(v), want),
             "propagate: graph output {} comes out as {} and cannot be delivered as {}", g.describe_value(v),
             out.values.at(v).to_string(), want.to_string());
    out.outputs[v] = want;
  }
  return out;
}

std::string to_text(const graph::Graph& g, const Sharding& s) {
  std::string text;
  for (int i = 0; i < g.num_values(); ++i) {
    const graph::ValueId v(i);
    const graph::Value& val = g.value(v);
    if (val.kind == graph::ValueKind::intermediate) continue;
    text += fmt::format("{} %{}:{}: {}{} {}\n", val.kind == graph::ValueKind::input ? "input" : "param", i, val.name,
                        dtype_name(val.info.dtype), val.info.shape.to_string(), s.values.at(v).to_string());
  }
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    const NodeSharding& ns = s.nodes.at(n);
    std::vector<std::string> outs, ins;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const graph::ValueId v = node.outputs[k];
      const Layout& pinned_as = s.values.at(v);
      outs.push_back(fmt::format("%{}: {}{} {}{}", v.index, dtype_name(g.value(v).info.dtype),
                                 g.value(v).info.shape.to_string(), ns.outputs[k].to_string(),
                                 pinned_as == ns.outputs[k] ? "" : "->" + pinned_as.to_string()));
    }
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const graph::ValueId v = node.inputs[k];
      const Layout& have = s.values.at(v);
      ins.push_back(have == ns.inputs[k]
                        ? fmt::format("%{}", v.index)
                        : fmt::format("%{} {}->{}", v.index, have.to_string(), ns.inputs[k].to_string()));
    }
    text += fmt::format("{} = {}({}){}\n", fmt::join(outs, ", "), node.op->name, fmt::join(ins, ", "),
                        ns.has_rule ? "" : "  # no strategy rule: replicated");
  }
  std::vector<std::string> outs;
  for (const auto& [v, want] : s.outputs) {
    const Layout& have = s.values.at(v);
    outs.push_back(have == want ? fmt::format("%{}", v.index)
                                : fmt::format("%{} {}->{}", v.index, have.to_string(), want.to_string()));
  }
  if (!outs.empty()) text += fmt::format("outputs {}\n", fmt::join(outs, ", "));
  return text;
}

}  // namespace meshtrain::spmd
