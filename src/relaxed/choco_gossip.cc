#include "relaxcc/relaxed/choco_gossip.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <span>

#include "relaxcc/errors.h"
#include "src/relaxed/tensor_backend.h"

namespace relaxcc {

struct ChocoGossip::State {
  int64_t numel = 0;
  std::vector<float> own;
  std::vector<std::vector<float>> theirs;
  std::vector<int> peers;
  std::vector<double> weights;
  // Rounds with a deadline: q sent to and applied from each neighbour.
  std::vector<uint64_t> sent, applied;
  // Per neighbour: sent - applied when its last q of a round came.
  std::vector<int64_t> lag;
  // Rounds with a deadline since the last settle(): their copies may differ
  // across ranks until then, and rounds without one may not follow.
  bool unsettled = false;
  std::atomic<bool> busy{false};

  // Neighbour k's q numbered applied[k] + 1 came: checked and applied.
  void apply(size_t k, const std::vector<std::byte>& q, const kernels::CompressorConfig& codec,
             int me, const ExecContext& ctx);
};

namespace {
using Bytes = std::vector<std::byte>;
using Clock = std::chrono::steady_clock;

TensorView f32_view(std::vector<float>& v) {
  return TensorView::host(v.data(), static_cast<int64_t>(v.size()));
}

TensorView bytes_view(const std::shared_ptr<Bytes>& b) {
  return TensorView(b->data(), static_cast<int64_t>(b->size()), DType::u8, Device::host(), b);
}

// Every neighbour's codec is checked against this rank's before its q moves
// a copy.
void check_codec(const Bytes& q, const kernels::CompressorConfig& codec, int me, int peer) {
  const kernels::PayloadHeader h = kernels::read_header(q);
  RELAXCC_ENFORCE(h.kind == codec.kind && h.bits == codec.bits && h.chunk == codec.chunk,
                  PeerMismatch, "ChocoGossip on rank ", me, ": rank ", peer, " compresses with ",
                  kernels::compressor_name(h.kind), " (", int(h.bits), " bits, chunk ", h.chunk,
                  "), this rank with ", kernels::compressor_name(codec.kind), " (", codec.bits,
                  " bits, chunk ", codec.chunk, ")");
}

// x_i += gamma * sum_j w_ij (x_hat_j - x_hat_i), over the neighbours whose
// weight is not zero.
void correct(const TensorView& x, const std::vector<float>& own,
             const std::vector<std::vector<float>>& theirs, const std::vector<double>& weights,
             double gamma) {
  float* out = x.as<float>();
  for (size_t i = 0; i < own.size(); ++i) {
    double correction = 0;
    for (size_t k = 0; k < theirs.size(); ++k)
      if (weights[k] != 0) correction += weights[k] * (static_cast<double>(theirs[k][i]) - own[i]);
    out[i] = static_cast<float>(out[i] + gamma * correction);
  }
}
}  // namespace

void ChocoGossip::State::apply(size_t k, const std::vector<std::byte>& q,
                               const kernels::CompressorConfig& codec, int me,
                               const ExecContext& ctx) {
  check_codec(q, codec, me, peers[k]);
  kernels::decode_accumulate(q, f32_view(theirs[k]), ctx);
  ++applied[k];
}

ChocoGossip::ChocoGossip(CommunicatorPtr comm, int64_t numel, ChocoOptions options)
    : comm_(std::move(comm)), options_(options), state_(std::make_shared<State>()) {
  RELAXCC_ENFORCE(comm_ != nullptr, InvalidArgument, "ChocoGossip: null communicator");
  RELAXCC_ENFORCE(numel >= 0, InvalidArgument, "ChocoGossip: negative element count ", numel);
  RELAXCC_ENFORCE(options_.gamma > 0 && options_.gamma <= 1, InvalidArgument,
                  "ChocoGossip: gamma = ", options_.gamma, ", expected in (0, 1]");
  RELAXCC_ENFORCE(options_.tag >= 0 && options_.tag < comm_->max_p2p_tag(), InvalidArgument,
                  "ChocoGossip: tags ", options_.tag, " and ", options_.tag + 1, " outside [0, ",
                  comm_->max_p2p_tag(), "]");
  options_.codec.validate();
  const int n = comm_->size(), r = comm_->rank();
  state_->numel = numel;
  state_->own.assign(static_cast<size_t>(numel), 0.0f);
  if (n == 2) {
    state_->peers = {1 - r};
    state_->weights = {0.5};
  } else if (n > 2) {
    state_->peers = {(r + n - 1) % n, (r + 1) % n};
    state_->weights = {1.0 / 3, 1.0 / 3};
  }
  state_->theirs.assign(state_->peers.size(), std::vector<float>(static_cast<size_t>(numel), 0.0f));
  state_->sent.assign(state_->peers.size(), 0);
  state_->applied.assign(state_->peers.size(), 0);
  state_->lag.assign(state_->peers.size(), 0);
}

const std::vector<float>& ChocoGossip::own_copy() const {
  return state_->own;
}
const std::vector<std::vector<float>>& ChocoGossip::neighbour_copies() const {
  return state_->theirs;
}
const std::vector<int>& ChocoGossip::neighbours() const {
  return state_->peers;
}

void ChocoGossip::load_copies(const std::vector<float>& own,
                              const std::vector<std::vector<float>>& theirs) {
  RELAXCC_ENFORCE_EQ(own.size(), state_->own.size(), InvalidArgument,
                     "ChocoGossip::load_copies: elements of this rank's copy");
  RELAXCC_ENFORCE_EQ(theirs.size(), state_->theirs.size(), InvalidArgument,
                     "ChocoGossip::load_copies: neighbour copies");
  for (size_t j = 0; j < theirs.size(); ++j)
    RELAXCC_ENFORCE_EQ(theirs[j].size(), state_->theirs[j].size(), InvalidArgument,
                       "ChocoGossip::load_copies: elements of neighbour copy ", j);
  state_->own = own;
  state_->theirs = theirs;
  // A restored run numbers its q afresh (no q may be in flight: a fresh
  // communicator, or after settle()).
  std::fill(state_->sent.begin(), state_->sent.end(), 0);
  std::fill(state_->applied.begin(), state_->applied.end(), 0);
  std::fill(state_->lag.begin(), state_->lag.end(), 0);
  state_->unsettled = false;
}

bool ChocoGossip::settled() const {
  return !state_->unsettled;
}

void ChocoGossip::settle(std::chrono::milliseconds timeout) {
  State& s = *state_;
  RELAXCC_ENFORCE(!s.busy, InvalidArgument, "ChocoGossip::settle: a round is still in flight");
  // Every rank of a run takes a deadline or none: the ranks agree on
  // whether to settle without a message.
  if (!s.unsettled) return;
  const Clock::time_point until = Clock::now() + timeout;
  const int tag = options_.tag + 1;
  // How many q each neighbour sent this rank (plain messages: a stream of
  // their own beside the rounds').
  std::vector<int64_t> mine(s.sent.begin(), s.sent.end()), theirs(s.peers.size());
  std::vector<P2POp> ops;
  for (size_t k = 0; k < s.peers.size(); ++k) {
    ops.push_back(P2POp::send(s.peers[k], TensorView::host(&mine[k], 1), tag));
    ops.push_back(P2POp::recv(s.peers[k], TensorView::host(&theirs[k], 1), tag));
  }
  P2POptions plain;
  plain.label = "CHOCO gossip: settle";
  comm_->point_to_point(ops, ExecContext::host(), plain)->wait(timeout);
  const size_t payload = kernels::encoded_size(s.numel, options_.codec);
  for (size_t k = 0; k < s.peers.size(); ++k) {
    while (s.applied[k] < static_cast<uint64_t>(theirs[k])) {
      auto in = std::make_shared<Bytes>(payload);
      P2POptions p2p;
      p2p.round = s.applied[k] + 1;
      p2p.deadline = until;
      p2p.keep_late = true;
      p2p.label = "CHOCO gossip: settle";
      WorkPtr w = comm_->point_to_point({P2POp::recv(s.peers[k], bytes_view(in), tag)},
                                        ExecContext::host(), p2p);
      w->wait(timeout);
      RELAXCC_ENFORCE(!w->partial(), Timeout, "ChocoGossip::settle on rank ", comm_->rank(), ": q ",
                      s.applied[k] + 1, " of ", theirs[k], " from rank ", s.peers[k],
                      " did not come within ", timeout.count(), " ms");
      s.apply(k, *in, options_.codec, comm_->rank(), ExecContext::host());
    }
  }
  s.unsettled = false;
}

WorkPtr ChocoGossip::step(const TensorView& x, uint64_t round, const ExecContext& ctx,
                          const ChocoRound& timing) {
  relaxed::require_host("ChocoGossip", comm_->rank(), x, ctx);
  x.check_valid("ChocoGossip x");
  RELAXCC_ENFORCE(x.dtype == DType::f32 && x.numel == state_->numel, InvalidArgument,
                  "ChocoGossip: expected ", state_->numel, " x f32, got ", x.numel, " x ",
                  dtype_name(x.dtype));
  RELAXCC_ENFORCE(round >= 1, InvalidArgument, "ChocoGossip: round ", round, ", expected >= 1");
  RELAXCC_ENFORCE(!state_->busy.exchange(true), InvalidArgument,
                  "ChocoGossip: a round is still in flight (wait for its Work first)");
  const bool timed = timing.deadline || timing.adaptive;
  if (!timed && state_->unsettled) {
    state_->busy = false;
    RELAXCC_THROW(InvalidArgument,
                  "ChocoGossip: a round without a deadline after rounds with one needs settle() "
                  "first");
  }
  try {
    return timed ? timed_step(x, round, ctx, timing) : synchronous_step(x, round, ctx);
  } catch (...) {
    state_->busy = false;
    throw;
  }
}

std::shared_ptr<std::vector<std::byte>> ChocoGossip::encode_round(const TensorView& x,
                                                                  uint64_t round,
                                                                  const ExecContext& ctx) const {
  // q = Q(x - x_hat_i).
  const State& s = *state_;
  const int64_t n = s.numel;
  std::vector<float> diff(static_cast<size_t>(n));
  const float* xs = x.as<float>();
  for (int64_t i = 0; i < n; ++i) diff[i] = xs[i] - s.own[i];
  auto q = std::make_shared<Bytes>(kernels::encoded_size(n, options_.codec));
  ExecContext round_ctx = ctx;
  round_ctx.rng.offset = ctx.rng.offset + round * static_cast<uint64_t>(n);
  kernels::encode(f32_view(diff), *q, options_.codec, round_ctx);
  return q;
}

WorkPtr ChocoGossip::synchronous_step(const TensorView& x, uint64_t round, const ExecContext& ctx) {
  State& s = *state_;
  // x_hat_i += D(q) once the exchange succeeded.
  auto q = encode_round(x, round, ctx);
  const size_t payload = q->size();
  std::vector<P2POp> ops;
  std::vector<std::shared_ptr<Bytes>> in;
  for (int peer : s.peers) ops.push_back(P2POp::send(peer, bytes_view(q), options_.tag));
  for (int peer : s.peers) {
    in.push_back(std::make_shared<Bytes>(payload));
    ops.push_back(P2POp::recv(peer, bytes_view(in.back()), options_.tag));
  }
  P2POptions p2p;
  p2p.round = round;
  p2p.priority = options_.priority;
  p2p.label = "CHOCO gossip";
  WorkPtr w = comm_->point_to_point(ops, ctx, p2p);
  auto state = state_;
  const double gamma = options_.gamma;
  const kernels::CompressorConfig codec = options_.codec;
  RelaxedStats* stats = options_.stats;
  const int me = comm_->rank();
  return w->then([state, q, in, x, gamma, codec, ctx, stats, payload, me](const Work& done) {
    State& st = *state;
    struct Release {
      State& s;
      ~Release() { s.busy = false; }
    } release{st};
    // A failed exchange changes nothing: the copies stay as they were.
    if (done.exception()) return;
    for (size_t k = 0; k < st.peers.size(); ++k) check_codec(*in[k], codec, me, st.peers[k]);
    // x_hat_i += D(q_i), x_hat_j += D(q_j).
    kernels::decode_accumulate(*q, f32_view(st.own), ctx);
    for (size_t k = 0; k < st.peers.size(); ++k)
      kernels::decode_accumulate(*in[k], f32_view(st.theirs[k]), ctx);
    correct(x, st.own, st.theirs, st.weights, gamma);
    if (stats) stats->add_round(st.peers, payload, st.peers, payload);
  });
}

namespace {
// One round with a deadline: per neighbour a chain of receives (its next q
// by the neighbour's deadline, then every further one already there), and
// the sends; the round completes when all of them have.
struct TimedRound {
  CommunicatorPtr comm;
  TensorView x;
  ExecContext ctx;
  uint64_t round = 0;
  int tag = 0, priority = 0, me = 0;
  double gamma = 0;
  kernels::CompressorConfig codec;
  size_t payload = 0;
  RelaxedStats* stats = nullptr;
  AdaptiveDeadline::Guard learner;
  std::chrono::microseconds cap{0};
  Clock::time_point start;
  WorkPtr done;
  std::mutex mutex;
  int open = 0;  // chains and sends still running
  std::exception_ptr error;
  std::vector<int64_t> arrival_us;  // per neighbour (-1: missed)
  std::vector<bool> straggler;      // per neighbour: left out by its wait
  std::vector<WorkPtr> parts;       // the sends and receives posted

