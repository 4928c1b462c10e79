#include "comm/process_group.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "comm/local_backend.h"
#include "comm/mpi_backend.h"
#include "core/error.h"

namespace meshtrain::comm {

namespace {

int64_t hash_counts(const std::vector<int64_t>& v) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
  for (int64_t x : v) {
    h ^= static_cast<uint64_t>(x);
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

bool uses_reduce_op(OpType op) { return op == OpType::all_reduce || op == OpType::reduce_scatter; }

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

void check_tensor(const Tensor& t, std::string_view what, std::string_view op) {
  MT_CHECK(t.defined(), "{}: {} tensor is undefined", op, what);
}

void check_same_dtype(const Tensor& in, const Tensor& out, std::string_view op) {
  MT_CHECK(in.dtype() == out.dtype(), "{}: output dtype {} differs from input dtype {}; both must have the same dtype",
           op, dtype_name(out.dtype()), dtype_name(in.dtype()));
}

void check_counts(const std::vector<int64_t>& counts, int size, std::string_view what, std::string_view op) {
  MT_CHECK(static_cast<int>(counts.size()) == size, "{}: {} has {} entries but the group has {} ranks", op, what,
           counts.size(), size);
  for (size_t r = 0; r < counts.size(); ++r)
    MT_CHECK(counts[r] >= 0, "{}: {}[{}] = {} is negative", op, what, r, counts[r]);
}

void check_reduce_dtype(ReduceOp op, DType dtype, std::string_view name) {
  MT_CHECK(!(op == ReduceOp::avg && !is_floating(dtype)),
           "{}: reduce op avg is not defined for integer dtype {} (the mean would be truncated); "
           "use sum and divide in a floating dtype",
           name, dtype_name(dtype));
}

// The fields every tensor operation fills alike; the caller adds its own.
OpDesc describe_op(OpType op, const Tensor& input, const Tensor& output) {
  OpDesc d;
  d.op = op;
  d.dtype = input.dtype();
  d.in = input.raw();
  d.out = const_cast<void*>(output.raw());
  d.in_numel = input.numel();
  d.out_numel = output.numel();
  return d;
}

}  // namespace

std::vector<int64_t> OpDesc::fingerprint(int group_size) const {
  std::vector<int64_t> f;
  fingerprint(group_size, f);
  return f;
}

void OpDesc::fingerprint(int group_size, std::vector<int64_t>& f) const {
  f.assign(kFingerprintHead + 2 * static_cast<size_t>(group_size), 0);
  f[0] = static_cast<int64_t>(seq);
  f[1] = static_cast<int64_t>(op);
  f[2] = op == OpType::barrier ? -1 : static_cast<int64_t>(dtype);
  f[3] = uses_reduce_op(op) ? static_cast<int64_t>(reduce) : -1;
  f[4] = op == OpType::broadcast ? root : -1;
  switch (op) {
    case OpType::all_reduce:
    case OpType::broadcast:
    case OpType::reduce_scatter:
      f[5] = in_numel;
      break;
    case OpType::all_gather:
      f[5] = out_numel;
      break;
    default:
      f[5] = 0;
  }
  std::vector<int64_t> sizes = counts;
  if (!members.empty()) {  // a coalesced op: its members' blocks, after a separator
    sizes.push_back(-1);
    sizes.insert(sizes.end(), members.begin(), members.end());
  }
  f[6] = sizes.empty() ? 0 : hash_counts(sizes);
  if (op == OpType::all_to_all) {
    std::copy(send_counts.begin(), send_counts.end(), f.begin() + kFingerprintHead);
    std::copy(recv_counts.begin(), recv_counts.end(), f.begin() + kFingerprintHead + group_size);
  }
}

std::string OpDesc::signature() const {
  std::string s = fmt::format("{}", op_type_name(op));
  if (op != OpType::barrier) s += fmt::format(" {}", dtype_name(dtype));
  if (uses_reduce_op(op)) s += fmt::format(" {}", reduce_op_name(reduce));
  if (op == OpType::broadcast) s += fmt::format(" root={}", root);
  if (!counts.empty())
    s += fmt::format(" counts=[{}]", fmt::join(counts, ","));
  else if (op == OpType::all_reduce || op == OpType::broadcast)
    s += fmt::format(" numel={}", in_numel);
  if (!members.empty()) s += fmt::format(" members=[{}]", fmt::join(members, ","));
  if (op == OpType::all_to_all)
    s += fmt::format(" send=[{}] recv=[{}]", fmt::join(send_counts, ","), fmt::join(recv_counts, ","));
  return s;
}

std::vector<int64_t> OpDesc::member_blocks_of_rank(int group_size, int r) const {
  std::vector<int64_t> at(members.size());
  int64_t member_start = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    at[m] = member_start + r * members[m];
    member_start += group_size * members[m];
  }
  return at;
}

std::string check_fingerprints(const std::vector<std::vector<int64_t>>& rows, const WorkInfo& info) {
  const int n = static_cast<int>(rows.size());
  static constexpr std::string_view kFields[] = {"sequence number (a rank skipped or added a collective)",
                                                 "operation",
                                                 "dtype",
                                                 "reduce op",
                                                 "broadcast root",
                                                 "element count",
                                                 "per-rank counts or coalesced members"};
  auto value_text = [](size_t field, int64_t v) -> std::string {
    if (field == 1) return std::string(op_type_name(static_cast<OpType>(v)));
    if (field == 2) return v < 0 ? "-" : std::string(dtype_name(static_cast<DType>(v)));
    if (field == 3) return v < 0 ? "-" : std::string(reduce_op_name(static_cast<ReduceOp>(v)));
    if (field == 6) return fmt::format("#{:x}", static_cast<uint64_t>(v) & 0xffffff);
    return std::to_string(v);
  };
  for (size_t field = 0; field < OpDesc::kFingerprintHead; ++field) {
    bool same = true;
    for (int r = 1; r < n; ++r) same = same && rows[r][field] == rows[0][field];
    if (same) continue;
    std::vector<std::string> per_rank;
    for (int r = 0; r < n && r < 16; ++r)
      per_rank.push_back(fmt::format("rank {}: {}", r, value_text(field, rows[r][field])));
    if (n > 16) per_rank.push_back("...");
    return fmt::format(
        "ranks disagree on the {} of {}: {}. Every rank of the group must issue the same "
        "collective, in the same order, with the same dtype and sizes",
        kFields[field], info.describe(), fmt::join(per_rank, ", "));
  }
  if (static_cast<OpType>(rows[0][1]) == OpType::all_to_all) {
    const size_t head = OpDesc::kFingerprintHead;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const int64_t sends = rows[i][head + j];
        const int64_t expects = rows[j][head + n + i];
        if (sends != expects)
          return fmt::format(
              "ranks disagree on the sizes of {}: rank {} sends {} elements to "
              "rank {}, which expects {} from it",
              info.describe(), i, sends, j, expects);
      }
  }
  return {};
}

