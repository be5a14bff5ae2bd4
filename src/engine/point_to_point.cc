#include "src/engine/point_to_point.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>

#include "relaxcc/errors.h"
#include "src/engine/op_header.h"

namespace relaxcc::engine {

namespace {
constexpr uint32_t kRoundMagic = 0x44525852;  // "RXRD"
// Messages of later rounds kept per stream; beyond it the oldest is dropped.
constexpr size_t kMaxEarly = 64;
// The largest round message a header may announce (beyond: corrupt).
constexpr uint64_t kMaxRoundBytes = uint64_t{1} << 40;

// The round of a round message, or 0 when it is too short or not one.
uint64_t round_of(const unsigned char* message, size_t bytes, RoundHeader* header) {
  if (bytes < sizeof(RoundHeader)) return 0;
  std::memcpy(header, message, sizeof(RoundHeader));
  return header->magic == kRoundMagic ? header->round : 0;
}

// Keeps a message of a later round for the receive of its round.
void keep_early(RequestPoster& t, RoundStream& stream, uint64_t round, ScratchPool::Buffer message,
                size_t bytes) {
  if (stream.early.size() >= kMaxEarly) {
    stream.early.pop_front();
    t.count_late();
  }
  stream.early.push_back(EarlyMessage{round, std::move(message), bytes});
}
}  // namespace

bool receive_round_parts(RequestPoster& t, Operation& op, int64_t slot, RoundStream& stream,
                         int peer, int tag, ScratchPool::Buffer& first, size_t got,
                         RoundParts& parts) {
  RoundHeader h;
  if (round_of(first.data(), got, &h) == 0 || h.part_bytes == 0 || h.dtype >= kNumDTypes ||
      h.count < 0)
    return false;
  const uint64_t size = dtype_size(static_cast<DType>(h.dtype));
  if (static_cast<uint64_t>(h.count) > kMaxRoundBytes / size) return false;
  const uint64_t data = static_cast<uint64_t>(h.count) * size;
  if (h.part_bytes < kMinRoundPartBytes || data <= h.part_bytes ||
      got != sizeof(RoundHeader) + h.part_bytes)
    return false;
  const uint64_t more = (data - 1) / h.part_bytes;  // parts after the first
  if (more >= kMaxRoundParts) return false;
  parts.bytes = sizeof(RoundHeader) + data;
  parts.message = t.scratch(parts.bytes);
  std::memcpy(parts.message.data(), first.data(), got);
  first = {};
  parts.left = static_cast<int64_t>(more);
  for (uint64_t m = 1; m <= more; ++m) {
    const size_t begin = sizeof(RoundHeader) + m * h.part_bytes;
    const size_t end = std::min<size_t>(begin + h.part_bytes, parts.bytes);
    t.irecv(op, slot, parts.message.data() + begin, end - begin, peer,
            p2p_tag(tag, P2PChannel::round), false);
    ++stream.matched;
  }
  return true;
}

P2PBatchOp::P2PBatchOp(std::vector<P2POp> ops, const P2POptions& options,
                       std::vector<int64_t> part_bytes)
    : Operation("point_to_point", options.priority),
      ops_(std::move(ops)),
      headers_(ops_.size()),
      label_(options.label),
      round_(options.round),
      deadline_(options.deadline),
      started_deadline_(options.started_deadline),
      keep_late_(options.keep_late),
      part_bytes_(std::move(part_bytes)),
      parts_(ops_.size()),
      buffers_(ops_.size()),
      pending_(ops_.size(), 0),
      recv_state_(ops_.size(), RecvState::waiting),
      dropped_(ops_.size(), false),
      streams_(ops_.size(), nullptr) {
  // At most kMaxRoundParts parts, or the receiver takes the header for corrupt.
  for (size_t i = 0; i < ops_.size(); ++i)
    if (part_bytes_[i] > 0)
      part_bytes_[i] = std::max<int64_t>(
          part_bytes_[i],
          static_cast<int64_t>((ops_[i].tensor.nbytes() + kMaxRoundParts - 1) / kMaxRoundParts));
}

P2PBatchOp::~P2PBatchOp() {
  // Dropped before its receives settled (engine shutdown): leave the streams.
  for (size_t i = 0; i < ops_.size(); ++i)
    if (streams_[i] != nullptr && recv_state_[i] <= RecvState::receiving)
      settle(i, RecvState::missing);
}

std::string P2PBatchOp::where(size_t i) const {
  const P2POp& op = ops_[i];
  return detail::concat("point_to_point", detail::of_label(label_),
                        op.kind == P2POp::Kind::send ? ": send to rank " : ": receive from rank ",
                        op.peer, " (tag ", op.tag,
                        rounds() ? detail::concat(", round ", round_) : std::string(), ")");
}

void P2PBatchOp::start(RequestPoster& t) {
  started_ = true;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const P2POp& op = ops_[i];
    const auto index = static_cast<int64_t>(i);
    if (rounds()) {
      if (op.kind == P2POp::Kind::send) {
        // One message, or parts (send_part): the header and a copy of the data.
        const bool parted =
            part_bytes_[i] > 0 && op.tensor.nbytes() > static_cast<size_t>(part_bytes_[i]);
        const RoundHeader h{kRoundMagic, static_cast<uint8_t>(op.tensor.dtype),
                            {0, 0, 0},   op.tensor.numel,
                            round_,      parted ? static_cast<uint64_t>(part_bytes_[i]) : 0};
        buffers_[i] = t.scratch(sizeof(h) + op.tensor.nbytes());
        std::memcpy(buffers_[i].data(), &h, sizeof(h));
        if (op.tensor.nbytes() > 0)
          std::memcpy(buffers_[i].data() + sizeof(h), op.tensor.data, op.tensor.nbytes());
      } else {
        streams_[i] = &t.round_stream(op.peer, op.tag);
        streams_[i]->receivers.push_back(&ops_[i]);
        ++unsettled_;
      }
      continue;
    }
    if (op.kind == P2POp::Kind::send) {
      headers_[i] =
          Wire{kHeaderMagic, static_cast<uint8_t>(op.tensor.dtype), {0, 0, 0}, op.tensor.numel};
      t.isend(*this, index * 2, &headers_[i], sizeof(Wire), op.peer,
              p2p_tag(op.tag, P2PChannel::header), false);
    } else {
      t.irecv(*this, index * 2, &headers_[i], sizeof(Wire), op.peer,
              p2p_tag(op.tag, P2PChannel::header), false);
    }
    ++outstanding_;
    ++pending_[i];
  }
  post_data_sends(t);
  if (rounds()) progress(t);
}

