#include "src/relaxed/peer_mixing.h"

#include "src/relaxed/float_access.h"

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "relaxcc/errors.h"

namespace relaxcc::relaxed {

namespace {
using Clock = std::chrono::steady_clock;

struct MixHeader {
  uint64_t round = 0;
  uint32_t flags = 0;  // kLeftOut
  char what[52] = {};
};
// The sender does not wait for the receiver's tensor this round (a straggler
// to it, adaptive_deadline.h).
constexpr uint32_t kLeftOut = 1;
static_assert(sizeof(MixHeader) == 64);

// What a round keeps until it mixes.
struct Round {
  std::vector<int> recv_from;
  std::vector<double> weights;
  double self_weight = 1;
  MixHeader mine;
  std::vector<std::shared_ptr<MixHeader>> in_headers;
  std::vector<std::shared_ptr<std::vector<unsigned char>>> in_data;
  std::vector<WorkPtr> receives;  // per recv_from
  std::vector<bool> probing;      // per recv_from: a probe's receive, outside the round
  std::vector<int64_t> arrival_us;
  Clock::time_point start;
  std::mutex mutex;
};

TensorView bytes_view(const std::shared_ptr<std::vector<unsigned char>>& v, int64_t numel,
                      DType dtype) {
  return TensorView(v->data(), numel, dtype, Device::host(), v);
}
}  // namespace

WorkPtr mix(Communicator& comm, const TensorView& x, const ExecContext& ctx, const MixPlan& plan,
            const MixCall& call) {
  x.check_valid(call.what.c_str());
  RELAXCC_ENFORCE(is_floating(x.dtype), InvalidArgument, call.what,
                  ": averages floating tensors, got ", dtype_name(x.dtype));
  RELAXCC_ENFORCE(x.device.is_host() && ctx.device.is_host(), Unsupported, call.what,
                  ": host tensors only");
  RELAXCC_ENFORCE(call.round >= 1, InvalidArgument, call.what, ": round ", call.round,
                  ", expected >= 1 (and increasing from call to call)");
  RELAXCC_ENFORCE_EQ(plan.weights.size(), plan.recv_from.size(), InvalidArgument, call.what,
                     ": weights per peer");
  std::string what = call.what;
  std::shared_ptr<std::vector<unsigned char>> payload;
  TensorView data_out = x;
  size_t wire_bytes = x.nbytes();
  if (call.codec) {
    RELAXCC_ENFORCE(x.dtype == DType::f32 && !call.op.after, InvalidArgument, call.what,
                    ": a compressed round takes f32 tensors and no `after` (got ",
                    dtype_name(x.dtype), call.op.after ? ", with after" : "", ")");
    call.codec->validate();
    wire_bytes = kernels::encoded_size(x.numel, *call.codec);
    payload = std::make_shared<std::vector<unsigned char>>(std::max<size_t>(wire_bytes, 1));
    kernels::encode(x, std::as_writable_bytes(std::span(payload->data(), wire_bytes)), *call.codec,
                    ctx);
    data_out = TensorView(payload->data(), static_cast<int64_t>(wire_bytes), DType::u8,
                          Device::host(), payload);
    what = detail::concat(what, " ", kernels::compressor_name(call.codec->kind),
                          static_cast<int>(call.codec->bits));
  }
  auto r = std::make_shared<Round>();
  r->recv_from = plan.recv_from;
  r->weights = plan.weights;
  r->self_weight = plan.self_weight;
  r->start = Clock::now();
  r->mine.round = call.round;
  std::strncpy(r->mine.what, what.c_str(), sizeof(r->mine.what) - 1);

  P2POptions p2p;
  static_cast<OpOptions&>(p2p) = call.op;
  p2p.round = call.round;
  p2p.deadline = call.deadline;
  AdaptiveDeadline* adaptive = p2p.deadline ? nullptr : call.adaptive;
  // Per peer: the options of its send and receive batches, and how this
  // round treats it. The learned wait says by when a peer must have
  // started its round (its header came); one that has gets until the cap
  // for its data, however large its tensor. A probe's receive listens
  // longer, outside the round; the round waits for no send past the wait.
  struct PeerCall {
    P2POptions send, recv;
    bool left_out = false;
    bool probe = false;
  };
  std::map<int, PeerCall> per_peer;
  if (adaptive) {
    adaptive->begin_round(call.round, r->start);
    for (int peer : plan.recv_from) {
      const AdaptiveDeadline::Wait w = adaptive->wait_for(peer, call.round);
      PeerCall c{p2p, p2p, w.straggler, w.probe.count() > 0};
      c.send.deadline = r->start + w.wait;
      c.recv.deadline = r->start + (c.probe ? w.probe : w.wait);
      c.recv.started_deadline = r->start + adaptive->options().cap;
      per_peer[peer] = c;
    }
    for (int peer : plan.send_to) {
      if (per_peer.count(peer)) continue;
      // A peer this rank only sends to: judged by what it knows of it.
      PeerCall c{p2p, p2p, adaptive->straggler(peer), false};
      c.send.deadline =
          r->start + (c.left_out ? std::chrono::microseconds(0) : adaptive->current());
      per_peer[peer] = c;
    }
  }
  const auto options_for = [&](int peer, bool send) {
    const auto it = per_peer.find(peer);
    if (it == per_peer.end()) return p2p;
    return send ? it->second.send : it->second.recv;
  };

  std::vector<WorkPtr> works;
  for (int peer : plan.send_to) {
    auto header = std::make_shared<MixHeader>(r->mine);
    const auto it = per_peer.find(peer);
    if (it != per_peer.end() && it->second.left_out) header->flags |= kLeftOut;
    const TensorView header_out(header.get(), sizeof(MixHeader), DType::u8, Device::host(), header);
    works.push_back(comm.point_to_point(
        {P2POp::send(peer, header_out, call.tag), P2POp::send(peer, data_out, call.tag + 1)}, ctx,
        options_for(peer, true)));
  }
  r->arrival_us.assign(plan.recv_from.size(), -1);
  for (size_t k = 0; k < plan.recv_from.size(); ++k) {
    const int peer = plan.recv_from[k];
    auto header = std::make_shared<MixHeader>();
    auto data = std::make_shared<std::vector<unsigned char>>(std::max<size_t>(wire_bytes, 1));
    r->in_headers.push_back(header);
    r->in_data.push_back(data);
    WorkPtr w = comm.point_to_point(
        {P2POp::recv(peer,
                     TensorView(header.get(), sizeof(MixHeader), DType::u8, Device::host(), header),
                     call.tag),
         P2POp::recv(peer,
                     call.codec ? bytes_view(data, static_cast<int64_t>(wire_bytes), DType::u8)
                                : bytes_view(data, x.numel, x.dtype),
                     call.tag + 1)},
        ctx, options_for(peer, false));
    // The arrival time, for the adaptive deadline.
    const auto it = per_peer.find(peer);
    const bool probe = it != per_peer.end() && it->second.probe;
    AdaptiveDeadline::Guard prober = probe ? adaptive->guard() : AdaptiveDeadline::Guard();
    w->then([r, k, prober, peer](const Work& done) {
      if (done.exception() || done.partial()) return;
      const auto us =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - r->start);
      if (prober) {
        prober([&](AdaptiveDeadline& a) { a.caught_up(peer, us); });
        return;
      }
      std::lock_guard<std::mutex> lock(r->mutex);
      r->arrival_us[k] = us.count();
    });
    r->receives.push_back(w);
    r->probing.push_back(probe);
    // A probe only listens: the round neither waits for it nor mixes it.
    if (!probe) works.push_back(std::move(w));
  }
  RelaxedStats* stats = call.stats;
  std::vector<int> send_to = plan.send_to;
  const bool compressed = call.codec.has_value();
  // The round may complete after the deadline's owner let it go.
  const AdaptiveDeadline::Guard learner = adaptive ? adaptive->guard() : AdaptiveDeadline::Guard();
  const uint64_t round = call.round;
  return when_all(
      std::move(works),
      [r, x, ctx, learner, round, stats, send_to, what, compressed, wire_bytes](Work& result) {
        std::vector<int> arrived, missing, left_out_by;
        std::vector<const void*> inputs;
        std::vector<std::vector<float>> decoded;  // compressed rounds: the peers' tensors
        decoded.reserve(r->recv_from.size());
        std::vector<double> weights;
        double total = r->self_weight;
        for (size_t k = 0; k < r->recv_from.size(); ++k) {
          const int peer = r->recv_from[k];
          if (r->probing[k] || r->receives[k]->partial()) {
            missing.push_back(peer);
            continue;
          }
          const MixHeader& h = *r->in_headers[k];
          RELAXCC_ENFORCE(
              h.round == r->mine.round && std::strncmp(h.what, r->mine.what, sizeof(h.what)) == 0,
              PeerMismatch, what, " round ", r->mine.round, ": rank ", peer, " calls '",
              std::string(h.what, strnlen(h.what, sizeof(h.what))), "' round ", h.round,
              ", this rank '", r->mine.what, "'");
          arrived.push_back(peer);
          if (h.flags & kLeftOut) left_out_by.push_back(peer);
          if (compressed) {
            decoded.emplace_back(static_cast<size_t>(x.numel));
            kernels::decode(std::as_bytes(std::span(r->in_data[k]->data(), wire_bytes)),
                            TensorView::host(decoded.back().data(), x.numel), ctx);
            inputs.push_back(decoded.back().data());
          } else {
            inputs.push_back(r->in_data[k]->data());
          }
          weights.push_back(r->weights[k]);
          total += r->weights[k];
        }
        // Nobody weighted arrived (a zero self weight, every peer late): x
        // stays as it is.
        if (total > 0)
          visit_averaged(x.dtype, [&](auto tag) {
            using T = decltype(tag);
            T* out = x.as<T>();
            for (int64_t i = 0; i < x.numel; ++i) {
              double acc = r->self_weight * load(out, i);
              for (size_t k = 0; k < inputs.size(); ++k)
                acc += weights[k] * load(static_cast<const T*>(inputs[k]), i);
              store(out, i, acc / total);
            }
          });
        if (learner)
          learner([&](AdaptiveDeadline& a) {
            std::lock_guard<std::mutex> lock(r->mutex);
            for (size_t k = 0; k < r->recv_from.size(); ++k) {
              if (r->arrival_us[k] >= 0 && !r->probing[k] && !r->receives[k]->partial())
                a.observe(r->recv_from[k], std::chrono::microseconds(r->arrival_us[k]));
              else
                a.missed(r->recv_from[k], round);
            }
          });
        if (stats)
          stats->add_round(send_to, wire_bytes + sizeof(MixHeader), arrived,
                           wire_bytes + sizeof(MixHeader), missing, left_out_by);
        result.set_contributions(std::move(arrived), std::move(missing));
      },
      detail::concat(call.what, " round ", call.round, detail::of_label(call.op.label)));
}

}  // namespace relaxcc::relaxed