ProcessGroup::ProcessGroup(std::string name, int rank, std::vector<int> world_ranks,
                           std::shared_ptr<FlightRecorder> recorder, GroupOptions options)
    : name_(std::move(name)),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      recorder_(std::move(recorder)),
      options_(options) {
  MT_CHECK(rank_ >= 0 && rank_ < size(), "rank {} is outside group '{}' of {} ranks", rank_, name_, size());
  recorder_->add_group(name_, world_ranks_);
}

void ProcessGroup::set_timeout(std::chrono::milliseconds t) {
  MT_CHECK(t.count() > 0, "timeout must be positive, got {} ms", t.count());
  options_.timeout = t;
}

std::string ProcessGroup::dump_flight_recorder(const std::string& reason, const std::string& dir) {
  return recorder_->dump(dir.empty() ? FlightRecorder::default_dump_dir() : dir, reason);
}

WorkPtr ProcessGroup::issue(OpDesc desc) {
  if (aborted_.load())
    throw CommError(
        fmt::format("{} on group '{}' refused: the group was aborted ({}); its ranks "
                    "are no longer in step, restart the job",
                    op_type_name(desc.op), name_, abort_reason_));
  const bool p2p = is_p2p(desc.op);
  desc.seq = p2p ? next_p2p_seq_++ : next_seq_++;
  WorkInfo info{name_, size(), rank_, desc.seq, p2p, desc.op, options_.timeout};
  FrEntry entry;
  entry.group = name_;
  entry.seq = desc.seq;
  entry.p2p = p2p;
  entry.op = desc.op;
  entry.dtype = desc.dtype;
  entry.in_numel = desc.in_numel;
  entry.out_numel = desc.out_numel;
  entry.peer = p2p ? desc.peer : -1;
  auto shared = std::make_shared<const OpDesc>(std::move(desc));
  entry.desc = shared;
  const auto now = Clock::now();
  const uint64_t id = recorder_->record(std::move(entry), now);
  auto work = std::make_shared<Work>(std::move(info), recorder_, id, now);
  if (!timeout_handler_)
    timeout_handler_ = std::make_shared<const Work::TimeoutHandler>([weak = weak_from_this()](Work& w) {
      if (auto self = weak.lock())
        self->handle_timeout(w);
      else
        w.fail(std::make_exception_ptr(TimeoutError(w.info().describe() + " timed out")));
    });
  work->set_timeout_handler(timeout_handler_);
  try {
    start(std::move(shared), work);
  } catch (...) {
    work->fail(std::current_exception());
    throw;
  }
  return work;
}

