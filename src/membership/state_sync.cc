// sync_state (membership.h): the holders agree on one (hash, size), and the
// ranks without it receive it in shares from every holder of it at once.
#include <algorithm>
#include <map>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "relaxcc/membership.h"

namespace relaxcc {

namespace {

uint64_t hash_of(const std::vector<uint8_t>& bytes) {
  return Fnv1a()
      .bytes(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()))
      .value();
}

// Share i of `size` bytes among `k` sources: [begin, end).
std::pair<int64_t, int64_t> share(int64_t size, int k, int i) {
  return {size * i / k, size * (i + 1) / k};
}

}  // namespace

StateSyncResult sync_state(Communicator& comm, const std::vector<uint8_t>& state, bool holds,
                           const StateSyncOptions& options) {
  const int n = comm.size();
  const int me = comm.rank();
  const auto wait = [&](const WorkPtr& work) { work->wait(options.timeout); };

  // 1. Every rank's (holds, hash, size), as three int64 each.
  const uint64_t mine_hash = holds ? hash_of(state) : 0;
  auto table = std::make_shared<std::vector<int64_t>>(3 * static_cast<size_t>(n));
  auto mine = std::make_shared<std::vector<int64_t>>(
      std::vector<int64_t>{holds ? 1 : 0, static_cast<int64_t>(mine_hash),
                           holds ? static_cast<int64_t>(state.size()) : 0});
  AllgatherOptions ag;
  ag.label = options.label + ": hashes";
  wait(comm.allgather(TensorView::host(mine->data(), 3, mine),
                      TensorView::host(table->data(), 3 * n, table), ExecContext::host(), ag));

  // 2. The agreed pair: held by the most holders; of a tie, the one the
  // lowest rank holds.
  std::map<std::pair<int64_t, int64_t>, int> votes;
  for (int r = 0; r < n; ++r) {
    const int64_t* row = table->data() + 3 * r;
    if (row[0] != 0) ++votes[{row[1], row[2]}];
  }
  std::pair<int64_t, int64_t> agreed{0, -1};
  int best = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t* row = table->data() + 3 * r;
    if (row[0] == 0) continue;
    const int v = votes[{row[1], row[2]}];
    if (v > best) {
      best = v;
      agreed = {row[1], row[2]};
    }
  }
  RELAXCC_ENFORCE(best > 0, InvalidArgument, options.label, ": no rank of ", n,
                  " holds a state to give");
  StateSyncResult result;
  result.hash = static_cast<uint64_t>(agreed.first);
  for (int r = 0; r < n; ++r) {
    const int64_t* row = table->data() + 3 * r;
    if (row[0] != 0 && row[1] == agreed.first && row[2] == agreed.second)
      result.sources.push_back(r);
    else
      result.receivers.push_back(r);
  }
  const int64_t size = agreed.second;
  if (result.receivers.empty()) {
    result.state = state;
    return result;
  }
  const bool receives = std::binary_search(result.receivers.begin(), result.receivers.end(), me);
  if (receives && holds)
    RELAXCC_LOG(warn, options.label, ": rank ", me, "'s state (", state.size(), " bytes, hash ",
                mine_hash, ") differs from the one ", best, " holders agree on; it is replaced");

  // 3. One alltoallv: source i sends its share i to every receiver; a
  // receiver's output is the state in order.
  const int k = static_cast<int>(result.sources.size());
  std::vector<int64_t> send_counts(static_cast<size_t>(n), 0);
  std::vector<int64_t> recv_counts(static_cast<size_t>(n), 0);
  const auto source_index = std::lower_bound(result.sources.begin(), result.sources.end(), me);
  const bool gives = source_index != result.sources.end() && *source_index == me;
  auto input = std::make_shared<std::vector<uint8_t>>();
  if (gives) {
    const auto [begin, end] =
        share(size, k, static_cast<int>(source_index - result.sources.begin()));
    for (int r : result.receivers) {
      send_counts[static_cast<size_t>(r)] = end - begin;
      input->insert(input->end(), state.begin() + begin, state.begin() + end);
    }
  }
  auto output = std::make_shared<std::vector<uint8_t>>(receives ? static_cast<size_t>(size) : 0);
  if (receives)
    for (int i = 0; i < k; ++i) {
      const auto [begin, end] = share(size, k, i);
      recv_counts[static_cast<size_t>(result.sources[static_cast<size_t>(i)])] = end - begin;
    }
  AlltoallOptions ao;
  ao.label = options.label + ": shares";
  wait(comm.alltoallv(
      TensorView::host(input->data(), static_cast<int64_t>(input->size()), input), send_counts,
      TensorView::host(output->data(), static_cast<int64_t>(output->size()), output), recv_counts,
      ExecContext::host(), ao));

  // 4. Every receiver's check, known to all.
  auto ok = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(n));
  auto my_ok = std::make_shared<int32_t>(
      !receives || hash_of(*output) == static_cast<uint64_t>(agreed.first) ? 1 : 0);
  ag.label = options.label + ": checks";
  wait(comm.allgather(TensorView::host(my_ok.get(), 1, my_ok), TensorView::host(ok->data(), n, ok),
                      ExecContext::host(), ag));
  std::vector<int> failed;
  for (int r = 0; r < n; ++r)
    if ((*ok)[static_cast<size_t>(r)] == 0) failed.push_back(r);
  if (!failed.empty()) {
    std::string names;
    for (int r : failed) names += (names.empty() ? "" : ",") + std::to_string(r);
    RELAXCC_THROW(CorruptPayload, options.label, ": the state assembled on rank(s) ", names,
                  " from the shares of ", k, " source(s) does not match the agreed hash ",
                  result.hash, " (", size, " bytes)");
  }
  result.state = receives ? std::move(*output) : state;
  return result;
}

}  // namespace relaxcc
