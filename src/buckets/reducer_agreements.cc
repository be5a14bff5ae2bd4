// The Reducer's cross-rank agreements (include/relaxcc/reducer.h): the
// bucket plan verified across ranks, and the unused tensors settled over
// ranks at the end of a step.
#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <limits>
#include <set>
#include <utility>

#include "relaxcc/collective_setup.h"
#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "relaxcc/reducer.h"
#include "src/buckets/bucket_memory.h"
#include "src/buckets/reducer_internal.h"

namespace relaxcc {

namespace {

const char* role_name(TensorRole role) {
  switch (role) {
    case TensorRole::gradient:
      return "gradient";
    case TensorRole::parameter:
      return "parameter";
    case TensorRole::optimizer_state:
      return "optimizer state";
  }
  return "unknown role";
}

// One rank's tensor #index, as the plan agreement reports it.
struct TensorSummary {
  int64_t count = 0;  // tensors the rank registered
  bool present = false;
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::f32;
  TensorRole role = TensorRole::gradient;
};

// "'layer2' (4096 x f32) on rank 1", with the role when `show_role`, or
// "does not exist on rank 1"; `verb` goes before a tensor that exists.
std::string describe(const TensorSummary& t, int rank, bool show_role, const char* verb) {
  if (!t.present) return detail::concat("does not exist on rank ", rank);
  return detail::concat(verb, "'", t.name, "' (", t.numel, " x ", dtype_name(t.dtype),
                        show_role ? std::string(", ") + role_name(t.role) : std::string(),
                        ") on rank ", rank);
}

}  // namespace

// "rank 0", "ranks 1-3", "ranks 0,2-5,7": the ranks r with marks[r] == want.
std::string detail::rank_list(const std::vector<uint8_t>& marks, uint8_t want) {
  std::string out;
  int listed = 0;
  const int n = static_cast<int>(marks.size());
  for (int r = 0; r < n;) {
    if (marks[r] != want) {
      ++r;
      continue;
    }
    int last = r;
    while (last + 1 < n && marks[last + 1] == want) ++last;
    if (!out.empty()) out += ",";
    out += last == r ? std::to_string(r) : detail::concat(r, last == r + 1 ? "," : "-", last);
    listed += last - r + 1;
    r = last + 1;
  }
  return detail::concat(listed == 1 ? "rank " : "ranks ", out);
}

void Reducer::verify_plan_across_ranks() {
  // Rank 0's description of every tensor (name hash, dtype, numel, role);
  // each rank finds its first difference, and the lowest (tensor, rank) pair
  // over ranks is raised everywhere, with that rank's and rank 0's tensor.
  const std::string label = "Reducer: plan agreement";
  const int64_t count = static_cast<int64_t>(tensors_.size());
  auto root_count_buf = std::make_shared<int64_t>(count);
  run_labeled(label + " (rank 0's tensor count)", [&](const std::string& l) {
    BroadcastOptions o;
    o.label = l;
    return side_->broadcast(TensorView::host(root_count_buf.get(), 1, root_count_buf),
                            ExecContext::host(), o);
  });
  const int64_t root_count = *root_count_buf;
  std::vector<int64_t> mine(static_cast<size_t>(count) * 4);
  for (int64_t i = 0; i < count; ++i) {
    const TensorSpec& t = tensors_[i];
    mine[4 * i] = static_cast<int64_t>(Fnv1a().bytes(t.name).value());
    mine[4 * i + 1] = static_cast<int64_t>(t.view.dtype);
    mine[4 * i + 2] = t.view.numel;
    mine[4 * i + 3] = static_cast<int64_t>(t.role);
  }
  auto root_buf = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(root_count) * 4 + 1);
  std::vector<int64_t>& root = *root_buf;
  if (comm_->rank() == 0) std::copy(mine.begin(), mine.end(), root.begin());
  if (root_count > 0) {
    run_labeled(label + " (rank 0's tensors)", [&](const std::string& l) {
      BroadcastOptions o;
      o.label = l;
      return side_->broadcast(TensorView::host(root.data(), root_count * 4, root_buf),
                              ExecContext::host(), o);
    });
  }
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  int64_t first = kNone;
  for (int64_t i = 0; i < std::max(count, root_count); ++i) {
    if (i >= count || i >= root_count ||
        !std::equal(mine.begin() + 4 * i, mine.begin() + 4 * i + 4, root.begin() + 4 * i)) {
      first = i;
      break;
    }
  }
  // (first difference, rank) packed so that the minimum over ranks is the
  // lowest tensor, then the lowest rank.
  const int n = comm_->size();
  auto key_of_min = std::make_shared<int64_t>(first == kNone ? kNone : first * n + comm_->rank());
  run_labeled(label + " (first difference)", [&](const std::string& l) {
    AllreduceOptions o;
    o.op = ReduceOp::min;
    o.label = l;
    return side_->allreduce(TensorView::host(key_of_min.get(), 1, key_of_min), ExecContext::host(),
                            o);
  });
  const int64_t key = *key_of_min;
  if (key == kNone) return;
  const int64_t index = key / n;
  const int other = static_cast<int>(key % n);
  // `root`'s tensor #index, broadcast: a fixed header, then the name.
  auto summary_of = [&](int from) {
    TensorSummary t;
    const bool here = index < count;
    auto header_buf = std::make_shared<std::array<int64_t, 6>>(
        std::array<int64_t, 6>{count, here ? 1 : 0, 0, 0, 0, 0});
    std::array<int64_t, 6>& header = *header_buf;
    auto name_buf = std::make_shared<std::string>();
    std::string& name = *name_buf;
    if (here) {
      const TensorSpec& spec = tensors_[index];
      header[2] = spec.view.numel;
      header[3] = static_cast<int64_t>(spec.view.dtype);
      header[4] = static_cast<int64_t>(spec.role);
      header[5] = static_cast<int64_t>(spec.name.size());
      name = spec.name;
    }
    const std::string what = detail::concat(label, " (rank ", from, "'s tensor #", index, ")");
    run_labeled(what, [&](const std::string& l) {
      BroadcastOptions o;
      o.root = from;
      o.label = l;
      return side_->broadcast(TensorView::host(header.data(), 6, header_buf), ExecContext::host(),
                              o);
    });
    name.resize(static_cast<size_t>(header[5]));
    if (header[5] > 0) {
      run_labeled(what, [&](const std::string& l) {
        BroadcastOptions o;
        o.root = from;
        o.label = l;
        return side_->broadcast(
            TensorView(name.data(), header[5], DType::u8, Device::host(), name_buf),
            ExecContext::host(), o);
      });
    }
    t.count = header[0];
    t.present = header[1] != 0;
    t.numel = header[2];
    t.dtype = static_cast<DType>(header[3]);
    t.role = static_cast<TensorRole>(header[4]);
    t.name = name;
    return t;
  };
  const TensorSummary theirs = summary_of(other);
  const TensorSummary ours = summary_of(0);
  const bool show_role = theirs.present && ours.present && theirs.role != ours.role;
  // "tensor #3 is 'a' (8 x f32) on rank 1 but 'a' (4 x f32) on rank 0",
  // "tensor #5 does not exist on rank 1 but is 'b' (2 x f32) on rank 0".
  RELAXCC_THROW(PeerMismatch, "Reducer: ranks registered different tensors: tensor #", index, " ",
                describe(theirs, other, show_role, "is "), " but ",
                describe(ours, 0, show_role, theirs.present ? "" : "is "), "; rank ", other,
                " has ", theirs.count, " tensors, rank 0 has ", ours.count);
}