void ProcessGroup::handle_timeout(Work& work) {
  const WorkInfo& info = work.info();
  abort_reason_ = fmt::format("{} timed out", info.describe());
  aborted_.store(true);
  const std::string dir = FlightRecorder::default_dump_dir();
  std::string where;
  try {
    where = recorder_->dump(dir, abort_reason_);
  } catch (const std::exception& e) {
    where = fmt::format("nowhere ({})", e.what());
  }
  const std::string message = fmt::format(
      "{} timed out after {} ms on rank {} (world rank {}): not every rank of the group joined it "
      "in time. Flight recorder dumped to {}; run `meshtrain fr-analyze {}` over all ranks' dumps "
      "to name the rank that is missing or disagrees",
      info.describe(), info.timeout.count(), rank_, world_ranks_[rank_], where, dir);
  std::fprintf(stderr, "[meshtrain rank %d] error: %s\n", world_ranks_[rank_], message.c_str());
  work.fail(std::make_exception_ptr(TimeoutError(message)));
  on_abort();
}

WorkPtr ProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "input", "all_reduce");
  check_reduce_dtype(op, tensor.dtype(), "all_reduce");
  OpDesc d = describe_op(OpType::all_reduce, tensor, tensor);
  d.reduce = op;
  return issue(std::move(d));
}

std::vector<std::string> all_gather_text(ProcessGroup& group, const std::string& mine) {
  // The lengths, then the text in 4-byte words (a count per rank).
  Tensor length = Tensor::empty({1}, DType::i64), lengths = Tensor::empty({group.size()}, DType::i64);
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  group.all_gather(length, lengths)->wait();
  std::vector<int64_t> words;
  int64_t total = 0;
  for (const int64_t n : lengths.data<int64_t>()) {
    words.push_back((n + 3) / 4);
    total += words.back();
  }
  Tensor text = Tensor::zeros({words[static_cast<size_t>(group.rank())]}, DType::i32);
  std::memcpy(text.raw(), mine.data(), mine.size());
  Tensor all = Tensor::empty({total}, DType::i32);
  group.all_gather(text, all, words)->wait();
  std::vector<std::string> out;
  const char* at = static_cast<const char*>(all.raw());
  for (int r = 0; r < group.size(); ++r) {
    out.emplace_back(at, static_cast<size_t>(lengths.data<int64_t>()[static_cast<size_t>(r)]));
    at += words[static_cast<size_t>(r)] * 4;
  }
  return out;
}

