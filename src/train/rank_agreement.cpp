#include "train/rank_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/hash.h"

namespace meshtrain::train {

namespace {

constexpr size_t kValueBytes = 256;  // a value as the error shows it (longer ones cut)

std::vector<std::pair<std::string, std::string>> what_must_agree(const config::TrainConfig& config,
                                                                 const FileDigests& file_digests) {
  auto lines = config::config_values(config);
  lines.insert(lines.end(), file_digests.begin(), file_digests.end());
  return lines;
}

// Every rank's `mine`, rank after rank.
Tensor gathered(comm::ProcessGroup& world, const Tensor& mine) {
  Tensor all = Tensor::empty({mine.numel() * world.size()}, mine.dtype());
  world.all_gather(mine, all)->wait();
  return all;
}

std::string value_of(const Tensor& values, int rank) {
  const char* bytes = static_cast<const char*>(values.raw()) + static_cast<size_t>(rank) * kValueBytes;
  return std::string(bytes, strnlen(bytes, kValueBytes));
}

// Each value and the ranks that hold it, rank 0's first.
std::string ranks_by_value(const Tensor& values, int ranks) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < ranks; ++r) {
    const std::string v = value_of(values, r);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) it = groups.insert(groups.end(), {v, {}});
    it->second.push_back(r);
  }
  std::string out;
  for (const auto& [value, holders] : groups)
    out += fmt::format("{}{} {} {} {}", out.empty() ? "" : "; ", holders.size() > 1 ? "ranks" : "rank",
                       fmt::join(holders, ", "), holders.size() > 1 ? "have" : "has", value);
  return out;
}

}  // namespace

void check_ranks_agree(const config::TrainConfig& config, const FileDigests& file_digests, comm::ProcessGroup& world) {
  const auto lines = what_must_agree(config, file_digests);
  const auto n = static_cast<int64_t>(lines.size());
  Tensor mine = Tensor::empty({n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) {
    const auto& [key, value] = lines[static_cast<size_t>(i)];
    mine.data<int64_t>()[static_cast<size_t>(i)] = std::bit_cast<int64_t>(fnv1a(key + "\n" + value));
  }
  const Tensor all = gathered(world, mine);
  const std::span<const int64_t> h = all.data<int64_t>();
  int64_t differs = -1;  // the first line on which some rank is not rank 0
  for (int64_t i = 0; i < n && differs < 0; ++i)
    for (int r = 1; r < world.size(); ++r)
      if (h[static_cast<size_t>(r * n + i)] != h[static_cast<size_t>(i)]) differs = i;
  if (differs < 0) return;
  // Every rank's value of that line, to name them.
  const auto& [key, value] = lines[static_cast<size_t>(differs)];
  Tensor text = Tensor::zeros({static_cast<int64_t>(kValueBytes / 8)}, DType::i64);
  std::memcpy(text.raw(), value.data(), std::min(value.size(), kValueBytes - 1));
  const std::string message = fmt::format(
      "the ranks disagree on {}: {}. Every rank must train the same config on the same data (the same file "
      "and --section.key overrides on every rank)",
      key, ranks_by_value(gathered(world, text), world.size()));
  if (world.rank() != 0) {
    world.barrier()->wait();  // until rank 0 ends the job
    throw Error(message);
  }
  throw InvalidArgument(message);
}

void fail_together(comm::ProcessGroup* world, const std::function<void()>& work) {
  std::exception_ptr error;
  try {
    work();
  } catch (const Error&) {  // an InternalError is no Error: a bug goes straight on
    if (!world) throw;
    error = std::current_exception();
  }
  if (!world) return;
  Tensor first = Tensor::empty({1}, DType::f64);  // the lowest failing rank, or the rank count
  first.data<double>()[0] = error ? world->rank() : world->size();
  world->all_reduce(first, comm::ReduceOp::min)->wait();
  const int failed = static_cast<int>(first.data<double>()[0]);
  if (failed == world->size()) return;
  if (failed == world->rank()) std::rethrow_exception(error);
  world->barrier()->wait();  // the failing rank ends the job: this wait does not return
  MT_ASSERT(false, "rank {} failed, yet the job goes on", failed);
}

}  // namespace meshtrain::train
