#include "src/communicator/engine_communicator.h"

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>

#include "relaxcc/collectives/shares.h"
#include "relaxcc/config.h"
#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "relaxcc/topology.h"
#include "src/collectives/argument_checks.h"
#include "src/collectives/ring_schedule.h"
#include "src/collectives/shared_memory.h"
#include "src/engine/compute_op.h"
#include "src/engine/engine.h"
#include "src/engine/op_header.h"
#include "src/engine/point_to_point.h"
#include "src/engine/polling.h"
#include "src/engine/transport.h"
#include "src/engine/tunables_check.h"
#include "src/protocols/alltoall_pairwise.h"
#include "src/protocols/broadcast_chain.h"
#include "src/protocols/recursive_doubling.h"
#include "src/protocols/ring.h"

namespace relaxcc::engine {
namespace {

// Engines whose last reference went inside a completion callback (on a
// thread that runs progress iterations) are destroyed on a thread of their
// own, since their destructor joins their engine thread, which needs the
// token. A wing waits for them before it shuts its transport down
// (wait_for_reaped_engines). Leaked on purpose: it must outlive static
// destruction, which may run before the transport's shutdown.
struct EngineReaper {
  std::mutex mutex;
  std::condition_variable cv;
  int pending = 0;
};

EngineReaper& engine_reaper() {
  static EngineReaper* reaper = new EngineReaper;
  return *reaper;
}

void delete_engine(Engine* e) {
  if (!e->on_engine_thread() && !Engine::drives_progress_here()) {
    delete e;
    return;
  }
  EngineReaper& reaper = engine_reaper();
  {
    std::lock_guard<std::mutex> lock(reaper.mutex);
    ++reaper.pending;
  }
  std::thread([e, &reaper] {
    delete e;
    std::lock_guard<std::mutex> lock(reaper.mutex);
    --reaper.pending;
    reaper.cv.notify_all();
  }).detach();
}

// This host's identity: ranks with the same key share memory (as
// MPI's shared-memory split would see it: one kernel, so hostname and boot id).
uint64_t host_key() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return Fnv1a().bytes(name).byte(0).bytes(boot_id).value();
}

// Node of every rank (0, 1, ... in the order of each node's lowest rank)
// from the ranks' host keys.
std::vector<int> nodes_of(const std::vector<uint64_t>& keys) {
  std::vector<int> node(keys.size());
  std::vector<uint64_t> seen;
  for (size_t r = 0; r < keys.size(); ++r) {
    auto it = std::find(seen.begin(), seen.end(), keys[r]);
    node[r] = static_cast<int>(it - seen.begin());
    if (it == seen.end()) seen.push_back(keys[r]);
  }
  return node;
}

// The engine communicator's own rule, after the checks common to every
// communicator (argument_checks.h): host memory only.
void check_host(const TensorView& t, const ExecContext& ctx, const char* what) {
  RELAXCC_ENFORCE(t.device.is_host() && ctx.device.is_host(), Unsupported, what, " on ", t.device,
                  ": the communicator moves host memory (device tensors go through NCCL)");
}

// What the communicator's handshake learns of every rank.
struct Handshake {
  std::vector<uint64_t> hosts;  // host_key()
  std::vector<CpuMask> cpu_masks;
};

// The node layout of the ranks of an endpoint set (EndpointSet): each rank's
// node, and RELAXCC_RANKS_PER_NODE, which splits one machine into emulated
// nodes (ranks [k*N, (k+1)*N) form node k).
struct NodeLayoutMap {
  std::vector<int> node;
  int64_t ranks_per_node = 0;
  // Whether the ranks `members` (of the endpoint set) share one node, as
  // topology sees it, so that they can share memory.
  bool one_node(const std::vector<int>& members) const {
    return std::all_of(members.begin(), members.end(),
                       [&](int m) { return same_node(m, members[0]); });
  }
  bool same_node(int a, int b) const {
    return node[a] == node[b] && (ranks_per_node <= 0 || a / ranks_per_node == b / ranks_per_node);
  }
};

std::string version_name(uint64_t v) {
  return detail::concat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

// The key bit of groups made by split() and split_node_local().
constexpr uint64_t kSplitKeyBit = uint64_t{1} << 63;

uint64_t handshake_hash(const Tunables& t) {
  Fnv1a h;
  h.u64(t.agreement_hash());
  for (DType d : kAllDTypes) h.u64(dtype_size(d));
  return h.u64(sizeof(void*)).value();
}

class EngineCommunicator final : public Communicator {
 public:
  // A communicator over `lane`; `shared_memory` is set when its members
  // share one node (and may be its parent's); `host_scratch`: its parent's
  // pool for host_scratch() (null: a new one).
  EngineCommunicator(std::shared_ptr<Engine> engine, std::shared_ptr<Lane> lane,
                     std::shared_ptr<const NodeLayoutMap> nodes,
                     std::shared_ptr<SharedMemory> shared_memory,
                     std::shared_ptr<ScratchPool> host_scratch = nullptr)
      : selection_(AllreduceSelection::parse(lane->tunables().allreduce_algo)),
        engine_(std::move(engine)),
        lane_(std::move(lane)),
        nodes_(std::move(nodes)),
        shared_memory_(std::move(shared_memory)),
        host_scratch_(host_scratch ? std::move(host_scratch)
                                   : std::make_shared<ScratchPool>(kHostScratchBytes)) {}
  ~EngineCommunicator() override { engine_->close_lane(lane_); }
  const std::shared_ptr<Engine>& engine() const { return engine_; }
  const std::shared_ptr<Transport>& transport() const {
    return lane_->comms()->endpoints->transport_ptr();
  }

  int rank() const override { return lane_->rank(); }
  int size() const override { return lane_->size(); }
  bool poisoned() const override { return lane_->poisoned(); }
  void poison(const std::string& reason) override { engine_->poison(lane_, reason, true); }
  CommStats stats() const override {
    CommStats s = engine_->stats(*lane_);
    s.round_trip_ns = round_trip_ns_;
    s.pipeline_depth = pipeline_depth();
    return s;
  }
  // Three transport tags per user tag (P2PChannel).
  int max_p2p_tag() const override { return (lane_->comms()->max_tag - 2) / 3; }

  // Checks that every rank runs the same relaxcc version, with the same
  // dtype sizes and Agree-scoped tunables, and returns every rank's host key
  // and affinity mask: an allgather, so a rank that does not arrive gives
  // Timeout, and a difference PeerMismatch, on every rank.
  Handshake handshake(std::chrono::milliseconds timeout, const std::string& creator) {
    const int n = size();
    // version, agreement hash, host key, affinity mask
    constexpr int kFields = 3 + static_cast<int>(std::tuple_size_v<CpuMask>);
    // Carried as i64 (relaxcc has no u64 dtype); compared bit for bit.
    auto mine = std::make_shared<std::vector<int64_t>>(std::initializer_list<int64_t>{
        static_cast<int64_t>(build::kVersion),
        static_cast<int64_t>(handshake_hash(lane_->tunables())), static_cast<int64_t>(host_key())});
    for (uint64_t word : own_cpu_mask()) mine->push_back(static_cast<int64_t>(word));
    auto all = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(kFields) * n);
    AllgatherOptions o;
    o.label = creator + " handshake: relaxcc version, dtype sizes, Agree tunables, hosts";
    allgather(TensorView::host(mine->data(), kFields, mine),
              TensorView::host(all->data(), kFields * n, all), ExecContext::host(), o)
        ->wait(timeout);
    Handshake out;
    out.hosts.resize(static_cast<size_t>(n));
    out.cpu_masks.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      const int64_t* theirs = all->data() + static_cast<size_t>(kFields) * r;
      RELAXCC_ENFORCE(theirs[0] == (*mine)[0], PeerMismatch, creator, " (handshake): rank ", r,
                      " runs relaxcc ", version_name(static_cast<uint64_t>(theirs[0])), ", rank ",
                      rank(), " runs ", version_name(static_cast<uint64_t>((*mine)[0])));
      RELAXCC_ENFORCE(theirs[1] == (*mine)[1], PeerMismatch, creator, " (handshake): ranks ", r,
                      " and ", rank(),
                      " differ in the RELAXCC_* tunables that must agree (relaxcc-bench "
                      "--print-config lists them) or in their builds (dtype sizes, pointer width)");
      out.hosts[r] = static_cast<uint64_t>(theirs[2]);
      for (size_t w = 0; w < out.cpu_masks[r].size(); ++w)
        out.cpu_masks[r][w] = static_cast<uint64_t>(theirs[3 + w]);
    }
    return out;
  }

