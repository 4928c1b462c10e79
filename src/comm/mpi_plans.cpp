// How the `mpi` backend cuts each operation into stages (mpi_op.h).
//
// Most collectives are pairwise stages, point-to-point messages between
// every pair of ranks, rather than Open MPI's non-blocking collectives: at
// small sizes those take more rounds of messages than the blocking calls
// (libnbc, bench comm), and only a pairwise first stage can carry the
// fingerprint check, so that verifying costs no round of its own.
#include <algorithm>
#include <climits>

#include "comm/mpi_op.h"
#include "comm/reduce.h"
#include "core/error.h"

namespace meshtrain::comm::mpi {

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

int to_int_count(int64_t n, const char* what) {
  if (n > INT_MAX)
    throw CommError(
        fmt::format("{} of {} bytes exceeds MPI's 2 GiB count limit; split the "
                    "tensor into smaller pieces",
                    what, n));
  return static_cast<int>(n);
}

void MpiOp::free_datatypes() {
  if (datatypes.empty()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized)
    for (MPI_Datatype& t : datatypes) MPI_Type_free(&t);
  datatypes.clear();
}

void MpiOp::recycle() {
  desc.reset();
  work.reset();
  group.reset();
  stages.clear();
  next_stage = 0;
  in_flight = false;
  requests.clear();
  pending = 0;
  first = nullptr;
  free_datatypes();
  in_post_queue = false;
  done = false;
}

bool MpiOp::ordered_stage_ahead() const {
  return std::any_of(stages.begin() + static_cast<std::ptrdiff_t>(next_stage), stages.end(),
                     [](const Stage& s) { return !s.pairwise(); });
}

bool MpiOp::requests_outstanding() const {
  return std::any_of(requests.begin(), requests.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
}

namespace {

std::vector<int> byte_counts(const std::vector<int64_t>& counts, size_t elem, const char* what) {
  std::vector<int> out;
  out.reserve(counts.size());
  for (int64_t c : counts) out.push_back(to_int_count(c * static_cast<int64_t>(elem), what));
  return out;
}

std::vector<int> byte_displacements(const std::vector<int64_t>& counts, size_t elem, const char* what) {
  return byte_counts(displacements(counts), elem, what);
}

MPI_Datatype native_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::f64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op native_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void scale_in_place(void* data, DType dtype, int64_t n, int divisor) {
  if (dtype == DType::f64) {
    auto* p = static_cast<double*>(data);
    for (int64_t i = 0; i < n; ++i) p[i] /= divisor;
    return;
  }
  // Only native reductions scale here (needs_host_reduction's dtypes average
  // in reduce_rows), and avg of an integer dtype is refused when issued.
  MT_ASSERT(dtype == DType::f32, "avg scaling on dtype {}", dtype_name(dtype));
  auto* p = static_cast<float*>(data);
  for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(divisor);
}

using Runs = std::vector<std::pair<MPI_Aint, int>>;  // (byte offset from a buffer, bytes)

// Byte runs as one datatype (committed; the op frees it).
MPI_Datatype runs_type(MpiOp& op, const Runs& runs) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> offsets;
  for (const auto& [at, bytes] : runs) {
    offsets.push_back(at);
    lengths.push_back(bytes);
  }
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), offsets.data(), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  op.datatypes.push_back(t);
  return t;
}

// Runs of `base` as one piece: none, one run of bytes, or a datatype.
Piece runs_piece(MpiOp& op, const void* base, const Runs& runs) {
  auto* at = static_cast<std::byte*>(const_cast<void*>(base));
  if (runs.empty()) return {};
  if (runs.size() == 1) return {at + runs[0].first, runs[0].second, MPI_BYTE};
  return {at, 1, runs_type(op, runs)};
}

// `count` elements of `elem` bytes at element `offset` of `base`.
Piece bytes_at(const void* base, int64_t offset, int64_t count, size_t elem, const char* what) {
  auto* at = static_cast<std::byte*>(const_cast<void*>(base));
  return {at + offset * static_cast<int64_t>(elem), to_int_count(count * static_cast<int64_t>(elem), what), MPI_BYTE};
}

// A reduction's blocks move and are summed in segments: each rank receives
// about this many bytes per segment from all its peers together, so that the
// rows stay in cache between arriving and being summed (bench comm, 4 ranks
// of a 2-core host, a 16 MiB reduce_scatter: 23.4 ms in one piece, 11.5 ms in
// 1 MiB segments, 13.2 ms in 256 KiB ones); but at least kMinSegmentPiece
// bytes from each peer, lest a large group's segments be all latency.
constexpr int64_t kReduceSegmentBytes = 1 << 20, kMinSegmentPiece = 128 << 10;

// The elements [lo, hi) of rank r's block on the full side `base` of the op
// (all_gather's output, reduce_scatter's input; counts[r] elements each): a
// plain op's as one run of bytes, a coalesced op's runs in each member the
// range crosses as one datatype.
Piece block_piece(MpiOp& op, const void* base, const std::vector<int64_t>& counts, int r, int64_t lo, int64_t hi) {
  const OpDesc& d = *op.desc;
  const auto elem = static_cast<int64_t>(dtype_size(d.dtype));
  auto bytes = [&](int64_t len) {
    if (len * elem > INT_MAX)
      to_int_count(len * elem, fmt::format("{}'s block of rank {}", op_type_name(d.op), r).c_str());
    return static_cast<int>(len * elem);
  };
  if (d.members.empty()) {
    int64_t at = lo;
    for (int k = 0; k < r; ++k) at += counts[k];
    return hi > lo ? Piece{static_cast<std::byte*>(const_cast<void*>(base)) + at * elem, bytes(hi - lo), MPI_BYTE}
                   : Piece{};
  }
  const std::vector<int64_t> starts = d.member_blocks_of_rank(op.group->size, r);
  Runs runs;
  int64_t in_block = 0;  // where member m's block starts within rank r's block
  for (size_t m = 0; m < d.members.size(); ++m) {
    const int64_t from = std::max(lo, in_block), to = std::min(hi, in_block + d.members[m]);
    if (to > from) runs.emplace_back(static_cast<MPI_Aint>((starts[m] + from - in_block) * elem), bytes(to - from));
    in_block += d.members[m];
  }
  return runs_piece(op, base, runs);
}

// Every rank's block (counts[r] elements, a coalesced op's in its members'
// places) into its place in the output; this rank's from `mine`.
void gather_pieces(MpiOp& op, Pieces& p, const std::vector<int64_t>& counts, const void* mine) {
  const int n = op.group->size;
  const Piece own = bytes_at(mine, 0, counts[op.group->rank], dtype_size(op.desc->dtype), "all_gather block");
  for (int r = 0; r < n; ++r) {
    p.send[r] = own;
    p.recv[r] = block_piece(op, op.desc->out, counts, r, 0, counts[r]);
  }
}

void all_to_all_pieces(MpiOp& op, Pieces& p) {
  const OpDesc& d = *op.desc;
  const size_t elem = dtype_size(d.dtype);
  for (int64_t r = 0, sent_at = 0, received_at = 0; r < op.group->size; ++r) {
    p.send[r] = bytes_at(d.in, sent_at, d.send_counts[r], elem, "all_to_all block");
    p.recv[r] = bytes_at(d.out, received_at, d.recv_counts[r], elem, "all_to_all block");
    sent_at += d.send_counts[r];
    received_at += d.recv_counts[r];
  }
}

// One segment of a host reduction: elements [lo, hi) of every rank's block
// go to that rank, and this rank's (my_len of them) come from every rank
// into a row of scratch each, to be reduced in rank order.
Stage reduce_segment(const std::vector<int64_t>& counts, int64_t lo, int64_t hi, int64_t my_lo, int64_t my_len,
                     int64_t out_base) {
  Stage stage;
  stage.pieces = [counts, lo, hi, my_len](MpiOp& op, Pieces& p) {
    const int n = op.group->size;
    const size_t elem = dtype_size(op.desc->dtype);
    op.scratch.reserve(static_cast<size_t>(my_len * n) * elem);
    op.free_datatypes();  // the previous segment's requests have completed
    for (int r = 0; r < n; ++r) {
      p.send[r] = block_piece(op, op.desc->in, counts, r, std::min(counts[r], lo), std::min(counts[r], hi));
      p.recv[r] = bytes_at(op.scratch.data(), r * my_len, my_len, elem, "reduction block");
    }
  };
  stage.after = [my_lo, my_len, out_base](MpiOp& op) {
    const int n = op.group->size;
    const size_t elem = dtype_size(op.desc->dtype);
    std::vector<const void*> rows(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) rows[k] = op.scratch.data() + static_cast<size_t>(k * my_len) * elem;
    void* out = static_cast<std::byte*>(op.desc->out) + (out_base + my_lo) * static_cast<int64_t>(elem);
    reduce_rows(op.desc->dtype, op.desc->reduce, rows.data(), n, out, static_cast<size_t>(my_len));
  };
  return stage;
}

// Reduce on the host in rank order (bf16/f16/fp8 in f32 with one rounding),
// so the result equals a serial reduction and is the same on every rank,
// segment by segment (kReduceSegmentBytes); all_reduce then gathers the
// reduced blocks. Same bytes on the wire as a ring all_reduce, in two
// rounds of messages (plus one per further segment). A segment's pieces of
// each rank's block go as one message, straight from the input (a coalesced
// op's from each member's place).
void host_reduce_stages(const OpDesc& d, int n, int rank, bool gather_back, std::vector<Stage>& stages) {
  const size_t elem = dtype_size(d.dtype);
  const std::vector<int64_t> counts = d.op == OpType::all_reduce ? torch_chunk_sizes(d.in_numel, n) : d.counts;
  const int64_t mine = counts[rank];
  // Every rank cuts every block alike, so all post the same segments.
  const int64_t segment =
      std::max<int64_t>(1, std::max(kReduceSegmentBytes / n, kMinSegmentPiece) / static_cast<int64_t>(elem));
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  const int64_t segments = std::max<int64_t>(1, (largest + segment - 1) / segment);
  const int64_t out_base = d.op == OpType::all_reduce ? displacements(counts)[rank] : 0;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t lo = s * segment, hi = lo + segment;
    const int64_t my_lo = std::min(mine, lo), my_len = std::min(mine, hi) - my_lo;
    stages.push_back(reduce_segment(counts, lo, hi, my_lo, my_len, out_base));
  }
  if (gather_back) {
    Stage gather;
    gather.pieces = [counts, out_base, elem](MpiOp& op, Pieces& p) {
      gather_pieces(op, p, counts, static_cast<std::byte*>(op.desc->out) + out_base * static_cast<int64_t>(elem));
    };
    stages.push_back(std::move(gather));
  }
}