void Reducer::settle_unused() {
  // flags[i]: tensor i is marked here; flags[count + i]: a gradient not
  // marked here. After the max over ranks: used somewhere, unused somewhere.
  // A local step (gradients stay on each rank) has nothing to agree on:
  // this rank's own flags settle it, and no collective runs.
  const size_t count = tensors_.size();
  auto flags_buf = std::make_shared<std::vector<uint8_t>>(2 * count, 0);
  std::vector<uint8_t>& flags = *flags_buf;
  int64_t iteration = 0;
  bool agree = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    iteration = iteration_;
    agree = !local_step_;
    for (size_t i = 0; i < count; ++i) {
      if (tensors_[i].role != TensorRole::gradient) continue;
      const bool used = marked_[i] || accumulated_[i];
      flags[i] = used ? 1 : 0;
      flags[count + i] = used ? 0 : 1;
    }
  }
  const std::vector<uint8_t> local(flags.begin(),
                                   flags.begin() + static_cast<std::ptrdiff_t>(count));
  if (agree) {
    run_labeled(detail::concat("Reducer: agreement on unused tensors of iteration ", iteration),
                [&](const std::string& label) {
                  AllreduceOptions o;
                  o.op = ReduceOp::max;
                  o.label = label;
                  return side_->allreduce(
                      TensorView(flags.data(), static_cast<int64_t>(flags.size()), DType::u8,
                                 Device::host(), flags_buf),
                      ExecContext::host(), o);
                });
    warn_partly_marked(flags, local, iteration);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  memory_->acquire();  // accumulated gradients, as computed so far
  for (size_t i = 0; i < count; ++i) {
    if (tensors_[i].role != TensorRole::gradient || marked_[i]) continue;
    const auto [b, e] = plan_.locate(static_cast<int>(i));
    const Bucket& bucket = plan_.buckets()[b];
    void* slot = detail::slot_ptr(storage_[b], bucket.entries[e], bucket.dtype);
    if (accumulated_[i]) {
      // Accumulated in no_sync iterations: its gradient is in the bucket
      // already (bucket views) or still in the tensor.
      if (!options_.gradient_as_bucket_view)
        memory_->copy(slot, tensors_[i].view.data, tensors_[i].view.nbytes());
    } else if (agree) {
      // Not used here: contribute zeros. A bucket view of a tensor unused
      // everywhere is left as it was: kept, restored once the bucket completed.
      if (!flags[i] && options_.gradient_as_bucket_view &&
          !algorithm_->capabilities().owns_optimizer_step)
        kept_.emplace_back(static_cast<int>(i), memory_->read(slot, tensors_[i].view.nbytes()));
      memory_->zero(slot, tensors_[i].view.nbytes());
    }
    untouched_[i] = flags[i] ? 0 : 1;
    marked_[i] = 1;
    --pending_[b];
  }
  std::fill(accumulated_.begin(), accumulated_.end(), 0);
  for (size_t i = 0; i < count; ++i)
    if (!untouched_[i]) used_in_step_[i] = 1;
  dispatch_ready_buckets_locked();
}