  // The round trip to this rank's ring neighbours, agreed: the largest of
  // every rank's, in nanoseconds. Each of kRoundTripProbes rounds sends a
  // token to the right neighbour and waits for the one from the left, then
  // answers to the left and waits for the right's answer; a rank's figure is
  // its fastest round (later rounds start in step, so the first's skew
  // drops out). Collective, done by `deadline`; Timeout when a rank does not
  // take part.
  int64_t measure_round_trip(Clock::time_point deadline, const std::string& creator) {
    const auto timeout = [deadline] {
      return std::max(
          std::chrono::milliseconds(1),
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    };
    const int n = size(), r = rank(), right = (r + 1) % n, left = (r - 1 + n) % n;
    auto tokens = std::make_shared<std::array<uint8_t, 4>>();
    auto token = [&tokens](size_t i) {
      return TensorView::host(tokens->data() + i, 1, std::shared_ptr<const void>(tokens));
    };
    P2POptions o;
    o.label = creator + " round-trip probe";
    int64_t fastest = INT64_MAX;
    for (int k = 0; k < kRoundTripProbes; ++k) {
      const auto start = std::chrono::steady_clock::now();
      point_to_point({P2POp::send(right, token(0), 0), P2POp::recv(left, token(1), 0)},
                     ExecContext::host(), o)
          ->wait(timeout());
      point_to_point({P2POp::send(left, token(2), 1), P2POp::recv(right, token(3), 1)},
                     ExecContext::host(), o)
          ->wait(timeout());
      fastest = std::min<int64_t>(fastest, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now() - start)
                                               .count());
    }
    auto agreed = std::make_shared<int64_t>(fastest);
    AllreduceOptions a;
    a.op = ReduceOp::max;
    a.label = creator + " round-trip probe: the largest";
    allreduce(TensorView::host(agreed.get(), 1, agreed), ExecContext::host(), a)->wait(timeout());
    return *agreed;
  }

