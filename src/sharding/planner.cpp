#include "sharding/planner.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>

#include "core/error.h"

namespace meshtrain::sharding {

PlannerKind parse_planner_kind(std::string_view name) {
  if (name == "dijkstra") return PlannerKind::dijkstra;
  if (name == "greedy") return PlannerKind::greedy;
  throw InvalidArgument(fmt::format("unknown planner '{}': expected dijkstra or greedy", name));
}

namespace {

constexpr int kMaxMeshDims = 8;
constexpr double kInf = std::numeric_limits<double>::infinity();
using Kind = Placement::Kind;
using comm::OpType;
// A step's collective; nullopt (kLocal) for a local step.
using StepOp = std::optional<OpType>;
constexpr StepOp kLocal = std::nullopt;

// A layout packed into 40 bytes so the search copies and hashes it cheaply:
// per mesh dim a placement code (kind, reduce op, tensor dim, split factor)
// and its position in its tensor dim's shard order.
struct State {
  std::array<uint32_t, kMaxMeshDims> code{};
  std::array<int8_t, kMaxMeshDims> order{};
  bool operator==(const State& o) const { return code == o.code && order == o.order; }
};

struct StateHash {
  size_t operator()(const State& s) const {
    uint64_t words[5];
    std::memcpy(words, &s, sizeof(words));
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (uint64_t w : words) h = (h ^ w) * 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
    return h;
  }
};
static_assert(sizeof(State) == 40);

uint32_t encode(const Placement& p) {
  return static_cast<uint32_t>(p.kind) | static_cast<uint32_t>(p.reduce) << 2 |
         static_cast<uint32_t>(std::max(p.dim, 0) & 0xFF) << 4 | static_cast<uint32_t>(p.split_factor & 0xFFFF) << 12;
}
Kind kind_of(uint32_t c) { return static_cast<Kind>(c & 3); }
int dim_of(uint32_t c) { return static_cast<int>((c >> 4) & 0xFF); }
Placement decode(uint32_t c) {
  Placement p;
  p.kind = kind_of(c);
  p.reduce = static_cast<ReduceOp>((c >> 2) & 3);
  p.dim = (p.kind == Kind::shard || p.kind == Kind::strided_shard) ? dim_of(c) : -1;
  p.split_factor = static_cast<int>((c >> 12) & 0xFFFF);
  return p;
}
const uint32_t kReplicate = encode(Placement::replicate());
bool is_sharding(uint32_t c) { return kind_of(c) == Kind::shard || kind_of(c) == Kind::strided_shard; }

State to_state(const Layout& l) {
  State s;
  for (int m = 0; m < l.mesh_ndim(); ++m) {
    s.code[m] = encode(l.placements[m]);
    s.order[m] = static_cast<int8_t>(l.order[m]);
  }
  for (int m = l.mesh_ndim(); m < kMaxMeshDims; ++m) s.order[m] = -1;
  return s;
}

Layout to_layout(const State& s, int ndim) {
  Layout l;
  for (int m = 0; m < ndim; ++m) {
    l.placements.push_back(decode(s.code[m]));
    l.order.push_back(s.order[m]);
  }
  return l;
}

// The graph one search walks, besides its states: the mesh sizes, the
// tensor, the cost model and which edges may leave a state.
struct SearchSpace {
  int ndim;
  int tensor_rank;
  std::array<int, kMaxMeshDims> sizes{};
  double total_bytes;
  const CostModel* model;
  std::vector<uint32_t> target_partials;  // reduce ops an R->P edge may create
  std::vector<uint32_t> target_strided;   // strided shards an R->SS edge may create
  // One-rank mesh dims that are Replicate in source and target: left so.
  // On one rank a placement is a relabelling at no cost, so any path through
  // other placements there projects onto one as cheap that leaves the dim
  // alone; searching them only multiplies the states.
  std::array<bool, kMaxMeshDims> frozen{};