void P2PBatchOp::progress(RequestPoster& t) {
  if (aborted_) return;
  if (rounds() && deadline_ && !deadline_passed_ && !done() && Clock::now() >= *deadline_) {
    // What came by the deadline counts: while a receive that had begun by
    // then is arriving or arrived, the batch waits until started_deadline.
    if (started_deadline_ && begun_.empty()) {
      take_arrived(t);
      begun_.resize(ops_.size());
      for (size_t i = 0; i < ops_.size(); ++i) begun_[i] = begun(i);
    }
    if (aborted_ || done()) return;
    if (!started_deadline_ || Clock::now() >= *started_deadline_ || !still_begun()) {
      deadline_passed_ = true;
      abandon_receives(t);
      drop_unstarted_sends();
    }
  }
  post_data_sends(t);
  if (rounds() && !deadline_passed_) take_arrived(t);
}

void P2PBatchOp::drop_unstarted_sends() {
  // A peer that has a message of this batch gets the rest of it, posted at
  // once: its batch has begun, and would wait for the rest until its
  // started_deadline (or drops it as late, if it gave up).
  if (keep_late_) return;
  std::vector<int> started;
  for (size_t i = 0; i < next_data_send_; ++i)
    if (ops_[i].kind == P2POp::Kind::send) started.push_back(ops_[i].peer);
  for (size_t i = next_data_send_; i < ops_.size(); ++i)
    if (ops_[i].kind == P2POp::Kind::send &&
        std::find(started.begin(), started.end(), ops_[i].peer) == started.end()) {
      dropped_[i] = true;
      buffers_[i] = {};
    }
}