  // The first part still pending (null: none).
  WorkPtr pending_part() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const WorkPtr& w : parts)
      if (!w->is_completed()) return w;
    return nullptr;
  }
};

// The round's result, a composite of its parts (work.h): a wait drives
// their progress, and a wait that expires times out the first part still
// pending, as that part's own wait would.
class TimedRoundWork final : public Work {
 public:
  TimedRoundWork(std::string description, std::chrono::milliseconds timeout,
                 std::weak_ptr<TimedRound> round)
      : Work(std::move(description), timeout), round_(std::move(round)) {}

 protected:
  bool await(Clock::time_point deadline) override {
    while (!is_completed()) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(1));
      auto r = round_.lock();
      WorkPtr part = r ? r->pending_part() : nullptr;
      r.reset();
      // A part's wait drives the engine; between parts (a callback posting
      // the next receive) the round waits on its own completion.
      if (part) {
        try {
          part->wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(slice) +
                         std::chrono::milliseconds(1));
        } catch (...) {
          // The part's failure reaches the round through its callback.
        }
      } else {
        block_until(now + slice);
      }
    }
    return is_completed();
  }
  std::string on_timeout(const std::string&) override {
    auto r = round_.lock();
    WorkPtr part = r ? r->pending_part() : nullptr;
    if (!part) return {};
    try {
      part->wait(std::chrono::milliseconds(0));
    } catch (const std::exception&) {
    }
    return part->description();
  }

 private:
  std::weak_ptr<TimedRound> round_;
};
}  // namespace