  int last_shard(const State& s, int tensor_dim) const {
    int best = -1;
    for (int m = 0; m < ndim; ++m)
      if (is_sharding(s.code[m]) && dim_of(s.code[m]) == tensor_dim && (best < 0 || s.order[m] > s.order[best]))
        best = m;
    return best;
  }
  int8_t shard_count(const State& s, int tensor_dim) const {
    int8_t k = 0;
    for (int m = 0; m < ndim; ++m) k += is_sharding(s.code[m]) && dim_of(s.code[m]) == tensor_dim;
    return k;
  }
  // Bytes each rank holds: PyTorch divides by the exact Shard dims only;
  // strided shards divide the data just the same, so they count here.
  double local_bytes(const State& s) const {
    double shards = 1;
    for (int m = 0; m < ndim; ++m)
      if (is_sharding(s.code[m])) shards *= sizes[m];
    return total_bytes / shards;
  }
  // (bytes of the collective's buffer, cost) of collective c over a group
  // of n ranks. A one-rank group holds the whole tensor under any
  // placement: nothing moves, nothing is paid.
  std::pair<double, double> step(const State& before, StepOp c, int n, const LinkParams& link) const {
    if (!c || n == 1) return {0.0, 0.0};
    const double local = local_bytes(before);
    switch (*c) {
      case OpType::all_gather:
        return {local * n, model->all_gather_us(local * n, n, link)};
      case OpType::reduce_scatter:
        return {local, model->reduce_scatter_us(local, n, link)};
      case OpType::all_reduce:
        return {local, model->all_reduce_us(local, n, link)};
      case OpType::all_to_all:
        return {local, model->all_to_all_us(local, n, link)};
      default:
        break;  // the planner emits no other collective
    }
    return {0.0, kInf};
  }
  double edge_cost(const State& before, StepOp c, int m) const {
    return step(before, c, sizes[m], model->links[m]).second;
  }

  // s with mesh dim m set to `code`: a shard goes innermost in its tensor
  // dim's order; anything else leaves the order.
  State with(const State& s, int m, uint32_t code) const {
    State next = s;
    next.code[m] = code;
    next.order[m] = is_sharding(code) ? shard_count(s, dim_of(code)) : -1;
    return next;
  }