bool P2PBatchOp::begun(size_t i) const {
  if (streams_[i] == nullptr) return false;
  if (recv_state_[i] == RecvState::arrived) return true;
  if (recv_state_[i] != RecvState::receiving) return false;
  // A message in parts whose first part came: its header names its round.
  // One still arriving whole names none yet: it counts until it is sorted.
  RoundHeader h;
  return parts_[i].left == 0 || round_of(parts_[i].message.data(), parts_[i].bytes, &h) == round_;
}

bool P2PBatchOp::still_begun() const {
  // Not a message taken after the deadline (an older round's, once sorted,
  // sends its receive back to waiting: begun_ forgets it).
  for (size_t i = 0; i < ops_.size(); ++i)
    if (begun_[i] && begun(i)) return true;
  return false;
}

void P2PBatchOp::take_arrived(RequestPoster& t) {
  for (size_t i = 0; i < ops_.size() && !aborted_; ++i)
    if (streams_[i] != nullptr && recv_state_[i] == RecvState::waiting &&
        streams_[i]->receivers.front() == &ops_[i])
      take_next(t, i);
}

int64_t P2PBatchOp::send_parts(size_t i) const {
  const size_t bytes = ops_[i].tensor.nbytes();
  const auto part = static_cast<size_t>(part_bytes_[i]);
  if (!rounds() || part == 0 || bytes <= part) return 1;
  return static_cast<int64_t>((bytes - 1) / part + 1);
}

std::pair<size_t, size_t> P2PBatchOp::send_part(size_t i, int64_t m) const {
  const size_t end = sizeof(RoundHeader) + ops_[i].tensor.nbytes();
  if (send_parts(i) == 1) return {0, end};
  const auto part = static_cast<size_t>(part_bytes_[i]);
  const size_t begin = m == 0 ? 0 : sizeof(RoundHeader) + static_cast<size_t>(m) * part;
  return {begin, std::min(end, sizeof(RoundHeader) + static_cast<size_t>(m + 1) * part)};
}

void P2PBatchOp::post_data_sends(RequestPoster& t) {
  for (; next_data_send_ < ops_.size(); ++next_data_send_) {
    const size_t i = next_data_send_;
    const P2POp& op = ops_[i];
    if (op.kind != P2POp::Kind::send || dropped_[i]) continue;
    // Past the deadline the sends kept go at once: the Work completes then.
    if (data_sends_in_flight_ > 0 && !deadline_passed_ && t.throttled(*this)) return;
    // A message in parts goes whole, its parts back to back: parts of two
    // messages on one stream never interleave, a deadline never cuts one,
    // and its buffer is released only once every part completed.
    const auto slot = static_cast<int64_t>(i) * 2 + 1;
    for (int64_t m = 0; m < send_parts(i); ++m) {
      if (rounds()) {
        const auto [begin, end] = send_part(i, m);
        t.isend(*this, slot, buffers_[i].data() + begin, end - begin, op.peer,
                p2p_tag(op.tag, P2PChannel::round), false);
      } else {
        t.isend(*this, slot, op.tensor.data, op.tensor.nbytes(), op.peer,
                p2p_tag(op.tag, P2PChannel::data), false);
      }
      ++outstanding_;
      ++pending_[i];
      ++data_sends_in_flight_;
    }
  }
}

bool P2PBatchOp::done() const {
  if (!started_) return false;
  if (aborted_) return true;
  const bool posted = next_data_send_ == ops_.size();
  const bool sent = data_sends_in_flight_ == 0 && posted;
  // Past the deadline, sends still in flight stay with the engine.
  if (rounds()) return unsettled_ == 0 && (sent || (deadline_passed_ && posted));
  return outstanding_ == 0 && sent;
}