WorkPtr ProcessGroup::all_gather(const Tensor& input, Tensor& output, std::vector<int64_t> counts) {
  check_tensor(input, "input", "all_gather");
  check_tensor(output, "output", "all_gather");
  check_same_dtype(input, output, "all_gather");
  if (counts.empty()) counts.assign(static_cast<size_t>(size()), input.numel());
  check_counts(counts, size(), "counts", "all_gather");
  MT_CHECK(counts[rank_] == input.numel(), "all_gather: counts[{}] = {} but this rank's input has {} elements", rank_,
           counts[rank_], input.numel());
  MT_CHECK(output.numel() == sum(counts), "all_gather: output has {} elements but the counts add up to {} ({} ranks)",
           output.numel(), sum(counts), size());
  OpDesc d = describe_op(OpType::all_gather, input, output);
  d.counts = std::move(counts);
  return issue(std::move(d));
}

WorkPtr ProcessGroup::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op, std::vector<int64_t> counts) {
  check_tensor(input, "input", "reduce_scatter");
  check_tensor(output, "output", "reduce_scatter");
  check_same_dtype(input, output, "reduce_scatter");
  check_reduce_dtype(op, input.dtype(), "reduce_scatter");
  if (counts.empty()) {
    MT_CHECK(input.numel() == output.numel() * size(),
             "reduce_scatter: input has {} elements, expected group size {} x output {} = {}; pass "
             "counts for uneven blocks",
             input.numel(), size(), output.numel(), output.numel() * size());
    counts.assign(static_cast<size_t>(size()), output.numel());
  }
  check_counts(counts, size(), "counts", "reduce_scatter");
  MT_CHECK(counts[rank_] == output.numel(), "reduce_scatter: counts[{}] = {} but this rank's output has {} elements",
           rank_, counts[rank_], output.numel());
  MT_CHECK(input.numel() == sum(counts), "reduce_scatter: input has {} elements but the counts add up to {}",
           input.numel(), sum(counts));
  OpDesc d = describe_op(OpType::reduce_scatter, input, output);
  d.reduce = op;
  d.counts = std::move(counts);
  return issue(std::move(d));
}

namespace {

// A coalesced op's members: each block at least 0 elements, adding up to the
// side that holds this rank's blocks (`partial`; the full side n times it).
void check_members(const std::vector<int64_t>& members, const Tensor& partial, const Tensor& full, int n,
                   std::string_view op) {
  MT_CHECK(!members.empty(), "{}: a coalesced collective needs at least one member", op);
  for (size_t m = 0; m < members.size(); ++m)
    MT_CHECK(members[m] >= 0, "{}: member {} has a block of {} elements; a block has 0 or more", op, m, members[m]);
  MT_CHECK(partial.numel() == sum(members) && full.numel() == n * sum(members),
           "{}: members of {} elements per rank in all ({} ranks) need {} elements on this rank's side and {} on "
           "the full side (every rank's blocks), got {} and {}",
           op, sum(members), n, sum(members), n * sum(members), partial.numel(), full.numel());
}

}  // namespace

WorkPtr ProcessGroup::all_gather_coalesced(const Tensor& input, Tensor& output, std::vector<int64_t> members) {
  check_tensor(input, "input", "all_gather_coalesced");
  check_tensor(output, "output", "all_gather_coalesced");
  check_same_dtype(input, output, "all_gather_coalesced");
  check_members(members, input, output, size(), "all_gather_coalesced");
  OpDesc d = describe_op(OpType::all_gather, input, output);
  d.counts.assign(static_cast<size_t>(size()), input.numel());
  d.members = std::move(members);
  return issue(std::move(d));
}