// A small all_reduce in one round of messages instead of two: every rank
// sends its whole buffer to every other and reduces all the rows itself, in
// rank order, so every rank computes the same result. Worth it while the
// rounds, not the bytes, take the time: up to this many bytes received per
// rank (a 16 KiB buffer in 4 ranks).
constexpr int64_t kOneRoundAllReduceBytes = 64 << 10;

// Up to this many bytes a native-dtype all_reduce of a small group reduces on
// the host in two pairwise rounds; from here on Open MPI's Iallreduce
// (Rabenseifner's, see choose_nonblocking_schedules) does better (bench comm,
// 4 ranks on 2 cores, ratio to MPI_Allreduce: 64 KiB 0.82 pairwise, 0.76
// Iallreduce; 256 KiB 0.90 and 0.98; 1 MiB 0.81 and 1.05).
constexpr int64_t kPairwiseAllReduceBytes = 128 << 10;

Stage one_round_all_reduce() {
  Stage stage;
  stage.pieces = [](MpiOp& op, Pieces& p) {
    const int n = op.group->size;
    const size_t elem = dtype_size(op.desc->dtype);
    const int64_t numel = op.desc->in_numel;
    op.scratch.reserve(static_cast<size_t>(numel * n) * elem);
    for (int r = 0; r < n; ++r) {
      p.send[r] = bytes_at(op.desc->in, 0, numel, elem, "all_reduce");
      p.recv[r] = bytes_at(op.scratch.data(), r * numel, numel, elem, "all_reduce");
    }
  };
  stage.after = [](MpiOp& op) {
    const int n = op.group->size;
    const size_t row_bytes = static_cast<size_t>(op.desc->in_numel) * dtype_size(op.desc->dtype);
    std::vector<const void*> rows(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) rows[k] = op.scratch.data() + k * row_bytes;
    reduce_rows(op.desc->dtype, op.desc->reduce, rows.data(), n, op.desc->out, static_cast<size_t>(op.desc->in_numel));
  };
  return stage;
}

