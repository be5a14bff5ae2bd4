#include "relaxcc/relaxed/choco_gossip.h"

#include <atomic>
#include <cstddef>
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
  std::atomic<bool> busy{false};
};

namespace {
using Bytes = std::vector<std::byte>;

TensorView f32_view(std::vector<float>& v) {
  return TensorView::host(v.data(), static_cast<int64_t>(v.size()));
}
}  // namespace

ChocoGossip::ChocoGossip(CommunicatorPtr comm, int64_t numel, ChocoOptions options)
    : comm_(std::move(comm)), options_(options), state_(std::make_shared<State>()) {
  RELAXCC_ENFORCE(comm_ != nullptr, InvalidArgument, "ChocoGossip: null communicator");
  RELAXCC_ENFORCE(numel >= 0, InvalidArgument, "ChocoGossip: negative element count ", numel);
  RELAXCC_ENFORCE(options_.gamma > 0 && options_.gamma <= 1, InvalidArgument,
                  "ChocoGossip: gamma = ", options_.gamma, ", expected in (0, 1]");
  RELAXCC_ENFORCE(options_.tag >= 0 && options_.tag <= comm_->max_p2p_tag(), InvalidArgument,
                  "ChocoGossip: tag ", options_.tag, " outside [0, ", comm_->max_p2p_tag(), "]");
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
}

WorkPtr ChocoGossip::step(const TensorView& x, uint64_t round, const ExecContext& ctx) {
  relaxed::require_host("ChocoGossip", comm_->rank(), x, ctx);
  x.check_valid("ChocoGossip x");
  RELAXCC_ENFORCE(x.dtype == DType::f32 && x.numel == state_->numel, InvalidArgument,
                  "ChocoGossip: expected ", state_->numel, " x f32, got ", x.numel, " x ",
                  dtype_name(x.dtype));
  RELAXCC_ENFORCE(round >= 1, InvalidArgument, "ChocoGossip: round ", round, ", expected >= 1");
  RELAXCC_ENFORCE(!state_->busy.exchange(true), InvalidArgument,
                  "ChocoGossip: a round is still in flight (wait for its Work first)");
  State& s = *state_;
  const int64_t n = s.numel;
  // q = Q(x - x_hat_i); x_hat_i += D(q) once the exchange succeeded.
  std::vector<float> diff(static_cast<size_t>(n));
  const float* xs = x.as<float>();
  for (int64_t i = 0; i < n; ++i) diff[i] = xs[i] - s.own[i];
  const size_t payload = kernels::encoded_size(n, options_.codec);
  auto q = std::make_shared<Bytes>(payload);
  ExecContext round_ctx = ctx;
  round_ctx.rng.offset = ctx.rng.offset + round * static_cast<uint64_t>(n);
  try {
    kernels::encode(f32_view(diff), *q, options_.codec, round_ctx);
  } catch (...) {
    s.busy = false;
    throw;
  }
  std::vector<P2POp> ops;
  const TensorView q_view(q->data(), static_cast<int64_t>(payload), DType::u8, Device::host(), q);
  std::vector<std::shared_ptr<Bytes>> in;
  for (int peer : s.peers) ops.push_back(P2POp::send(peer, q_view, options_.tag));
  for (int peer : s.peers) {
    auto buf = std::make_shared<Bytes>(payload);
    in.push_back(buf);
    ops.push_back(P2POp::recv(
        peer,
        TensorView(buf->data(), static_cast<int64_t>(payload), DType::u8, Device::host(), buf),
        options_.tag));
  }
  P2POptions p2p;
  p2p.round = round;
  p2p.priority = options_.priority;
  p2p.label = "CHOCO gossip";
  WorkPtr w;
  try {
    w = comm_->point_to_point(ops, ctx, p2p);
  } catch (...) {
    s.busy = false;
    throw;
  }
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
    // Every neighbour's codec is checked against this one before any copy moves.
    for (size_t k = 0; k < st.peers.size(); ++k) {
      const kernels::PayloadHeader h = kernels::read_header(*in[k]);
      RELAXCC_ENFORCE(h.kind == codec.kind && h.bits == codec.bits && h.chunk == codec.chunk,
                      PeerMismatch, "ChocoGossip on rank ", me, ": rank ", st.peers[k],
                      " compresses with ", kernels::compressor_name(h.kind), " (", int(h.bits),
                      " bits, chunk ", h.chunk, "), this rank with ",
                      kernels::compressor_name(codec.kind), " (", codec.bits, " bits, chunk ",
                      codec.chunk, ")");
    }
    // x_hat_i += D(q_i), x_hat_j += D(q_j).
    kernels::decode_accumulate(*q, f32_view(st.own), ctx);
    for (size_t k = 0; k < st.peers.size(); ++k)
      kernels::decode_accumulate(*in[k], f32_view(st.theirs[k]), ctx);
    // x_i += gamma * sum_j w_ij (x_hat_j - x_hat_i).
    float* out = x.as<float>();
    for (int64_t i = 0; i < st.numel; ++i) {
      double correction = 0;
      for (size_t k = 0; k < st.peers.size(); ++k)
        correction += st.weights[k] * (static_cast<double>(st.theirs[k][i]) - st.own[i]);
      out[i] = static_cast<float>(out[i] + gamma * correction);
    }
    if (stats) stats->add_round(st.peers, payload, st.peers, payload);
  });
}

}  // namespace relaxcc