void P2PBatchOp::take_next(RequestPoster& t, size_t i) {
  RoundStream& stream = *streams_[i];
  while (!stream.early.empty()) {
    EarlyMessage& e = stream.early.front();
    if (e.round < round_) {
      stream.early.pop_front();
      t.count_late();
      continue;
    }
    if (e.round > round_) {
      settle(i, RecvState::missing);  // the peer skipped this round
      return;
    }
    buffers_[i] = std::move(e.message);
    const size_t bytes = e.bytes;
    stream.early.pop_front();
    recv_state_[i] = RecvState::receiving;
    on_round_message(t, i, bytes);
    return;
  }
  if (stream.matched > 0) return;  // an older message is still arriving
  const P2POp& op = ops_[i];
  Message message;
  size_t bytes = 0;
  if (!t.improbe(op.peer, p2p_tag(op.tag, P2PChannel::round), &message, &bytes, false)) return;
  buffers_[i] = t.scratch(std::max<size_t>(bytes, 1));
  t.imrecv(*this, static_cast<int64_t>(i) * 2, buffers_[i].data(), bytes, &message, op.peer);
  ++stream.matched;
  ++outstanding_;
  ++pending_[i];
  recv_state_[i] = RecvState::receiving;
}

void P2PBatchOp::on_round_message(RequestPoster& t, size_t i, size_t bytes) {
  const P2POp& op = ops_[i];
  RoundHeader h;
  const uint64_t round = round_of(buffers_[i].data(), bytes, &h);
  const bool mine = recv_state_[i] == RecvState::receiving;  // not abandoned meanwhile
  if (round == 0 || h.dtype >= kNumDTypes || h.count < 0 ||
      bytes != sizeof(RoundHeader) +
                   static_cast<size_t>(h.count) * dtype_size(static_cast<DType>(h.dtype))) {
    buffers_[i] = {};
    if (!mine) return;
    set_error(std::make_exception_ptr(
        CorruptPayload(detail::concat(where(i), ": corrupt round message of ", bytes, " bytes"),
                       __FILE__, __LINE__)));
    settle(i, RecvState::missing);
    return;
  }
  RoundStream& stream = *streams_[i];
  // A message taken for a receive abandoned meanwhile may be the one the
  // stream's sweeper waits for.
  if (!mine && round >= stream.abandoned) stream.abandoned = 0;
  if (round > round_ || (!mine && keep_late_ && round == round_)) {
    keep_early(t, stream, round, std::move(buffers_[i]), bytes);
    if (mine) settle(i, RecvState::missing);
    return;
  }
  if (round < round_ || !mine) {
    buffers_[i] = {};
    t.count_late();
    if (mine) {
      recv_state_[i] = RecvState::waiting;  // probe for the next one
      if (!begun_.empty()) begun_[i] = false;
    }
    return;
  }
  const auto dtype = static_cast<DType>(h.dtype);
  if (dtype != op.tensor.dtype || h.count != op.tensor.numel) {
    set_error(std::make_exception_ptr(PeerMismatch(
        detail::concat(where(i), ": expected ", op.tensor.numel, " elements of ", op.tensor.dtype,
                       ", the sender sent ", h.count, " elements of ", dtype),
        __FILE__, __LINE__)));
    settle(i, RecvState::missing);
  } else {
    if (op.tensor.nbytes() > 0)
      std::memcpy(op.tensor.data, buffers_[i].data() + sizeof(RoundHeader), op.tensor.nbytes());
    settle(i, RecvState::arrived);
  }
  buffers_[i] = {};
}

void P2PBatchOp::settle(size_t i, RecvState state) {
  recv_state_[i] = state;
  auto& receivers = streams_[i]->receivers;
  receivers.erase(std::find(receivers.begin(), receivers.end(), &ops_[i]));
  --unsettled_;
}

void P2PBatchOp::abandon_receives(RequestPoster& t) {
  const auto until = Clock::now() + std::chrono::milliseconds(t.tunables().timeout_ms);
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (streams_[i] == nullptr || recv_state_[i] > RecvState::receiving) continue;
    RoundStream& stream = *streams_[i];
    settle(i, RecvState::missing);
    if (keep_late_) continue;  // its message stays for the next receive of its round
    stream.abandoned = std::max(stream.abandoned, round_);
    stream.sweep_until = until;
    if (!stream.sweeping && stream.receivers.empty() && !t.poisoned()) {
      stream.sweeping = true;
      t.spawn(*this, std::make_shared<RoundSweeper>(stream, ops_[i].peer, ops_[i].tag));
    }
  }
}