WorkPtr ChocoGossip::timed_step(const TensorView& x, uint64_t round, const ExecContext& ctx,
                                const ChocoRound& timing) {
  State& s = *state_;
  auto q = encode_round(x, round, ctx);
  // The sends are never dropped (keep_late): this rank's copy moves now.
  kernels::decode_accumulate(*q, f32_view(s.own), ctx);
  s.unsettled = true;
  auto r = std::make_shared<TimedRound>();
  r->comm = comm_;
  r->x = x;
  r->ctx = ctx;
  r->round = round;
  r->tag = options_.tag + 1;  // apart from the rounds without a deadline
  r->priority = options_.priority;
  r->me = comm_->rank();
  r->gamma = options_.gamma;
  r->codec = options_.codec;
  r->payload = q->size();
  r->stats = options_.stats;
  r->start = Clock::now();
  r->arrival_us.assign(s.peers.size(), -1);
  AdaptiveDeadline* adaptive = timing.adaptive;
  if (adaptive) {
    adaptive->begin_round(round, r->start);
    r->learner = adaptive->guard();
    r->cap = adaptive->options().cap;
  }
  // Per neighbour: the time by which its next q must have begun to arrive.
  std::vector<Clock::time_point> deadlines;
  for (int peer : s.peers) {
    const AdaptiveDeadline::Wait w =
        adaptive ? adaptive->wait_for(peer, round) : AdaptiveDeadline::Wait{};
    deadlines.push_back(adaptive ? r->start + w.wait : *timing.deadline);
    r->straggler.push_back(w.straggler);
  }
  // The chains, the sends, and this call (so that nothing completes the
  // round before every part of it started).
  r->open = static_cast<int>(2 * s.peers.size()) + 1;
  auto state = state_;
  const auto finish = [state, r] {
    {
      std::lock_guard<std::mutex> lock(r->mutex);
      if (--r->open > 0) return;
    }
    // Every part of the round is done: nothing else touches r or the copies.
    State& st = *state;
    std::vector<int> on_time, late;
    std::vector<double> weights = st.weights;
    for (size_t k = 0; k < st.peers.size(); ++k) {
      // A neighbour is on time when its next q had begun to arrive by its
      // deadline; a straggler's (not waited for: its q is taken when it is
      // already there, an earlier one) only if it also kept pace with this
      // rank since its last one (the count it lags by did not grow), so a
      // slow neighbour stays a straggler and one that recovered does not.
      const bool came = r->arrival_us[k] >= 0;
      const int64_t lag = static_cast<int64_t>(st.sent[k] - st.applied[k]);
      const bool ok = came && (!r->straggler[k] || lag <= st.lag[k]);
      if (came) st.lag[k] = lag;
      (ok ? on_time : late).push_back(st.peers[k]);
      // A late neighbour is left out of the correction (its copy is older
      // than the others'), as gossip leaves out a late peer.
      if (!ok) weights[k] = 0;
    }
    if (!r->error) {
      correct(r->x, st.own, st.theirs, weights, r->gamma);
      if (r->stats) r->stats->add_round(st.peers, r->payload, on_time, r->payload, late);
      if (r->learner)
        r->learner([&](AdaptiveDeadline& a) {
          for (size_t k = 0; k < st.peers.size(); ++k) {
            if (weights[k] != 0)
              a.observe(st.peers[k], std::chrono::microseconds(r->arrival_us[k]));
            else
              a.missed(st.peers[k], r->round);
          }
        });
    }
    st.busy = false;
    WorkPtr done = r->done;
    done->set_contributions(std::move(on_time), std::move(late));
    done->complete(r->error);
  };
  const auto fail = [r](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(r->mutex);
    if (!r->error) r->error = std::move(e);
  };
  // Receives the q numbered `number` from neighbour k; a q that came is
  // applied and the next one asked for, without waiting.
  auto chain = std::make_shared<std::function<void(size_t, Clock::time_point, bool)>>();
  std::weak_ptr<std::function<void(size_t, Clock::time_point, bool)>> weak_chain = chain;
  *chain = [state, r, finish, fail, weak_chain](size_t k, Clock::time_point deadline, bool first) {
    State& st = *state;
    auto in = std::make_shared<Bytes>(r->payload);
    P2POptions p2p;
    p2p.round = st.applied[k] + 1;
    p2p.deadline = deadline;
    p2p.started_deadline =
        std::max(deadline, Clock::now()) + (r->cap.count() > 0 ? r->cap : std::chrono::seconds(2));
    p2p.keep_late = true;
    p2p.priority = r->priority;
    p2p.label = "CHOCO gossip";
    WorkPtr w;
    try {
      w = r->comm->point_to_point({P2POp::recv(st.peers[k], bytes_view(in), r->tag)}, r->ctx, p2p);
    } catch (...) {
      fail(std::current_exception());
      finish();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(r->mutex);
      r->parts.push_back(w);
    }
    auto next = weak_chain.lock();
    w->then([state, r, finish, fail, next, k, in, first](const Work& d) {
      State& ours = *state;
      bool more = false;
      try {
        if (d.exception()) std::rethrow_exception(d.exception());
        if (!d.partial()) {
          ours.apply(k, *in, r->codec, r->me, r->ctx);
          more = true;
        }
      } catch (...) {
        fail(std::current_exception());
      }
      if (first && more) {
        std::lock_guard<std::mutex> lock(r->mutex);
        r->arrival_us[k] =
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - r->start).count();
      }
      if (more && next) {
        (*next)(k, Clock::now(), false);
        return;
      }
      finish();
    });
  };
  std::chrono::milliseconds timeout{-1};
  for (size_t k = 0; k < s.peers.size(); ++k) {
    P2POptions p2p;
    p2p.round = s.sent[k] + 1;
    // The round does not wait for its sends to be taken: they are posted,
    // and never dropped (keep_late), so a deadline now completes the batch
    // once they are.
    p2p.deadline = r->start;
    p2p.keep_late = true;
    p2p.priority = options_.priority;
    p2p.label = "CHOCO gossip";
    WorkPtr w;
    try {
      w = comm_->point_to_point({P2POp::send(s.peers[k], bytes_view(q), r->tag)}, ctx, p2p);
    } catch (...) {
      fail(std::current_exception());
      finish();
      continue;
    }
    ++s.sent[k];
    timeout = w->default_timeout();
    {
      std::lock_guard<std::mutex> lock(r->mutex);
      r->parts.push_back(w);
    }
    w->then([fail, finish](const Work& d) {
      if (d.exception()) fail(d.exception());
      finish();
    });
  }
  // The round's Work waits as long as its communicator's operations do.
  r->done =
      std::make_shared<TimedRoundWork>(detail::concat("CHOCO gossip round ", round), timeout, r);
  for (size_t k = 0; k < s.peers.size(); ++k) (*chain)(k, deadlines[k], true);
  WorkPtr done = r->done;
  finish();
  // From here the chains' callbacks own `chain` (through `next`).
  return done;
}

}  // namespace relaxcc