WorkPtr ProcessGroup::reduce_scatter_coalesced(const Tensor& input, Tensor& output, std::vector<int64_t> members,
                                               ReduceOp op) {
  check_tensor(input, "input", "reduce_scatter_coalesced");
  check_tensor(output, "output", "reduce_scatter_coalesced");
  check_same_dtype(input, output, "reduce_scatter_coalesced");
  check_reduce_dtype(op, input.dtype(), "reduce_scatter_coalesced");
  check_members(members, output, input, size(), "reduce_scatter_coalesced");
  OpDesc d = describe_op(OpType::reduce_scatter, input, output);
  d.reduce = op;
  d.counts.assign(static_cast<size_t>(size()), output.numel());
  d.members = std::move(members);
  return issue(std::move(d));
}

WorkPtr ProcessGroup::all_to_all(const Tensor& input, Tensor& output, std::vector<int64_t> send_counts,
                                 std::vector<int64_t> recv_counts) {
  check_tensor(input, "input", "all_to_all");
  check_tensor(output, "output", "all_to_all");
  check_same_dtype(input, output, "all_to_all");
  const int n = size();
  if (send_counts.empty()) {
    MT_CHECK(input.numel() % n == 0,
             "all_to_all: input has {} elements, not divisible by the group size {}; pass "
             "send_counts for uneven blocks",
             input.numel(), n);
    send_counts.assign(static_cast<size_t>(n), input.numel() / n);
  }
  if (recv_counts.empty()) {
    MT_CHECK(output.numel() % n == 0,
             "all_to_all: output has {} elements, not divisible by the group size {}; pass "
             "recv_counts for uneven blocks",
             output.numel(), n);
    recv_counts.assign(static_cast<size_t>(n), output.numel() / n);
  }
  check_counts(send_counts, n, "send_counts", "all_to_all");
  check_counts(recv_counts, n, "recv_counts", "all_to_all");
  MT_CHECK(input.numel() == sum(send_counts), "all_to_all: input has {} elements but send_counts add up to {}",
           input.numel(), sum(send_counts));
  MT_CHECK(output.numel() == sum(recv_counts), "all_to_all: output has {} elements but recv_counts add up to {}",
           output.numel(), sum(recv_counts));
  OpDesc d = describe_op(OpType::all_to_all, input, output);
  d.send_counts = std::move(send_counts);
  d.recv_counts = std::move(recv_counts);
  return issue(std::move(d));
}

WorkPtr ProcessGroup::broadcast(Tensor& tensor, int root) {
  check_tensor(tensor, "input", "broadcast");
  MT_CHECK(root >= 0 && root < size(), "broadcast: root {} is outside group '{}' (ranks 0..{})", root, name_,
           size() - 1);
  OpDesc d = describe_op(OpType::broadcast, tensor, tensor);
  d.root = root;
  return issue(std::move(d));
}

WorkPtr ProcessGroup::barrier() {
  OpDesc d;
  d.op = OpType::barrier;
  return issue(std::move(d));
}

WorkPtr ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  return point_to_point(OpType::send, const_cast<Tensor&>(tensor), dst, tag);
}

WorkPtr ProcessGroup::recv(Tensor& tensor, int src, int tag) { return point_to_point(OpType::recv, tensor, src, tag); }

WorkPtr ProcessGroup::point_to_point(OpType op, Tensor& tensor, int peer, int tag) {
  const bool sending = op == OpType::send;
  const std::string_view name = op_type_name(op);
  check_tensor(tensor, sending ? "input" : "output", name);
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_,
           "{}: {} {} is not another rank of group '{}' (ranks 0..{}, this is {})", name,
           sending ? "destination" : "source", peer, name_, size() - 1, rank_);
  MT_CHECK(tag >= 0 && tag < (1 << 20), "{}: tag {} out of range [0, 2^20)", name, tag);
  OpDesc d = describe_op(op, tensor, tensor);
  if (sending) {
    d.out = nullptr;
    d.out_numel = 0;
  } else {
    d.in = nullptr;
    d.in_numel = 0;
  }
  d.peer = peer;
  d.tag = tag;
  return issue(std::move(d));
}