void P2PBatchOp::on_complete(RequestPoster& t, int64_t slot, const Completion& completion) {
  int error = completion.error;
  --outstanding_;
  const auto i = static_cast<size_t>(slot / 2);
  const bool is_header = slot % 2 == 0;
  const P2POp& op = ops_[i];
  --pending_[i];
  if (op.kind == P2POp::Kind::send && !is_header) --data_sends_in_flight_;
  if (rounds() && op.kind == P2POp::Kind::recv) {
    --streams_[i]->matched;
    // A later part of a round message: the message is whole with its last.
    RoundParts& parts = parts_[i];
    if (parts.left > 0) {
      if (parts.error == 0) parts.error = error;
      if (!round_part_arrived(parts)) return;
      error = parts.error;
    }
  }
  if (error != 0) {
    set_error(std::make_exception_ptr(PeerLost(
        op.peer, detail::concat(where(i), ": ", t.error_string(error)), __FILE__, __LINE__)));
    if (streams_[i] != nullptr && recv_state_[i] == RecvState::receiving)
      settle(i, RecvState::missing);
    parts_[i] = {};
    return;
  }
  if (rounds()) {
    if (op.kind == P2POp::Kind::send) {
      if (pending_[i] == 0) buffers_[i] = {};  // every part went (posted together)
      return;
    }
    size_t bytes = 0;
    if (parts_[i].message.size() > 0) {
      buffers_[i] = std::move(parts_[i].message);
      bytes = parts_[i].bytes;
      parts_[i] = {};
    } else {
      bytes = completion.bytes;
      if (receive_round_parts(t, *this, slot, *streams_[i], op.peer, op.tag, buffers_[i], bytes,
                              parts_[i])) {
        outstanding_ += static_cast<int>(parts_[i].left);
        pending_[i] += static_cast<int>(parts_[i].left);
        return;
      }
    }
    on_round_message(t, i, bytes);
    return;
  }
  if (!completion.cancelled) on_plain_complete(t, i, is_header, error);
}

void P2PBatchOp::on_plain_complete(RequestPoster& t, size_t i, bool is_header, int) {
  const P2POp& op = ops_[i];
  if (op.kind != P2POp::Kind::recv || !is_header || aborted_) return;
  const Wire& h = headers_[i];
  const auto index = static_cast<int64_t>(i);
  const int data_tag = p2p_tag(op.tag, P2PChannel::data);
  if (h.magic != kHeaderMagic || h.dtype >= kNumDTypes || h.count < 0) {
    // The data message's size is unknown: leave it; report the corruption.
    set_error(std::make_exception_ptr(
        CorruptPayload(where(i) + ": corrupt message header", __FILE__, __LINE__)));
    return;
  }
  const auto dtype = static_cast<DType>(h.dtype);
  if (dtype == op.tensor.dtype && h.count == op.tensor.numel) {
    t.irecv(*this, index * 2 + 1, op.tensor.data, op.tensor.nbytes(), op.peer, data_tag, false);
  } else {
    set_error(std::make_exception_ptr(PeerMismatch(
        detail::concat(where(i), ": expected ", op.tensor.numel, " elements of ", op.tensor.dtype,
                       ", the sender sent ", h.count, " elements of ", dtype),
        __FILE__, __LINE__)));
    const size_t bytes = static_cast<size_t>(h.count) * dtype_size(dtype);
    buffers_[i] = t.scratch(bytes);
    t.irecv(*this, index * 2 + 1, buffers_[i].data(), bytes, op.peer, data_tag, false);
  }
  ++outstanding_;
  ++pending_[i];
}

void P2PBatchOp::abort(RequestPoster& t, std::exception_ptr error) {
  set_error(std::move(error));
  if (rounds()) {
    abandon_receives(t);
  } else {
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].kind != P2POp::Kind::recv) continue;
      t.cancel_receives(*this, static_cast<int64_t>(i) * 2);
      t.cancel_receives(*this, static_cast<int64_t>(i) * 2 + 1);
    }
  }
  // Sends cannot be cancelled: their requests stay parked in the engine.
  aborted_ = true;
}