Stage pairwise(std::function<void(MpiOp&, Pieces&)> pieces) {
  Stage stage;
  stage.pieces = std::move(pieces);
  return stage;
}

Stage ordered(std::function<int(MpiOp&, std::vector<MPI_Request>&)> post, std::function<void(MpiOp&)> after = {}) {
  Stage stage;
  stage.post = std::move(post);
  stage.after = std::move(after);
  return stage;
}

// MPI_Iallreduce, for groups too large for a pairwise one.
Stage native_all_reduce(int n) {
  return ordered(
      [](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        return MPI_Iallreduce(MPI_IN_PLACE, op.desc->out, to_int_count(op.desc->out_numel, "all_reduce"),
                              native_type(op.desc->dtype), native_op(op.desc->reduce), op.group->comm, &reqs[0]);
      },
      [n](MpiOp& op) {
        if (op.desc->reduce == ReduceOp::avg) scale_in_place(op.desc->out, op.desc->dtype, op.desc->out_numel, n);
      });
}

// MPI_Iallgather(v), for groups too large for a pairwise one.
Stage native_all_gather(size_t elem) {
  return ordered([elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
    reqs.resize(1);
    const auto& c = op.desc->counts;
    if (std::all_of(c.begin(), c.end(), [&](int64_t x) { return x == c[0]; })) {
      const int bytes = to_int_count(c[0] * static_cast<int64_t>(elem), "all_gather block");
      return MPI_Iallgather(op.desc->in, bytes, MPI_BYTE, op.desc->out, bytes, MPI_BYTE, op.group->comm, &reqs[0]);
    }
    const auto bc = byte_counts(c, elem, "all_gather block");
    const auto bd = byte_displacements(c, elem, "all_gather offset");
    return MPI_Iallgatherv(op.desc->in, bc[op.group->rank], MPI_BYTE, op.desc->out, bc.data(), bd.data(), MPI_BYTE,
                           op.group->comm, &reqs[0]);
  });
}