  // Known after the creation's probe (groups: their parent's).
  void set_round_trip_ns(int64_t ns) { round_trip_ns_ = ns; }

  // Known after the handshake, before the communicator is handed out.
  void set_node_layout(std::shared_ptr<const NodeLayoutMap> nodes,
                       std::shared_ptr<SharedMemory> shared_memory) {
    nodes_ = std::move(nodes);
    shared_memory_ = std::move(shared_memory);
  }

  CommunicatorPtr group(const std::vector<int>& members, const GroupOptions& options) override {
    RELAXCC_ENFORCE((options.key & kSplitKeyBit) == 0, InvalidArgument, "group: key ", options.key,
                    " has its top bit set: those keys belong to split() and split_node_local()");
    return make_group(members, options.key);
  }

  // A group with `key` (split-made groups set kSplitKeyBit, so that they
  // never share a lane with a group() of the same members).
  CommunicatorPtr make_group(const std::vector<int>& members, uint64_t key) {
    const int n = size();
    std::vector<int> comm_members;
    std::vector<char> seen(static_cast<size_t>(n), 0);
    int my_rank = -1;
    // The identity: parent, key, members. The primary tag window: a hash of
    // parent and members plus the key, so that groups of the same members
    // whose keys differ by less than the number of windows never start on
    // the same one.
    Fnv1a id, place;
    id.u64(lane_->id()).u64(key);
    place.u64(lane_->id());
    for (size_t i = 0; i < members.size(); ++i) {
      const int m = members[i];
      RELAXCC_ENFORCE(m >= 0 && m < n, InvalidArgument, "group: member ", m,
                      " is not a rank of this communicator of ", n);
      RELAXCC_ENFORCE(!seen[m], InvalidArgument, "group: rank ", m, " is listed twice");
      seen[m] = 1;
      if (m == rank()) my_rank = static_cast<int>(i);
      comm_members.push_back(lane_->comm_rank(m));
      id.u64(static_cast<uint64_t>(comm_members.back()));
      place.u64(static_cast<uint64_t>(comm_members.back()));
    }
    RELAXCC_ENFORCE(my_rank >= 0, InvalidArgument, "group: the members must include this rank (",
                    rank(), ")");
    RELAXCC_ENFORCE(!poisoned(), CommunicatorPoisoned, "group: the communicator is poisoned");
    const uint32_t lane_id = static_cast<uint32_t>(id.value() ^ (id.value() >> 32)) | 1u;
    std::vector<uint32_t> windows = lane_->comms()->windows->reserve(
        comm_members, static_cast<size_t>(my_rank), place.value() + key, id.value(),
        detail::concat("group of ", members.size(), " ranks with key ", key));
    const bool one_node = nodes_->one_node(comm_members);
    std::shared_ptr<SharedMemory> shm =
        one_node ? (shared_memory_ ? shared_memory_ : std::make_shared<SharedMemory>()) : nullptr;
    // The lane gives its windows back (Lane::retire_windows).
    auto made = std::make_shared<EngineCommunicator>(
        engine_,
        engine_->add_lane(lane_->comms(), std::move(comm_members), my_rank, lane_id,
                          std::move(windows), lane_->tunables()),
        nodes_, std::move(shm), host_scratch_);
    made->set_round_trip_ns(round_trip_ns_);
    return made;
  }

