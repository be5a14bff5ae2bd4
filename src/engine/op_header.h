// The small records that travel with relaxcc's own collectives, so that
// ranks that disagree find out instead of hanging or corrupting memory.
//
//   OpHeader     what a rank is calling: op type, dtype, reduce op, algorithm,
//                sequence number, element count and a hash of the layout;
//                a hash of the caller's further arguments (OpOptions::agree);
//                per edge, what it sends to and expects from that peer;
//                where its buffer lies when it is in node-shared memory.
//   AbortRecord  "I stopped this operation": the origin rank, the reason, and
//                how many data messages the sender had posted to the receiver,
//                so the receiver drains exactly those and no message is left
//                behind in MPI's queues.
//   PoisonNotice "I poisoned this lane": sent by the rank where a lane's
//                poisoning started (a timeout, a transport error) to every
//                other member, on tag kNoticeTag, so they poison it too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "relaxcc/dtype.h"
#include "relaxcc/reduce_op.h"

namespace relaxcc::engine {

enum class OpType : uint8_t {
  allreduce = 1,
  reduce_scatter = 2,
  allgather = 3,
  broadcast = 4,
  alltoall = 5,
  barrier = 6,
};
const char* op_type_name(OpType t) noexcept;

inline constexpr uint32_t kHeaderMagic = 0x43435852;  // "RXCC"
inline constexpr uint8_t kHeaderVersion = 4;
// The header message carries the sender's first data message to this peer
// right after the header (see EdgeOp).
inline constexpr uint8_t kHeaderInlineData = 1;

struct OpHeader {
  uint32_t magic = kHeaderMagic;
  uint8_t version = kHeaderVersion;
  OpType type = OpType::allreduce;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  uint8_t algo = 0;
  uint8_t flags = 0;  // kHeaderInlineData
  uint8_t pad[2] = {0, 0};
  int32_t root = 0;
  uint64_t seq = 0;
  int64_t count = 0;
  uint64_t layout = 0;    // hash of per-rank counts and segment size
  int64_t to_peer = 0;    // elements this rank sends the peer
  int64_t from_peer = 0;  // elements this rank expects from the peer
  // Where the sender's buffer lies in node-shared memory (shm_pid 0: it
  // does not); a ring edge whose sender is shared reads it in place.
  uint32_t shm_pid = 0;
  uint32_t shm_segment = 0;
  uint64_t shm_offset = 0;
  // A shared reduce-scatter's partial sums: the sender's scratch object (from
  // offset 0, same pid); 0 when it has none.
  uint32_t shm_scratch = 0;
  // The lane (RequestPoster::lane_id): a hash of a group's identity (op_header.h's
  // tag windows keep groups apart; this catches what would not).
  uint32_t lane = 0;
  // The caller's OpOptions::agree: arguments of a composite call that this
  // operation does not see (0: none).
  uint64_t agree = 0;
};
static_assert(sizeof(OpHeader) == 88);

// Whether `mine` and `theirs` (received from the peer) describe the same call.
// Symmetric: both ends of an edge reach the same verdict.
bool same_call(const OpHeader& mine, const OpHeader& theirs) noexcept;
// What a rank calls, as a phrase that follows "rank 0 calls": "allreduce #7
// of 1024 x f32 (sum, ring)", "broadcast #3 of 10 x i32 from root 1",
// "alltoall #4 of i32 that sends 3 elements to rank 1 and expects 4 from it".
// `peer` is the rank the header was exchanged with, -1 when unknown ("the
// other rank"). The layout hash is not shown: describe_mismatch says what a
// difference in it means.
std::string describe(const OpHeader& h, int peer = -1);
// The whole disagreement between rank `me`, which sent `mine` to `peer`, and
// `peer`, which sent `theirs`: "rank 0 calls allgather #2 of 12 x f32, rank
// 1 calls allgather #2 of 12 x f32: different per-rank counts". Names every
// field that differs, in terms of the public API. A difference in `agree`
// comes first, named by `agree_what` (OpOptions::agree_what of this rank's
// call): "CompressedAllreduceOptions::shares differ: rank 0 calls ...", so
// that it survives the cut to an AbortRecord's reason.
std::string describe_mismatch(int me, const OpHeader& mine, int peer, const OpHeader& theirs,
                              const std::string& agree_what = {});

// Copies `text` into `dst`, cut to fit, always NUL-terminated.
template <size_t N>
void copy_text(char (&dst)[N], const std::string& text) {
  const size_t n = std::min(text.size(), N - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

enum class AbortKind : int32_t { error = 0, mismatch = 1, poisoned = 2 };

// Why an operation is being aborted: `poisoned` for CommunicatorPoisoned and
// PeerLost (abort hard), `error` otherwise; the message goes to the peers,
// with the lost lane rank of a PeerLost.
struct AbortCause {
  AbortKind kind = AbortKind::error;
  std::string reason = "local error";
  int lost = -1;
};
AbortCause abort_cause(const std::exception_ptr& error);

struct AbortRecord {
  uint32_t magic = kHeaderMagic;
  AbortKind kind = AbortKind::error;
  int32_t origin = -1;  // the rank where the failure started
  int32_t lost = -1;    // the lane rank whose loss failed it (-1: none)
  int64_t sent = 0;     // data messages the sender posted to the receiver
  char reason[232] = {};

  void set_reason(const std::string& text) { copy_text(reason, text); }
};
static_assert(sizeof(AbortRecord) == 256);

// Tag of PoisonNotice messages on the collective communicator; collective
// tags start at 1 and stay below max_tag (heartbeats use max_tag:
// src/engine/heartbeat.h).
inline constexpr int kNoticeTag = 0;

struct PoisonNotice {
  uint32_t magic = kHeaderMagic;
  uint32_t lane = 0;    // OpHeader::lane of the poisoned lane
  int32_t origin = -1;  // lane rank where the poisoning started
  uint32_t window = 0;  // the lane's tag window between the origin and the receiver
  int32_t lost = -1;    // the lane rank whose loss poisoned it (-1: none)
  char reason[236] = {};

  void set_reason(const std::string& text) { copy_text(reason, text); }
};
static_assert(sizeof(PoisonNotice) == 256);

// Tags of the collective communicator. Each lane sends on windows of
// kLaneSeqs sequence numbers (its operations' seq modulo kLaneSeqs), with one
// tag per channel each; Engine::submit refuses a collective operation
// kLaneSeqs or more past the lane's oldest one in flight, so no two
// operations of a window share a tag. A communicator (lane 0) uses window 0
// with every peer. A group uses, with each peer, a window of its own among
// group_windows(max_tag) (windows 1 and up), reserved in the EndpointSet's
// TagWindows (engine.h): no two groups of one EndpointSet that share two
// members hold the same window for that pair while both exist, nor while one
// is among the last TagWindows::kRetired groups of that pair destroyed (its
// late messages stay unmatched). OpHeader::lane (a hash of the group's
// identity) still tells groups apart should that ever fail: PeerMismatch,
// never mixed data.
// An operation's channels have consecutive tags: collective_tag(..., c) is
// collective_tag(..., Channel::header) + c.
enum class Channel : int { header = 0, abort = 1, data = 2 };
inline constexpr uint64_t kLaneSeqs = 4096;
inline constexpr int kTagChannels = static_cast<int>(Channel::data) + 1;  // consecutive tags
// Windows that groups may use (window 1 to this), with tags up to `max_tag`:
// 174,761 with Open MPI's ob1 (2^31 - 1), 681 with UCX (2^23 - 1); 0 when
// the tag space holds one window only (every lane then shares window 0).
inline uint32_t group_windows(int max_tag) {
  const uint64_t span = static_cast<uint64_t>((max_tag - 1) / kTagChannels);
  const uint64_t windows = span / kLaneSeqs;
  return windows > 1 ? static_cast<uint32_t>(windows - 1) : 0;
}
inline int collective_tag(uint32_t window, uint64_t seq, Channel channel, int max_tag) {
  const uint64_t span = static_cast<uint64_t>((max_tag - 1) / kTagChannels);
  const uint64_t index = (window * kLaneSeqs + seq % kLaneSeqs) % span;
  return 1 + static_cast<int>(index * kTagChannels + static_cast<int>(channel));
}

}  // namespace relaxcc::engine