Stage p2p_stage(OpType op_type, size_t elem) {
  if (op_type == OpType::send)
    return ordered([elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
      reqs.resize(1);
      return MPI_Isend(op.desc->in, to_int_count(op.desc->in_numel * static_cast<int64_t>(elem), "send"), MPI_BYTE,
                       op.desc->peer, op.desc->tag, op.group->comm, &reqs[0]);
    });
  return ordered(
      [elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        return MPI_Irecv(op.desc->out, to_int_count(op.desc->out_numel * static_cast<int64_t>(elem), "recv"), MPI_BYTE,
                         op.desc->peer, op.desc->tag, op.group->comm, &reqs[0]);
      },
      [elem](MpiOp& op) {
        int got = 0;
        MPI_Get_count(&op.status, MPI_BYTE, &got);
        const int64_t expected = op.desc->out_numel * static_cast<int64_t>(elem);
        if (got != expected)
          throw CommError(fmt::format(
              "{}: received {} bytes from rank {} but expected {} ({} x {}); the sender's tensor has a different "
              "size or dtype",
              op.work->info().describe(), got, op.desc->peer, expected, op.desc->out_numel,
              dtype_name(op.desc->dtype)));
      });
}

}  // namespace

void plan_stages(const OpDesc& d, int n, int rank, std::vector<Stage>& stages) {
  const size_t elem = dtype_size(d.dtype);
  const int64_t bytes = d.in_numel * static_cast<int64_t>(elem);
  const bool small_group = n <= kMaxPairwiseRanks;
  switch (d.op) {
    case OpType::barrier:  // every rank hears from every other
      return stages.push_back(pairwise([](MpiOp&, Pieces&) {}));
    case OpType::all_reduce:
      if (small_group && bytes * (n - 1) <= kOneRoundAllReduceBytes) return stages.push_back(one_round_all_reduce());
      if ((small_group && bytes < kPairwiseAllReduceBytes) || needs_host_reduction(d.dtype))
        return host_reduce_stages(d, n, rank, true, stages);
      return stages.push_back(native_all_reduce(n));
    case OpType::reduce_scatter:
      return host_reduce_stages(d, n, rank, false, stages);
    case OpType::all_gather:
      if (!small_group && d.members.empty()) return stages.push_back(native_all_gather(elem));
      return stages.push_back(
          pairwise([](MpiOp& op, Pieces& p) { gather_pieces(op, p, op.desc->counts, op.desc->in); }));
    case OpType::all_to_all:
      return stages.push_back(pairwise(all_to_all_pieces));
    case OpType::broadcast:
      return stages.push_back(ordered([elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        return MPI_Ibcast(op.desc->out, to_int_count(op.desc->in_numel * static_cast<int64_t>(elem), "broadcast"),
                          MPI_BYTE, op.desc->root, op.group->comm, &reqs[0]);
      }));
    case OpType::send:
    case OpType::recv:
      return stages.push_back(p2p_stage(d.op, elem));
  }
}

}  // namespace meshtrain::comm::mpi