void Reducer::warn_partly_marked(const std::vector<uint8_t>& agreed,
                                 const std::vector<uint8_t>& local, int64_t iteration) {
  // The agreed flags and warned_ are the same on every rank, so every rank
  // finds the same tensors and takes part in the allgather, or none does.
  const size_t count = tensors_.size();
  std::vector<int> fresh;
  for (size_t i = 0; i < count; ++i) {
    if (agreed[i] && agreed[count + i] && !warned_[i]) {
      fresh.push_back(static_cast<int>(i));
      warned_[i] = 1;
    }
  }
  if (fresh.empty()) return;
  const int n = comm_->size();
  const int64_t k = static_cast<int64_t>(fresh.size());
  auto mine_buf = std::make_shared<std::vector<uint8_t>>(fresh.size());
  auto all_buf = std::make_shared<std::vector<uint8_t>>(fresh.size() * static_cast<size_t>(n));
  std::vector<uint8_t>& mine = *mine_buf;
  const std::vector<uint8_t>& all = *all_buf;
  for (size_t j = 0; j < fresh.size(); ++j) mine[j] = local[fresh[j]];
  run_labeled(detail::concat("Reducer: which ranks marked the partly marked tensors of iteration ",
                             iteration),
              [&](const std::string& label) {
                AllgatherOptions o;
                o.label = label;
                return side_->allgather(
                    TensorView(mine.data(), k, DType::u8, Device::host(), mine_buf),
                    TensorView(all_buf->data(), k * n, DType::u8, Device::host(), all_buf),
                    ExecContext::host(), o);
              });
  if (comm_->rank() != 0) return;
  for (int64_t j = 0; j < k; ++j) {
    std::vector<uint8_t> by_rank(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) by_rank[r] = all[static_cast<size_t>(r * k + j)];
    RELAXCC_LOG(warn, "Reducer: tensor '", tensors_[fresh[j]].name, "' was marked ready on ",
                detail::rank_list(by_rank, 1), " but not on ", detail::rank_list(by_rank, 0),
                " in iteration ", iteration,
                ": where it was not marked it counts as unused and contributes zeros, so a "
                "gradient computed "
                "there but never marked ready is lost. Mark it ready on every rank that computes "
                "it (if it is "
                "unused there by design, ignore this; warned once per tensor)");
  }
}

}  // namespace relaxcc
