#include "spmd/ring_attention.h"

#include "core/error.h"

namespace meshtrain::spmd {

namespace {

namespace attr = graph::attr;
using graph::ValueId;

struct Ring {
  graph::Builder& b;
  const RingPlace& place;
  graph::Attrs attrs;  // the block nodes' attributes but key_first
  int64_t chunk = 0;   // rows of one load-balanced chunk

  // The tensor of the rank one back in the ring.
  ValueId shift(ValueId v) { return b.ring_shift(v, place.mesh_dim, place.group); }

  // The position chunk of half `half` (0, 1) of the block the rank `step` back holds, and whether any of this
  // rank's queries sees it (its last query is in position chunk 2 size - 1 - index).
  int64_t position_chunk(int64_t step, int half) const {
    const int64_t src = (place.index - step + place.size) % place.size;
    return half == 0 ? src : 2 * place.size - 1 - src;
  }
  bool seen(int64_t position) const { return position <= 2 * place.size - 1 - place.index; }

  graph::Attrs block_attrs(int64_t position) const {
    graph::Attrs at = attrs;
    at.set(attr::key_first, position * chunk);
    return at;
  }
  ValueId half_of(ValueId x, int half) { return b.slice(x, 1, half * chunk, chunk); }

  std::vector<ValueId> forward(ValueId q, ValueId k, ValueId v) {
    std::vector<ValueId> pairs;
    for (int64_t step = 0; step < place.size; ++step) {
      const bool more = step + 1 < place.size;
      const ValueId next_k = more ? shift(k) : ValueId{}, next_v = more ? shift(v) : ValueId{};
      for (int half = 0; half < 2; ++half) {
        const int64_t position = position_chunk(step, half);
        if (!seen(position)) continue;
        for (ValueId out : b.op_outputs("attention", {q, half_of(k, half), half_of(v, half)}, block_attrs(position)))
          pairs.push_back(out);
      }
      k = next_k;
      v = next_v;
    }
    return b.op_outputs("attention_merge", pairs);
  }

  std::vector<ValueId> backward(const std::vector<ValueId>& in) {
    const ValueId q = in[0], out = in[3], lse = in[4], dout = in[5];
    ValueId k = in[1], v = in[2], dq, dk, dv;
    for (int64_t step = 0; step < place.size; ++step) {
      const bool more = step + 1 < place.size;
      const ValueId next_k = more ? shift(k) : ValueId{}, next_v = more ? shift(v) : ValueId{};
      std::vector<ValueId> dk_halves, dv_halves;
      for (int half = 0; half < 2; ++half) {
        const int64_t position = position_chunk(step, half);
        const ValueId kh = half_of(k, half), vh = half_of(v, half);
        if (!seen(position)) {  // no query of this rank sees it: no gradient from here
          const graph::ValueInfo& info = b.graph().value(kh).info;
          dk_halves.push_back(b.full(info.shape, info.dtype, 0.0));
          dv_halves.push_back(b.full(info.shape, info.dtype, 0.0));
          continue;
        }
        const std::vector<ValueId> g =
            b.op_outputs("attention_backward", {q, kh, vh, out, lse, dout}, block_attrs(position));
        dq = dq.valid() ? b.add(dq, g[0]) : g[0];
        dk_halves.push_back(g[1]);
        dv_halves.push_back(g[2]);
      }
      // The block's accumulators travel with it: the rank one on adds its share at the next step.
      const ValueId block_dk = b.concat(dk_halves, 1), block_dv = b.concat(dv_halves, 1);
      dk = dk.valid() ? b.add(shift(dk), block_dk) : block_dk;
      dv = dv.valid() ? b.add(shift(dv), block_dv) : block_dv;
      k = next_k;
      v = next_v;
    }
    return {dq, shift(dk), shift(dv)};  // one shift more: each block's gradients reach the rank that holds it
  }
};

}  // namespace

std::optional<RingPlace> ring_place(const graph::Node& node, const NodeSharding& ns, const sharding::DeviceMesh& mesh,
                                    const std::vector<int>& coord) {
  if ((node.op->name != "attention" && node.op->name != "attention_backward") || !node.attrs.get_or(attr::ring, false))
    return std::nullopt;
  const std::vector<sharding::Placement>& keys = ns.inputs.at(1).placements;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const sharding::Placement& p = keys[static_cast<size_t>(d)];
    if (!p.is_sharding() || p.dim != 1 || mesh.size(d) == 1) continue;
    return RingPlace{d, mesh.size(d), coord[static_cast<size_t>(d)], mesh.group_ranks(mesh.rank_at(coord), {d})};
  }
  return std::nullopt;
}

std::vector<ValueId> expand_ring_attention(graph::Builder& b, const graph::Node& node, const RingPlace& ring,
                                           const std::vector<ValueId>& inputs, const graph::Attrs& local_attrs) {
  const int64_t chunks = local_attrs.get(attr::seq_chunks), rows = b.graph().value(inputs[0]).info.shape[1];
  MT_CHECK(chunks == 2 * ring.size && rows % 2 == 0,
           "ring attention over {} ranks needs the sequence in {} load-balanced chunks, two a rank; node {} has {} "
           "chunks and {} rows here",
           ring.size, 2 * ring.size, node.op->name, chunks, rows);
  const graph::Attrs attrs{attr::scale(local_attrs.get(attr::scale)), attr::seq_chunks(chunks),
                           attr::seq_first(local_attrs.get(attr::seq_first)),
                           attr::seq_total(local_attrs.get(attr::seq_total))};
  Ring r{b, ring, attrs, rows / 2};
  if (node.op->name == "attention") return r.forward(inputs[0], inputs[1], inputs[2]);
  return r.backward(inputs);
}

}  // namespace meshtrain::spmd