  // The planner's edges, in PyTorch's order (its tie-breaking depends on it).
  template <typename Emit>
  void for_each_edge(const State& s, Emit&& emit) const {
    // all_gather of each tensor dim's innermost shard of the given kind.
    auto gather_innermost = [&](Kind kind) {
      for (int a = 0; a < tensor_rank; ++a) {
        const int y = last_shard(s, a);
        if (y >= 0 && kind_of(s.code[y]) == kind) emit(with(s, y, kReplicate), y, OpType::all_gather);
      }
    };
    // Mesh dim m (holding R or P) shards tensor dim b, for every b.
    auto shard_each_dim = [&](int m, StepOp c) {
      for (int b = 0; b < tensor_rank; ++b) emit(with(s, m, encode(Placement::shard(b))), m, c);
    };
    // 1. S(a) -> S(b): all_to_all of the innermost shard of a.
    for (int a = 0; a < tensor_rank; ++a) {
      const int y = last_shard(s, a);
      if (y < 0 || kind_of(s.code[y]) != Kind::shard) continue;
      for (int b = 0; b < tensor_rank; ++b)
        if (b != a) emit(with(s, y, encode(Placement::shard(b))), y, OpType::all_to_all);
    }
    // 2. S -> R: all_gather of the innermost shard.
    gather_innermost(Kind::shard);
    // 3. P -> R: all_reduce.
    for (int m = 0; m < ndim; ++m)
      if (kind_of(s.code[m]) == Kind::partial) emit(with(s, m, kReplicate), m, OpType::all_reduce);
    // 4. R -> S(b): local chunk, appended innermost.
    for (int m = 0; m < ndim; ++m)
      if (s.code[m] == kReplicate && !frozen[m]) shard_each_dim(m, kLocal);
    // 5. P -> S(b): reduce_scatter.
    for (int m = 0; m < ndim; ++m)
      if (kind_of(s.code[m]) == Kind::partial) shard_each_dim(m, OpType::reduce_scatter);
    // 6. R -> P(op): local, only ops the target holds, never mixing ops.
    for (int m = 0; m < ndim; ++m) {
      if (s.code[m] != kReplicate || frozen[m]) continue;
      for (uint32_t op : target_partials) {
        bool mixes = false;
        for (int k = 0; k < ndim; ++k) mixes |= kind_of(s.code[k]) == Kind::partial && s.code[k] != op;
        if (!mixes) emit(with(s, m, op), m, kLocal);
      }
    }
    // 8. SS -> R: all_gather of an innermost strided shard (then permute).
    gather_innermost(Kind::strided_shard);
    // 11. R -> SS: local strided split, for the strided shards of the target.
    for (int m = 0; m < ndim; ++m)
      if (s.code[m] == kReplicate && !frozen[m])
        for (uint32_t ss : target_strided) emit(with(s, m, ss), m, kLocal);
  }
};

SearchSpace make_search_space(const DeviceMesh& mesh, const CostModel& model, const Shape& shape, size_t element_size,
                              const Layout& src, const Layout& dst) {
  SearchSpace sp;
  sp.ndim = mesh.ndim();
  sp.tensor_rank = static_cast<int>(shape.rank());
  for (int m = 0; m < mesh.ndim(); ++m) {
    sp.sizes[m] = mesh.size(m);
    sp.frozen[m] = sp.sizes[m] == 1 && src.placements[m].is_replicate() && dst.placements[m].is_replicate();
  }
  double numel = 1;
  for (int64_t d : shape.dims()) numel *= static_cast<double>(d);
  sp.total_bytes = numel * static_cast<double>(element_size);
  sp.model = &model;
  for (const auto& p : dst.placements) {
    const uint32_t c = encode(p);
    auto& list = p.is_partial() ? sp.target_partials : sp.target_strided;
    if ((p.is_partial() || p.kind == Kind::strided_shard) && std::find(list.begin(), list.end(), c) == list.end())
      list.push_back(c);
  }
  return sp;
}

StepOp collective_between(const Placement& from, const Placement& to) {
  if (from == to) return kLocal;
  if (from.is_partial() && to.is_replicate()) return OpType::all_reduce;
  if (from.is_partial() && to.kind == Kind::shard) return OpType::reduce_scatter;
  if (from.is_sharding() && to.is_replicate()) return OpType::all_gather;
  if (from.kind == Kind::shard && to.kind == Kind::shard) return OpType::all_to_all;
  if (from.is_replicate() && (to.is_sharding() || to.is_partial())) return kLocal;
  // greedy() asks only for these: plan_uncached refused a Partial target the
  // source does not hold, and greedy refused strided shards.
  MT_ASSERT(false, "no single collective turns {} into {}", from.to_string(), to.to_string());
  return kLocal;
}

// Renumber each tensor dim's shard positions to 0..k-1, keeping their order.
void normalize_order(State& s, int ndim) {
  for (int m = 0; m < ndim; ++m) {
    if (!is_sharding(s.code[m])) {
      s.order[m] = -1;
      continue;
    }
    int8_t rank = 0;
    for (int k = 0; k < ndim; ++k)
      if (k != m && is_sharding(s.code[k]) && dim_of(s.code[k]) == dim_of(s.code[m]) && s.order[k] < s.order[m]) ++rank;
    s.order[m] = rank;
  }
}

struct RawStep {
  State before, after;
  int mesh_dim;
  StepOp collective;
};

// A lower bound of the cost from a state to dst, for pruning the search:
// each mesh dim (of more than one rank) that leaves a Shard or Partial not
// in dst needs at least one collective on it (a launch and its latencies),
// and only all_gathers grow a rank's bytes, each paying the growth over
// the link's bandwidth.
class RemainingBound {
 public:
  RemainingBound(const SearchSpace& sp, const State& dst) : sp_(sp), dst_(dst), dst_bytes_(sp.local_bytes(dst)) {
    for (int m = 0; m < sp.ndim; ++m) {
      leave_us_[m] = sp.sizes[m] > 1 ? std::max(0.0, sp.model->launch_us) +
                                           std::max(0.0, (sp.sizes[m] - 1) * sp.model->links[m].latency_us)
                                     : 0;
      if (sp.sizes[m] > 1 && sp.model->links[m].bandwidth_gbps > fastest_.bandwidth_gbps) fastest_ = sp.model->links[m];
    }
  }
  double operator()(const State& s) const {
    double h = 0;
    for (int m = 0; m < sp_.ndim; ++m)
      if (s.code[m] != kReplicate && s.code[m] != dst_.code[m]) h += leave_us_[m];
    const double growth = dst_bytes_ - sp_.local_bytes(s);
    if (growth > 0 && fastest_.bandwidth_gbps > 0) h += sp_.model->transfer_us(growth, fastest_);
    return h;
  }