std::string P2PBatchOp::waiting_for() const {
  // The sends and receives not completed yet (a send not posted yet counts).
  std::ostringstream os;
  const char* sep = "";
  for (size_t i = 0; i < ops_.size(); ++i) {
    const P2POp& op = ops_[i];
    const bool unposted = op.kind == P2POp::Kind::send && i >= next_data_send_ && !dropped_[i];
    const bool unsettled = streams_[i] != nullptr && recv_state_[i] <= RecvState::receiving;
    if (pending_[i] == 0 && !unposted && !unsettled) continue;
    os << sep << (op.kind == P2POp::Kind::send ? "send to rank " : "receive from rank ") << op.peer
       << " (tag " << op.tag << (rounds() ? detail::concat(", round ", round_) : std::string())
       << (unposted ? ", held back: not posted yet" : "") << ")";
    sep = ", ";
  }
  return os.str();
}

void P2PBatchOp::report(Work& work) const {
  std::vector<int> contributors;
  std::vector<int> missing;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].kind != P2POp::Kind::recv) continue;
    const bool arrived = rounds() ? recv_state_[i] == RecvState::arrived : !error();
    (arrived ? contributors : missing).push_back(ops_[i].peer);
  }
  if (error()) missing.clear();  // a failed batch reports its error, not a partial result
  work.set_contributions(std::move(contributors), std::move(missing));
}

// ---- RoundSweeper ------------------------------------------------------------

RoundSweeper::RoundSweeper(RoundStream& stream, int peer, int tag)
    : Operation("round sweeper", INT_MIN), stream_(stream), peer_(peer), tag_(tag) {}

void RoundSweeper::start(RequestPoster&) {
  stream_.sweeping = true;
}

void RoundSweeper::finish() {
  if (!finished_) stream_.sweeping = false;
  finished_ = true;
}

void RoundSweeper::progress(RequestPoster& t) {
  // An abandoned receive's message still arriving: the next one follows it.
  if (finished_ || receiving_ || stream_.matched > 0) return;
  if (stream_.abandoned == 0 || !stream_.receivers.empty() || t.poisoned() ||
      Clock::now() > stream_.sweep_until) {
    finish();
    return;
  }
  Message message;
  size_t bytes = 0;
  if (!t.improbe(peer_, p2p_tag(tag_, P2PChannel::round), &message, &bytes, false)) return;
  buffer_ = t.scratch(std::max<size_t>(bytes, 1));
  t.imrecv(*this, 0, buffer_.data(), bytes, &message, peer_);
  ++stream_.matched;
  receiving_ = true;
}

void RoundSweeper::on_complete(RequestPoster& t, int64_t, const Completion& completion) {
  const int error = completion.error;
  --stream_.matched;
  bool failed = error != 0;
  size_t got = 0;
  if (parts_.left > 0) {
    if (parts_.error == 0) parts_.error = error;
    if (!round_part_arrived(parts_)) return;
    failed = parts_.error != 0;
    got = parts_.bytes;
    buffer_ = std::move(parts_.message);
    parts_ = {};
  } else if (!failed) {
    got = completion.bytes;
    if (receive_round_parts(t, *this, 0, stream_, peer_, tag_, buffer_, got, parts_)) return;
  }
  receiving_ = false;
  if (failed || finished_) {
    buffer_ = {};
    finish();
    return;
  }
  RoundHeader h;
  const uint64_t round = round_of(buffer_.data(), got, &h);
  if (round > stream_.abandoned) {
    keep_early(t, stream_, round, std::move(buffer_), static_cast<size_t>(got));
  } else {
    buffer_ = {};
    t.count_late();
  }
  // Every message of the abandoned rounds is gone once its last one (or a
  // later one) came.
  if (round >= stream_.abandoned) {
    stream_.abandoned = 0;
    finish();
  }
}

}  // namespace relaxcc::engine