  CommunicatorPtr split(int color, int key, const SplitOptions& options) override {
    // Every rank's (color, key), then a group of the ranks of this color.
    const int n = size();
    auto pairs = std::make_shared<std::vector<int64_t>>(2 * static_cast<size_t>(n));
    auto mine = std::make_shared<std::array<int64_t, 2>>(std::array<int64_t, 2>{color, key});
    AllgatherOptions o;
    o.label = "split: colors and keys";
    allgather(TensorView::host(mine->data(), 2, mine),
              TensorView::host(pairs->data(), 2 * n, pairs), ExecContext::host(), o)
        ->wait(options.timeout);
    const uint64_t split_index = splits_++;
    if (color < 0) return nullptr;
    std::vector<int> members;
    for (int r = 0; r < n; ++r)
      if ((*pairs)[2 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return (*pairs)[2 * a + 1] < (*pairs)[2 * b + 1]; });
    return make_group(members, kSplitKeyBit | split_index);
  }

  CommunicatorPtr split_node_local(const SplitOptions&) override {
    // The node layout is known since creation: no communication.
    std::vector<int> members;
    const int my_node = nodes_->node[lane_->comm_rank(rank())];
    for (int r = 0; r < size(); ++r)
      if (nodes_->node[lane_->comm_rank(r)] == my_node) members.push_back(r);
    return make_group(members, kSplitKeyBit | splits_++);
  }