 private:
  const SearchSpace& sp_;
  const State& dst_;
  double dst_bytes_;
  std::array<double, kMaxMeshDims> leave_us_{};
  LinkParams fastest_{0.0, 0.0};
};

// The search's storage, kept per thread from one search to the next: the
// states reached (open addressing; a slot is live when it carries this
// search's stamp), the nodes of the paths and the heap.
struct SearchScratch {
  struct Node {
    State state;
    int parent;
    int mesh_dim;
    StepOp collective;
  };
  struct Entry {
    double cost;
    uint64_t counter;
    int node;
    bool operator>(const Entry& o) const { return cost != o.cost ? cost > o.cost : counter > o.counter; }
  };
  struct Slot {
    State state;
    double cost;
    uint32_t stamp = 0;
    bool closed;
  };
  std::vector<Slot> slots = std::vector<Slot>(1024);
  size_t live = 0;
  uint32_t stamp = 0;
  std::vector<Node> nodes;
  std::vector<Entry> heap;

  void start() {
    if (++stamp == 0) {  // the stamps wrapped: forget every slot
      for (Slot& slot : slots) slot.stamp = 0;
      stamp = 1;
    }
    live = 0;
    nodes.clear();
    heap.clear();
  }
  // The slot of `s`, and whether it was new (then its cost and flag are unset).
  std::pair<Slot*, bool> find_or_add(const State& s) {
    if (2 * (live + 1) > slots.size()) grow();
    const size_t mask = slots.size() - 1;
    for (size_t i = StateHash{}(s)&mask;; i = (i + 1) & mask) {
      Slot& slot = slots[i];
      if (slot.stamp != stamp) {
        slot.state = s;
        slot.stamp = stamp;
        ++live;
        return {&slot, true};
      }
      if (slot.state == s) return {&slot, false};
    }
  }
  Slot& at(const State& s) { return *find_or_add(s).first; }

