#include "sharding/layout.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>

#include "core/error.h"

namespace meshtrain::sharding {

std::string Placement::to_string() const {
  switch (kind) {
    case Kind::replicate:
      return "R";
    case Kind::shard:
      return fmt::format("S({})", dim);
    case Kind::strided_shard:
      return fmt::format("_S({}, {})", dim, split_factor);
    case Kind::partial:
      return fmt::format("P({})", comm::reduce_op_name(reduce));
  }
  return "?";
}

namespace {

// A tiny cursor over the layout text.
struct Cursor {
  std::string_view text;
  size_t pos = 0;
  void skip_space() {
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  }
  // Placements may be separated by spaces or commas: "S(0)R", "S(0), R".
  bool done() {
    while (pos < text.size() && (std::isspace(static_cast<unsigned char>(text[pos])) || text[pos] == ',')) ++pos;
    return pos >= text.size();
  }
  bool accept(std::string_view token) {
    skip_space();
    if (text.substr(pos, token.size()) != token) return false;
    pos += token.size();
    return true;
  }
  [[noreturn]] void fail(std::string_view what) const {
    throw InvalidArgument(
        fmt::format("cannot parse layout '{}' at position {}: {}. Expected placements "
                    "like R, S(0), S(0)[1], _S(0, 3), P(sum) — one per mesh dim",
                    text, pos, what));
  }
  void expect(std::string_view token) {
    if (!accept(token)) fail(fmt::format("expected '{}'", token));
  }
  int integer() {
    skip_space();
    size_t start = pos;
    if (pos < text.size() && text[pos] == '-') ++pos;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
    if (start == pos || (pos == start + 1 && text[start] == '-')) fail("expected an integer");
    int value = 0;
    const auto [end, error] = std::from_chars(text.data() + start, text.data() + pos, value);
    if (error != std::errc()) fail(fmt::format("{} is out of range", text.substr(start, pos - start)));
    return value;
  }
  std::string word() {
    skip_space();
    size_t start = pos;
    while (pos < text.size() && std::isalpha(static_cast<unsigned char>(text[pos]))) ++pos;
    return std::string(text.substr(start, pos - start));
  }
};

}  // namespace

Layout Layout::parse(std::string_view text, int mesh_ndim) {
  Cursor c{text};
  std::vector<Placement> placements;
  std::vector<int> explicit_order;
  while (!c.done()) {
    Placement p;
    if (c.accept("_S(")) {
      const int dim = c.integer();
      c.expect(",");
      const int sf = c.integer();
      c.expect(")");
      if (sf < 2) c.fail(fmt::format("a strided shard needs split factor >= 2, got {} (use S({}))", sf, dim));
      p = Placement::strided_shard(dim, sf);
    } else if (c.accept("S(")) {
      p = Placement::shard(c.integer());
      c.expect(")");
    } else if (c.accept("R")) {
      p = Placement::replicate();
    } else if (c.accept("P")) {
      ReduceOp op = ReduceOp::sum;
      if (c.accept("(")) {
        const std::string name = c.word();
        try {
          op = comm::parse_reduce_op(name);
        } catch (const InvalidArgument&) {
          c.fail(fmt::format("unknown partial reduce op '{}' (sum, avg, max, min)", name));
        }
        c.expect(")");
      }
      p = Placement::partial(op);
    } else {
      c.fail("unknown placement");
    }
    if (p.is_sharding() && p.dim < 0) c.fail(fmt::format("negative tensor dim {}", p.dim));
    int k = -1;
    if (c.accept("[")) {
      if (!p.is_sharding()) c.fail("only shards take a [k] order index");
      k = c.integer();
      c.expect("]");
    }
    placements.push_back(p);
    explicit_order.push_back(k);
  }
  MT_CHECK(static_cast<int>(placements.size()) == mesh_ndim,
           "layout '{}' has {} placements but the mesh has {} dims; give one per mesh dim", text, placements.size(),
           mesh_ndim);
  Layout layout = from_placements(std::move(placements));
  // Explicit [k]: all or none of the shards of a tensor dim, a permutation.
  std::map<int, std::vector<int>> by_dim;
  for (int m = 0; m < mesh_ndim; ++m)
    if (layout.placements[m].is_sharding()) by_dim[layout.placements[m].dim].push_back(m);
  for (const auto& [dim, mesh_dims] : by_dim) {
    const auto given = std::count_if(mesh_dims.begin(), mesh_dims.end(), [&](int m) { return explicit_order[m] >= 0; });
    if (given == 0) continue;
    MT_CHECK(given == static_cast<long>(mesh_dims.size()),
             "layout '{}': tensor dim {} is sharded by {} mesh dims but only {} carry an order index [k]; "
             "give all or none",
             text, dim, mesh_dims.size(), given);
    std::vector<int> seen(mesh_dims.size(), 0);
    for (int m : mesh_dims) {
      const int k = explicit_order[m];
      MT_CHECK(k < static_cast<int>(mesh_dims.size()) && !seen[k]++,
               "layout '{}': the order indices of tensor dim {} must be 0..{}, each once", text, dim,
               mesh_dims.size() - 1);
      layout.order[m] = k;
    }
  }
  return layout;
}

Layout Layout::from_placements(std::vector<Placement> placements) {
  Layout layout;
  layout.order.assign(placements.size(), -1);
  std::map<int, int> count;
  for (size_t m = 0; m < placements.size(); ++m)
    if (placements[m].is_sharding()) layout.order[m] = count[placements[m].dim]++;
  layout.placements = std::move(placements);
  return layout;
}

std::string Layout::to_string() const {
  std::map<int, int> shards_per_dim;
  for (const auto& p : placements)
    if (p.is_sharding()) ++shards_per_dim[p.dim];
  std::string s;
  for (size_t m = 0; m < placements.size(); ++m) {
    s += placements[m].to_string();
    if (placements[m].is_sharding() && shards_per_dim[placements[m].dim] > 1) s += fmt::format("[{}]", order[m]);
  }
  return s;
}

std::vector<int> Layout::shard_sequence(int tensor_dim) const {
  std::vector<int> mesh_dims;
  for (int m = 0; m < mesh_ndim(); ++m)
    if (placements[m].is_sharding() && placements[m].dim == tensor_dim) mesh_dims.push_back(m);
  std::sort(mesh_dims.begin(), mesh_dims.end(), [&](int a, int b) { return order[a] < order[b]; });
  return mesh_dims;
}

bool Layout::has_partial() const {
  return std::any_of(placements.begin(), placements.end(), [](const Placement& p) { return p.is_partial(); });
}

void Layout::validate(int tensor_rank) const {
  const Placement* first_partial = nullptr;
  for (int m = 0; m < mesh_ndim(); ++m) {
    const Placement& p = placements[m];
    if (p.is_sharding())
      MT_CHECK(p.dim < tensor_rank, "layout {}: mesh dim {} shards tensor dim {} but the tensor has {} dims",
               to_string(), m, p.dim, tensor_rank);
    if (p.is_partial()) {
      if (first_partial)
        MT_CHECK(first_partial->reduce == p.reduce,
                 "layout {} mixes partial reduce types {} and {}; a tensor may be partial in one reduce op only",
                 to_string(), first_partial->to_string(), p.to_string());
      first_partial = &p;
    }
  }
}

}  // namespace meshtrain::sharding