  TensorView allocate(int64_t numel, DType dtype) override {
    RELAXCC_ENFORCE(static_cast<int>(dtype) < kNumDTypes, InvalidArgument,
                    "allocate: unknown dtype ", static_cast<int>(dtype));
    RELAXCC_ENFORCE(numel >= 0, InvalidArgument, "allocate: negative element count ", numel);
    if (shared_memory_) return shared_memory_->allocate(numel, dtype);
    auto memory = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(numel) *
                                                               dtype_size(dtype));
    return TensorView(memory->data(), numel, dtype, Device::host(), memory);
  }

  TensorView host_scratch(int64_t bytes) override {
    RELAXCC_ENFORCE(bytes >= 0, InvalidArgument, "host_scratch: negative byte count ", bytes);
    auto buffer = std::make_shared<ScratchPool::Buffer>(
        host_scratch_->acquire(static_cast<size_t>(std::max<int64_t>(bytes, 1))));
    if (bytes > 0) std::memset(buffer->data(), 0, static_cast<size_t>(bytes));
    return TensorView(buffer->data(), bytes, DType::u8, Device::host(), buffer);
  }

  WorkPtr point_to_point(const std::vector<P2POp>& ops, const ExecContext& ctx,
                         const P2POptions& options) override {
    check_point_to_point(ops, options, size(), max_p2p_tag());
    for (const P2POp& op : ops) check_host(op.tensor, ctx, "point_to_point tensor");
    // Round sends to another node go in network-sized parts.
    std::vector<int64_t> part_bytes(ops.size(), 0);
    for (size_t i = 0; i < ops.size(); ++i)
      if (!nodes_->same_node(lane_->comm_rank(ops[i].peer), lane_->comm_rank(rank())))
        part_bytes[i] = std::max<int64_t>(lane_->tunables().round_part_bytes,
                                          static_cast<int64_t>(kMinRoundPartBytes));
    return submit(std::make_shared<P2PBatchOp>(ops, options, std::move(part_bytes)), options,
                  [n = ops.size(), round = options.round] {
                    return detail::concat(
                        n, " ops", round != 0 ? detail::concat(", round ", round) : std::string());
                  });
  }

  using Communicator::allreduce;
  WorkPtr allreduce(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllreduceOptions& options) override {
    check_allreduce(input, output, options);
    check_host(input, ctx, "allreduce input");
    check_host(output, ctx, "allreduce output");
    const int n = size();
    AllreduceAlgo algo = options.shares.empty() ? options.algo : AllreduceAlgo::ring;
    if (algo == AllreduceAlgo::automatic)
      algo = selection_.pick(static_cast<int64_t>(output.nbytes()));
    // One rank and recursive doubling work in place.
    if (n == 1) return completed("allreduce", options, [input, output] { copy(input, output); });
    if (algo == AllreduceAlgo::recursive_doubling) {
      std::shared_ptr<RecursiveDoublingOp> op = reusable_small_op(output, options);
      if (op) {
        op->reuse(options.priority, options.label, output, options.op, ctx);
      } else {
        op = std::make_shared<RecursiveDoublingOp>("allreduce", options.priority, options.label,
                                                   output, options.op, rank(), n, ctx,
                                                   static_cast<int>(algo));
        keep_small_op(op, output, options);
      }
      // It works in place: the input goes to the output first (now, unless
      // it runs after another Work).
      if (options.after)
        op->set_prologue([input, output] { copy(input, output); });
      else
        copy(input, output);
      Engine::Details details = [numel = output.numel, dtype = output.dtype] {
        return detail::concat("recursive_doubling, ", numel, " x ", dtype_name(dtype),
                              ", all ranks");
      };
      // It runs on this thread at once when the engine is quiet.
      if (WorkPtr work = engine_->run_now(lane_, op, details, options, completed_inline_))
        return work;
      return submit(std::move(op), options, std::move(details));
    }
    RingSpec spec =
        ring_spec(OpType::allreduce, output.dtype, shard_counts(output.numel, n, options.shares));
    spec.op = options.op;
    spec.local = input;
    spec.gathered = output;
    const int64_t offset =
        std::accumulate(spec.chunk_counts.begin(), spec.chunk_counts.begin() + rank(), int64_t{0});
    spec.result = output.slice(offset, spec.chunk_counts[rank()]);
    share(spec, output);
    return submit_ring("allreduce", options, std::move(spec), ctx, output);
  }

  WorkPtr reduce_scatter(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                         const ReduceScatterOptions& options) override {
    const int n = size();
    check_reduce_scatter(input, output, options, n);
    check_host(input, ctx, "reduce_scatter input");
    check_host(output, ctx, "reduce_scatter output");
    if (n == 1)
      return completed("reduce_scatter", options, [input, output] { copy(input, output); });
    RingSpec spec =
        ring_spec(OpType::reduce_scatter, input.dtype, std::vector<int64_t>(n, output.numel));
    spec.gather_phase = false;
    spec.op = options.op;
    spec.local = input;
    spec.result = output;
    share(spec, input);
    // Partial sums that the right neighbour reads go to node-shared scratch.
    // Without it this rank runs privately: its peers see a PeerMismatch
    // instead of waiting.
    if (spec.shared.pid != 0 && n > 2) {
      try {
        spec.partials = shared_memory_->acquire_scratch(input.nbytes());
      } catch (const CommunicationError& e) {
        RELAXCC_LOG(warn, "rank ", rank(),
                    ": reduce_scatter on a shared input runs privately: ", e.message());
        spec.shared = SharedRef{};
        spec.shared_memory = nullptr;
      }
    }
    return submit_ring("reduce_scatter", options, std::move(spec), ctx, input);
  }

  WorkPtr allgather(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllgatherOptions& options) override {
    return allgatherv(input, output, std::vector<int64_t>(size(), input.numel), ctx, options);
  }

  WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                     const std::vector<int64_t>& counts, const ExecContext& ctx,
                     const AllgatherOptions& options) override {
    const int n = size();
    const TensorView own_slot = check_allgatherv(input, output, counts, rank(), n);
    check_host(input, ctx, "allgather input");
    check_host(output, ctx, "allgather output");
    auto copy_own = [input, own_slot] { copy(input, own_slot); };
    if (n == 1) return completed("allgather", options, copy_own);
    RingSpec spec = ring_spec(OpType::allgather, input.dtype, counts);
    spec.reduce_phase = false;
    spec.gathered = output;
    share(spec, output);
    return submit_ring("allgather", options, std::move(spec), ctx, output, copy_own);
  }

  WorkPtr broadcast(const TensorView& data, const ExecContext& ctx,
                    const BroadcastOptions& options) override {
    check_broadcast(data, options, size());
    check_host(data, ctx, "broadcast tensor");
    const int n = size(), r = rank(), root = options.root;
    return submit(
        std::make_shared<BroadcastChainOp>("broadcast", options.priority, options.label, data, root,
                                           r, n, segment_bytes(), pipeline_depth()),
        options, [root, numel = data.numel, dtype = data.dtype, r, n] {
          return detail::concat("chain from root ", root, ", ", numel, " x ", dtype_name(dtype),
                                ", peers ", (r - 1 + n) % n, ",", (r + 1) % n);
        });
  }

  WorkPtr alltoall(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                   const AlltoallOptions& options) override {
    const int n = size();
    check_alltoall(input, n);
    const std::vector<int64_t> counts(n, input.numel / n);
    return alltoallv(input, counts, output, counts, ctx, options);
  }

  WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                    const TensorView& output, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& options) override {
    const int n = size();
    check_alltoallv(input, send_counts, output, recv_counts, n);
    check_host(input, ctx, "alltoall input");
    check_host(output, ctx, "alltoall output");
    const int64_t esize = static_cast<int64_t>(dtype_size(input.dtype));
    for (int p = 0; p < n; ++p) {
      checked_int(send_counts[p] * esize, "alltoallv: one block");
      checked_int(recv_counts[p] * esize, "alltoallv: one block");
    }
    return submit(std::make_shared<AlltoallPairwiseOp>(
                      "alltoall", options.priority, options.label, input, send_counts, output,
                      recv_counts, rank(), n, shared_memory_ ? 0 : segment_bytes()),
                  options, [numel = input.numel, dtype = input.dtype] {
                    return detail::concat(numel, " x ", dtype_name(dtype), " out, pairwise");
                  });
  }

  WorkPtr barrier(const BarrierOptions& options) override {
    // A recursive-doubling allreduce of one byte: each step depends on the
    // one before, so it completes only once every rank has entered.
    auto token = std::make_shared<uint8_t>(0);
    const TensorView view(token.get(), 1, DType::u8, Device::host(), token);
    if (size() == 1) return completed("barrier", options, [] {});
    return submit(std::make_shared<RecursiveDoublingOp>(
                      "barrier", options.priority, options.label, view, ReduceOp::max, rank(),
                      size(), ExecContext::host(),
                      static_cast<int>(AllreduceAlgo::recursive_doubling), OpType::barrier),
                  options, [] { return std::string("recursive doubling, all ranks"); });
  }

  WorkPtr compute(std::function<void()> fn, const OpOptions& options) override {
    RELAXCC_ENFORCE(fn != nullptr, InvalidArgument, "compute: no function");
    return submit(std::make_shared<ComputeOp>(std::move(fn), options.priority), options,
                  [] { return std::string("local"); });
  }

 private:
  static int checked_int(int64_t v, const char* what) {
    RELAXCC_ENFORCE(v >= 0 && v <= INT32_MAX, InvalidArgument, what, ": ", v,
                    " bytes exceed what one transport call can describe (2^31-1)");
    return static_cast<int>(v);
  }

  static void copy(const TensorView& from, const TensorView& to) {
    if (from.numel > 0 && from.data != to.data) std::memmove(to.data, from.data, from.nbytes());
  }

  // Shared mode when the ring's full layout lies in this node's shared memory.
  void share(RingSpec& spec, const TensorView& full) const {
    if (!shared_memory_) return;
    if (auto ref = shared_memory_->find(full.data, full.nbytes())) {
      spec.shared = *ref;
      spec.shared_memory = shared_memory_;
    }
  }

  RingSpec ring_spec(OpType type, DType dtype, std::vector<int64_t> chunks) const {
    RingSpec spec;
    spec.type = type;
    spec.dtype = dtype;
    spec.chunk_counts = std::move(chunks);
    spec.segment_bytes = segment_bytes();
    spec.pipeline_depth = pipeline_depth();
    spec.offload_bytes = lane_->tunables().offload_bytes;
    spec.algo_id = static_cast<int>(AllreduceAlgo::ring);
    return spec;
  }

  // Submits `op` in the communicator's order, to start after options.after.
  // `prepare`, a local step the operation needs first, runs now when the
  // operation starts at once, else right before it starts.
  // `details` describes the call in its Work's description, when asked for.
  WorkPtr submit(std::shared_ptr<Operation> op, const OpOptions& options, Engine::Details details,
                 std::function<void()> prepare = {}) {
    if (prepare) {
      if (options.after)
        op->set_prologue(std::move(prepare));
      else
        prepare();
    }
    return engine_->submit(lane_, std::move(op), std::move(details), options);
  }

  WorkPtr submit_ring(const char* name, const OpOptions& options, RingSpec spec,
                      const ExecContext& ctx, const TensorView& shown,
                      std::function<void()> prepare = {}) {
    const int n = size(), r = rank();
    auto details = [numel = shown.numel, dtype = shown.dtype, r, n, shared = spec.shared.pid != 0] {
      return detail::concat("ring, ", numel, " x ", dtype_name(dtype), ", peers ", (r - 1 + n) % n,
                            ",", (r + 1) % n, shared ? ", shared buffers" : "");
    };
    return submit(std::make_shared<RingOp>(name, options.priority, options.label, std::move(spec),
                                           r, n, ctx, std::make_unique<IdentityCodec>()),
                  options, details, std::move(prepare));
  }

  // A single rank's operation: `run` (its local copy) now, or once
  // options.after completed (if it failed, fails as Engine::start would).
  WorkPtr completed(const char* name, const OpOptions& options, std::function<void()> run) {
    RELAXCC_ENFORCE(!poisoned(), CommunicatorPoisoned, name, ": the communicator is poisoned");
    const std::string description =
        detail::concat(name, detail::of_label(options.label), " (single rank)");
    if (options.after) {
      return options.after->then(
          [run = std::move(run), description](const Work& after) {
            if (std::exception_ptr e = after.exception())
              RELAXCC_THROW(CommunicationError, description,
                            ": a stage it runs after failed: ", after.description(), ": ",
                            abort_cause(e).reason);
            run();
          },
          description);
    }
    run();
    auto work = std::make_shared<Work>(description);
    work->complete(nullptr);
    return work;
  }

  // The recursive-doubling allreduce kept for reuse, when the engine dropped
  // it (it is referenced here only) and `data` moves in as many messages per
  // step: a call then allocates and schedules nothing. It keeps the last
  // call's views (and their owners) until the next one.
  std::shared_ptr<RecursiveDoublingOp> reusable_small_op(const TensorView& data,
                                                         const AllreduceOptions& options) {
    if (options.after) return nullptr;
    std::lock_guard<std::mutex> lock(small_op_mutex_);
    if (!small_op_ || small_op_.use_count() != 1 || !small_op_->reusable_for(data)) return nullptr;
    // Pairs with the engine's release of its last reference.
    std::atomic_thread_fence(std::memory_order_acquire);
    return small_op_;
  }
  void keep_small_op(const std::shared_ptr<RecursiveDoublingOp>& op, const TensorView& data,
                     const AllreduceOptions& options) {
    // Small ones only: a kept operation holds scratch as large as its data.
    if (options.after || !op->reusable_for(data) ||
        data.nbytes() > RecursiveDoublingOp::kMaxSplitBytes)
      return;
    std::lock_guard<std::mutex> lock(small_op_mutex_);
    // The latest size wins, unless the kept one is in flight.
    if (small_op_ && small_op_.use_count() != 1) return;
    // Pairs with the engine's release of its last reference to the one replaced.
    std::atomic_thread_fence(std::memory_order_acquire);
    small_op_ = op;
  }

  // Node-local rings (shared memory) take the larger segments; rings across
  // nodes the network's.
  int64_t segment_bytes() const {
    const Tunables& t = lane_->tunables();
    return std::max<int64_t>(shared_memory_ ? t.segment_bytes : t.net_segment_bytes, 1);
  }
  // RELAXCC_PIPELINE_DEPTH when set; else, across nodes, the window that
  // keeps a link of RELAXCC_LINK_MBIT busy over the measured round trip.
  int pipeline_depth() const {
    const Tunables& t = lane_->tunables();
    if (t.pipeline_depth > 0)
      return static_cast<int>(std::min<int64_t>(t.pipeline_depth, INT32_MAX));
    if (shared_memory_) return kMinPipelineDepth;
    return path_window(static_cast<double>(t.link_mbit) * 1e6,
                       static_cast<double>(round_trip_ns_) * 1e-9, segment_bytes(),
                       kMinPipelineDepth, t.window_bytes);
  }

  static constexpr int kRoundTripProbes = 3;

  AllreduceSelection selection_;
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Lane> lane_;
  std::shared_ptr<const NodeLayoutMap> nodes_;
  // Set when every rank shares one node; outlives the engine's operations.
  std::shared_ptr<SharedMemory> shared_memory_;
  // host_scratch()'s pool, shared with the groups made from this
  // communicator; it keeps at most kHostScratchBytes of released buffers.
  static constexpr size_t kHostScratchBytes = size_t{256} << 20;
  std::shared_ptr<ScratchPool> host_scratch_;
  // Splits so far (every rank splits in the same order): the key of the next
  // split's group.
  uint64_t splits_ = 0;
  // The agreed round trip to the ring neighbours (measure_round_trip); 0:
  // not measured.
  int64_t round_trip_ns_ = 0;
  std::mutex small_op_mutex_;
  std::shared_ptr<RecursiveDoublingOp> small_op_;
  // What Engine::run_now returns for a call that completed within it: one
  // completed Work, shared by every such call.
  const WorkPtr completed_inline_ = [] {
    auto work = std::make_shared<Work>("allreduce (completed within the call)");
    work->complete(nullptr);
    return work;
  }();
};

}  // namespace