 private:
  void grow() {
    std::vector<Slot> old = std::move(slots);
    slots.assign(old.size() * 2, Slot{});
    live = 0;
    for (const Slot& slot : old)
      if (slot.stamp == stamp) {
        auto [fresh, added] = find_or_add(slot.state);
        fresh->cost = slot.cost;
        fresh->closed = slot.closed;
      }
  }
};

// Dijkstra in PyTorch's edge order, first-pushed first among equal costs.
// With `prune`, two prunings keep its answer exactly: a state is not pushed
// again at a cost no lower than its best so far (the earlier push wins the
// tie), and, once a path to dst is known, a state whose cost plus its lower
// bound to dst exceeds that path's cannot lie on a cheapest path.
std::vector<RawStep> dijkstra(const SearchSpace& sp, const State& src, const State& dst, bool prune) {
  thread_local SearchScratch scratch;
  SearchScratch& w = scratch;
  w.start();
  const RemainingBound remaining(sp, dst);
  w.nodes.push_back({src, -1, -1, kLocal});
  auto [first, added] = w.find_or_add(src);
  first->cost = 0;
  first->closed = false;
  const auto later = std::greater<>{};
  w.heap.push_back({0.0, 0, 0});
  uint64_t counter = 0;
  double best_known = kInf;  // the cheapest path to dst pushed so far
  while (!w.heap.empty()) {
    std::pop_heap(w.heap.begin(), w.heap.end(), later);
    const SearchScratch::Entry e = w.heap.back();
    w.heap.pop_back();
    const State here = w.nodes[static_cast<size_t>(e.node)].state;
    if (here == dst) {
      std::vector<RawStep> path;
      for (int i = e.node; w.nodes[static_cast<size_t>(i)].parent >= 0; i = w.nodes[static_cast<size_t>(i)].parent) {
        const SearchScratch::Node& n = w.nodes[static_cast<size_t>(i)];
        path.push_back({w.nodes[static_cast<size_t>(n.parent)].state, n.state, n.mesh_dim, n.collective});
      }
      std::reverse(path.begin(), path.end());
      return path;
    }
    SearchScratch::Slot& mine = w.at(here);
    if (mine.closed) continue;
    mine.closed = true;
    sp.for_each_edge(here, [&](const State& next, int m, StepOp c) {
      const double cost = e.cost + sp.edge_cost(here, c, m);
      // Rounding in the sums must never prune a cheapest path: keep a margin.
      if (prune && best_known < kInf && cost + remaining(next) > best_known * (1 + 1e-9) + 1e-9) return;
      auto [slot, fresh] = w.find_or_add(next);
      if (fresh) {
        slot->cost = cost;
        slot->closed = false;
      } else {
        if (slot->closed || (prune && cost >= slot->cost)) return;
        slot->cost = std::min(slot->cost, cost);
      }
      if (next == dst) best_known = std::min(best_known, cost);
      w.nodes.push_back({next, e.node, m, c});
      w.heap.push_back({cost, ++counter, static_cast<int>(w.nodes.size()) - 1});
      std::push_heap(w.heap.begin(), w.heap.end(), later);
    });
  }
  // Every layout reaches Replicate (gathers, all_reduces) and Replicate
  // reaches every layout plan_uncached accepts (local shards and partials).
  MT_ASSERT(false, "redistribution planner found no path from {} to {}", to_layout(src, sp.ndim).to_string(),
            to_layout(dst, sp.ndim).to_string());
  return {};
}

bool is_default_order(const Layout& l) {
  for (int m = 0; m < l.mesh_ndim(); ++m)
    for (int k = m + 1; k < l.mesh_ndim(); ++k)
      if (l.placements[m].is_sharding() && l.placements[k].is_sharding() &&
          l.placements[m].dim == l.placements[k].dim && l.order[m] > l.order[k])
        return false;
  return true;
}

// PyTorch's generate_greedy_transform_infos: a reverse pass that un-nests
// shards innermost-first, then a forward pass outer -> inner.
std::vector<RawStep> greedy(const SearchSpace& sp, const Layout& src, const Layout& dst) {
  for (const Layout* l : {&src, &dst}) {
    MT_CHECK(is_default_order(*l), "the greedy planner handles default shard orders only, {} is not; use dijkstra",
             l->to_string());
    for (const auto& p : l->placements)
      MT_CHECK(p.kind != Kind::strided_shard, "the greedy planner does not handle strided shards ({}); use dijkstra",
               l->to_string());
  }
  const int n = sp.ndim;
  std::vector<std::pair<int, Placement>> transforms;
  std::vector<Placement> cur = src.placements;
  const std::vector<Placement>& tgt = dst.placements;
  int num_shards = 1;
  for (int m = 0; m < n; ++m)
    if (cur[m].kind == Kind::shard) num_shards *= sp.sizes[m];
  if (n > 1 && num_shards > 1) {
    for (int m = n - 1; m >= 0; --m) {
      Placement t = tgt[m];
      if (t.kind == Kind::shard) {
        bool same_nesting = true;
        for (int i = 0; i < m; ++i) {
          const bool in_cur = cur[i].kind == Kind::shard && cur[i].dim == t.dim;
          const bool in_tgt = tgt[i].kind == Kind::shard && tgt[i].dim == t.dim;
          same_nesting &= in_cur == in_tgt;
        }
        if (!same_nesting) t = Placement::replicate();
      }
      if (!(cur[m] == t)) {
        transforms.emplace_back(m, t);
        cur[m] = t;
      }
    }
  }
  for (int m = 0; m < n; ++m)
    if (!(cur[m] == tgt[m])) {
      transforms.emplace_back(m, tgt[m]);
      cur[m] = tgt[m];
    }
  std::vector<RawStep> steps;
  State s = to_state(src);
  for (const auto& [m, to] : transforms) {
    State next = s;
    next.code[m] = encode(to);
    next.order[m] = to.is_sharding() ? std::numeric_limits<int8_t>::max() : -1;  // appended innermost
    normalize_order(next, n);
    steps.push_back({s, next, m, collective_between(decode(s.code[m]), to)});
    s = next;
  }
  return steps;
}

// Whether every split of tensor dim d in state s is even: all its shards
// are exact Shards (a strided shard's sf pieces can be uneven: 8 rows with
// sf 3 over 2 ranks give 5 and 3) and the dim divides by their product.
bool evenly_sharded(const SearchSpace& sp, const State& s, int d, int64_t dim_size) {
  int64_t k = 1;
  for (int m = 0; m < sp.ndim; ++m) {
    if (!is_sharding(s.code[m]) || dim_of(s.code[m]) != d) continue;
    if (kind_of(s.code[m]) != Kind::shard) return false;
    k *= sp.sizes[m];
  }
  return dim_size % k == 0;
}

Plan build_plan(const SearchSpace& sp, const std::vector<RawStep>& raw, const Shape& shape, bool merge) {
  Plan plan;
  for (size_t i = 0; i < raw.size();) {
    const RawStep& first = raw[i];
    // On a one-rank mesh dim a change of placement is a relabelling: no collective.
    const StepOp c = sp.sizes[first.mesh_dim] == 1 ? kLocal : first.collective;
    size_t j = i;
    // all_gather peels shards innermost first (mesh dims descending),
    // reduce_scatter appends them (ascending); all_reduce goes either way.
    const int direction = c == OpType::all_gather ? -1 : c == OpType::reduce_scatter ? 1 : 0;
    // Strided gathers put pieces back by index, not as one flat chunk: never merged.
    const bool mergeable = (c == OpType::all_gather && kind_of(first.before.code[first.mesh_dim]) == Kind::shard) ||
                           c == OpType::reduce_scatter || c == OpType::all_reduce;
    if (merge && mergeable) {
      while (j + 1 < raw.size() && raw[j + 1].collective == c &&
             raw[j + 1].before.code[raw[j + 1].mesh_dim] == first.before.code[first.mesh_dim] &&
             raw[j + 1].after.code[raw[j + 1].mesh_dim] == first.after.code[first.mesh_dim]) {
        const int step = raw[j + 1].mesh_dim - raw[j].mesh_dim;
        if (direction != 0 ? step != direction : std::abs(step) != 1) break;
        if (direction == 0 && j > i && step != raw[j].mesh_dim - raw[j - 1].mesh_dim) break;
        ++j;
      }
    }
    std::vector<int> dims;
    double separate_cost = 0;
    for (size_t k = i; k <= j; ++k) {
      dims.push_back(raw[k].mesh_dim);
      separate_cost += sp.edge_cost(raw[k].before, raw[k].collective, raw[k].mesh_dim);
    }
    std::sort(dims.begin(), dims.end());
    bool merged = j > i;
    if (merged && c != OpType::all_reduce) {
      // A flat split over the merged group equals the nested one only when
      // every nested chunk is even (torch.chunk(5,4) != chunk(chunk(5,2),2)).
      const State& sharded = c == OpType::all_gather ? first.before : raw[j].after;
      const int d =
          dim_of(c == OpType::all_gather ? first.before.code[first.mesh_dim] : raw[j].after.code[raw[j].mesh_dim]);
      merged = evenly_sharded(sp, sharded, d, shape[d]);
    }
    // (bytes, cost) of the first step alone, or of the merged collective when it is cheaper.
    auto chosen = sp.step(first.before, c, sp.sizes[first.mesh_dim], sp.model->links[first.mesh_dim]);
    if (merged) {
      int n = 1;
      for (int m : dims) n *= sp.sizes[m];
      const auto combined = sp.step(first.before, c, n, sp.model->merged_link(dims));
      if (combined.second < separate_cost)
        chosen = combined;
      else
        merged = false;
    }
    if (!merged) j = i;
    PlanStep out;
    out.mesh_dims = merged ? dims : std::vector<int>{first.mesh_dim};
    out.from = decode(first.before.code[first.mesh_dim]);
    out.to = decode(first.after.code[first.mesh_dim]);
    out.collective = c;
    out.bytes = chosen.first;
    out.cost_us = chosen.second;
    out.before = to_layout(first.before, sp.ndim);
    out.after = to_layout(raw[j].after, sp.ndim);
    plan.total_cost_us += out.cost_us;
    plan.steps.push_back(std::move(out));
    i = j + 1;
  }
  return plan;
}

size_t hash_layout(const Layout& l, size_t h) {
  for (int m = 0; m < l.mesh_ndim(); ++m)
    h = (h ^ (encode(l.placements[m]) + 0x9E3779B9u + static_cast<uint32_t>(l.order[m] + 1) * 131u)) * 0x100000001B3ull;
  return h;
}

}  // namespace

std::string Plan::trace(const Layout& src) const {
  std::string s = src.to_string();
  for (const auto& step : steps) s += (step.mesh_dims.size() > 1 ? "-->" : "->") + step.after.to_string();
  return s;
}

Planner::Planner(DeviceMesh mesh, CostModel model) : mesh_(std::move(mesh)), model_(std::move(model)) {
  MT_CHECK(mesh_.ndim() <= kMaxMeshDims, "the planner handles meshes of up to {} dims, got {}", kMaxMeshDims,
           mesh_.ndim());
  MT_CHECK(static_cast<int>(model_.links.size()) == mesh_.ndim(), "cost model has {} links for a {}-d mesh",
           model_.links.size(), mesh_.ndim());
}

Plan Planner::plan_uncached(const Shape& shape, size_t element_size, const Layout& src, const Layout& dst,
                            PlanOptions options) const {
  const int rank = static_cast<int>(shape.rank());
  MT_CHECK(rank <= 127, "tensors of up to 127 dims, got {}", rank);
  for (const Layout* l : {&src, &dst})
    MT_CHECK(l->mesh_ndim() == mesh_.ndim(), "layout {} has {} placements but the mesh {} has {} dims", l->to_string(),
             l->mesh_ndim(), mesh_.describe(), mesh_.ndim());
  src.validate(rank);
  dst.validate(rank);
  for (int m = 0; m < mesh_.ndim(); ++m) {
    const Placement& t = dst.placements[m];
    MT_CHECK(!t.is_partial() || src.placements[m] == t,
             "cannot redistribute {} to {}: mesh dim {} would become {} from {}. A target may be Partial only "
             "where the source already is, with the same reduce op: a pending reduction cannot be created by "
             "communication",
             src.to_string(), dst.to_string(), m, t.to_string(), src.placements[m].to_string());
  }
  if (src == dst) return {};
  const SearchSpace sp = make_search_space(mesh_, model_, shape, element_size, src, dst);
  const auto raw = options.kind == PlannerKind::greedy ? greedy(sp, src, dst)
                                                       : dijkstra(sp, to_state(src), to_state(dst), options.prune);
  return build_plan(sp, raw, shape, options.merge);
}

std::shared_ptr<const Plan> Planner::plan(const Shape& shape, size_t element_size, const Layout& src, const Layout& dst,
                                          PlanOptions options) {
  CacheKey key{shape, element_size, src, dst, options};
  {
    std::lock_guard lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  auto plan = std::make_shared<const Plan>(plan_uncached(shape, element_size, src, dst, options));
  std::lock_guard lock(mu_);
  return cache_.emplace(std::move(key), std::move(plan)).first->second;
}

double Planner::lower_bound_us(const Shape& shape, size_t element_size, const Layout& src, const Layout& dst) const {
  double bytes = static_cast<double>(element_size);
  for (int64_t d : shape.dims()) bytes *= static_cast<double>(d);
  auto local_bytes = [&](const Layout& l) {
    double b = bytes;
    for (int m = 0; m < mesh_.ndim(); ++m)
      if (l.placements[m].is_sharding()) b /= mesh_.size(m);
    return b;
  };
  bool collective = false;
  double fastest_gbps = 0;
  for (int m = 0; m < mesh_.ndim(); ++m) {
    fastest_gbps = std::max(fastest_gbps, model_.links[m].bandwidth_gbps);
    collective |= mesh_.size(m) > 1 && !src.placements[m].is_replicate() && !(src.placements[m] == dst.placements[m]);
  }
  if (!collective) return 0;
  // An all_gather to n times its input over a link costs (n - 1) inputs'
  // bytes at its bandwidth; over the steps they add up to the bytes gained.
  // (The cost model counts bytes in GiB against GB/s, as PyTorch's does.)
  const double gained = std::max(0.0, local_bytes(dst) - local_bytes(src));
  const double floor = model_.launch_us + gained / (1024.0 * 1024.0 * 1024.0) / fastest_gbps * 1e6;
  return floor * (1 - 1e-9);  // below the plan's own sum, whatever its rounding
}

double Planner::step_cost(const Shape& shape, size_t element_size, const Layout& from, const Layout& to) const {
  SearchSpace sp = make_search_space(mesh_, model_, shape, element_size, from, to);
  sp.frozen = {};  // every edge
  const State a = to_state(from), b = to_state(to);
  double cost = kInf;
  sp.for_each_edge(a, [&](const State& next, int m, StepOp c) {
    if (next == b) cost = std::min(cost, sp.edge_cost(a, c, m));
  });
  return cost;
}

std::vector<Layout> Planner::neighbours(const Layout& from, int tensor_rank, const Layout& dst) const {
  const Shape shape(std::vector<int64_t>(static_cast<size_t>(tensor_rank), 1));
  SearchSpace sp = make_search_space(mesh_, model_, shape, 1, from, dst);
  sp.frozen = {};  // every edge
  std::vector<Layout> out;
  sp.for_each_edge(to_state(from), [&](const State& next, int, StepOp) { out.push_back(to_layout(next, sp.ndim)); });
  return out;
}

size_t Planner::cache_size() const {
  std::lock_guard lock(mu_);
  return cache_.size();
}

bool Planner::CacheKey::operator==(const CacheKey& o) const {
  return element_size == o.element_size && options.kind == o.options.kind && options.merge == o.options.merge &&
         options.prune == o.options.prune && shape == o.shape && src == o.src && dst == o.dst;
}

size_t Planner::CacheKeyHash::operator()(const CacheKey& k) const {
  size_t h = 0xCBF29CE484222325ull ^ k.element_size ^ (static_cast<size_t>(k.options.kind) << 8) ^
             (static_cast<size_t>(k.options.merge) << 9) ^ (static_cast<size_t>(k.options.prune) << 10);
  for (int64_t d : k.shape.dims()) h = (h ^ static_cast<size_t>(d)) * 0x100000001B3ull;
  return hash_layout(k.dst, hash_layout(k.src, h));
}

std::shared_ptr<Planner> shared_planner(const DeviceMesh& mesh) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<Planner>> planners;  // few meshes: searched in order
  std::lock_guard lock(mu);
  for (const auto& p : planners)
    if (p->mesh() == mesh) return p;
  return planners.emplace_back(std::make_shared<Planner>(mesh, CostModel::for_mesh(mesh)));
}

}  // namespace meshtrain::sharding