namespace {
// What each rank contributes to a split: its color, key, a hash of the member
// list it asked for (new_subgroup) and whether its own arguments were valid.
constexpr int kSplitFields = 4;
}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, const std::string& name) {
  return split_impl(color, key, name, 0, "");
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_subgroup(const std::vector<int>& ranks, const std::string& name) {
  std::string problem;
  std::vector<int> seen(static_cast<size_t>(size()), 0);
  for (int r : ranks) {
    if (r < 0 || r >= size()) {
      problem = fmt::format("rank {} is outside group '{}' (ranks 0..{})", r, name_, size() - 1);
      break;
    }
    if (seen[r]++) {
      problem = fmt::format("rank {} is listed twice", r);
      break;
    }
  }
  if (ranks.empty()) problem = "the member list is empty";
  const auto pos = std::find(ranks.begin(), ranks.end(), rank_);
  const int color = pos == ranks.end() ? -1 : 0;
  const int key = static_cast<int>(pos - ranks.begin());
  const std::vector<int64_t> as64(ranks.begin(), ranks.end());
  return split_impl(color, key, name, hash_counts(as64), problem);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_impl(int color, int key, const std::string& name, int64_t list_hash,
                                                       const std::string& problem) {
  Tensor mine = Tensor::empty({kSplitFields}, DType::i64);
  auto m = mine.data<int64_t>();
  m[0] = color;
  m[1] = key;
  m[2] = list_hash;
  m[3] = problem.empty() ? 1 : 0;
  Tensor all = Tensor::empty({kSplitFields * size()}, DType::i64);
  const uint64_t split_seq = next_seq_;
  all_gather(mine, all)->wait();
  const auto a = all.data<const int64_t>();
  // Every rank sees the same table, so every rank raises the same error.
  for (int r = 0; r < size(); ++r) {
    if (a[kSplitFields * r + 3] == 0)
      throw InvalidArgument(fmt::format("creating a subgroup of '{}': rank {} passed an invalid member list{}", name_,
                                        r, r == rank_ ? ": " + problem : ""));
    if (a[kSplitFields * r + 2] != a[2])
      throw InvalidArgument(
          fmt::format("creating a subgroup of '{}': ranks 0 and {} passed different member lists; every rank "
                      "must pass the same list",
                      name_, r));
  }
  std::vector<int> members;
  for (int r = 0; r < size() && color >= 0; ++r)
    if (a[kSplitFields * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int x, int y) { return a[kSplitFields * x + 1] < a[kSplitFields * y + 1]; });
  const std::string group_name = name.empty() ? fmt::format("{}/{}", name_, color) : name;
  return make_subgroup(members, split_seq, color, group_name);
}

ProcessGroupPtr create_world(std::string_view backend, GroupOptions options) {
  if (backend == "mpi") return create_mpi_world(options);
  if (backend == "local")
    throw InvalidArgument(
        "backend 'local' runs every rank as a thread of one process: build it with "
        "LocalWorld(n) and give each thread its group, instead of create_world");
  throw InvalidArgument(fmt::format("unknown communication backend '{}': available backends are {}", backend,
                                    fmt::join(kBackendNames, ", ")));
}

namespace {
std::atomic<int> stop_signal_noted{0};
static_assert(std::atomic<int>::is_always_lock_free, "note_stop_signal runs in a signal handler");
}  // namespace

void note_stop_signal(int signal) noexcept { stop_signal_noted.store(signal, std::memory_order_relaxed); }
int noted_stop_signal() noexcept { return stop_signal_noted.load(std::memory_order_relaxed); }

}  // namespace meshtrain::comm