CommunicatorPtr create_engine_communicator(std::shared_ptr<Transport> transport,
                                           std::shared_ptr<Endpoints> endpoints,
                                           const EngineCommunicatorOptions& options) {
  RELAXCC_ENFORCE(
      transport != nullptr && endpoints != nullptr && &endpoints->transport() == transport.get(),
      InvalidArgument, options.creator, ": the endpoints are not the transport's");
  // The wing's factory checked them before it connected; checked here too
  // for any other caller.
  check_tunables(options.tunables);
  auto comms = std::make_shared<EndpointSet>(std::move(endpoints));
  const int rank = comms->endpoints->rank();
  std::vector<int> everyone(static_cast<size_t>(comms->size));
  std::iota(everyone.begin(), everyone.end(), 0);
  // Until the handshake tells the hosts: every rank on a node of its own
  // (no shared memory), the engine sleeping between polls.
  auto provisional = std::make_shared<NodeLayoutMap>();
  provisional->node = everyone;
  std::shared_ptr<Engine> eng;
  if (options.share_engine_with) {
    const auto* other = dynamic_cast<const EngineCommunicator*>(options.share_engine_with.get());
    RELAXCC_ENFORCE(other != nullptr && other->transport() == transport, InvalidArgument,
                    options.creator, ": share_engine_with is not a communicator of this ",
                    transport->name(), " transport");
    eng = other->engine();
  } else {
    eng = std::shared_ptr<Engine>(new Engine(options.tunables, Engine::Polling{}, transport),
                                  delete_engine);
  }
  auto comm = std::make_shared<EngineCommunicator>(
      eng, eng->add_lane(comms, {}, rank, 0, {}, options.tunables), provisional, nullptr);
  auto nodes = std::make_shared<NodeLayoutMap>();
  const Clock::time_point deadline = Clock::now() + options.timeout;
  comms->endpoints->creating(deadline);
  const Handshake handshake = comm->handshake(options.timeout, options.creator);
  comms->endpoints->created();
  nodes->node = nodes_of(handshake.hosts);
  nodes->ranks_per_node = options.tunables.ranks_per_node;
  if (!options.share_engine_with) {
    // CPUs are shared between the ranks of one machine (emulated nodes
    // included).
    std::vector<CpuMask> masks;
    size_t me = 0;
    for (int r = 0; r < comms->size; ++r) {
      if (nodes->node[r] != nodes->node[rank]) continue;
      if (r == rank) me = masks.size();
      masks.push_back(handshake.cpu_masks[r]);
    }
    eng->set_polling(
        choose_polling(options.tunables.engine_poll, shares_cpus(masks, me, cgroup_cpu_limit())));
  }
  const bool one_node = nodes->one_node(everyone);
  comm->set_node_layout(nodes, one_node ? std::make_shared<SharedMemory>() : nullptr);
  // Only a window sized to the path across nodes needs the round trip.
  const Tunables& t = options.tunables;
  if (!one_node && t.pipeline_depth == 0 && t.link_mbit > 0) {
    comm->set_round_trip_ns(comm->measure_round_trip(deadline, options.creator));
    RELAXCC_LOG(info, options.creator, ": rank ", rank, ": agreed round trip ",
                static_cast<double>(comm->stats().round_trip_ns) * 1e-6, " ms; ring window ",
                comm->stats().pipeline_depth, " segments");
  }
  return comm;
}

std::shared_ptr<Transport> transport_of(const Communicator& comm) {
  const auto* c = dynamic_cast<const EngineCommunicator*>(&comm);
  return c != nullptr ? c->transport() : nullptr;
}

int wait_for_reaped_engines(std::chrono::milliseconds timeout) {
  EngineReaper& er = engine_reaper();
  std::unique_lock<std::mutex> lock(er.mutex);
  er.cv.wait_for(lock, timeout, [&] { return er.pending == 0; });
  return er.pending;
}

}  // namespace relaxcc::engine
