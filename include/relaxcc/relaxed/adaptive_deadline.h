// AdaptiveDeadline: how long a relaxed round (gossip, group averaging,
// asynchronous averaging) waits for each of its peers, learned per peer
// from when their messages arrived, so that a peer slow from its first step
// never sets the deadline (hivemind issue #676 asks for learned deadlines).
//
// Per peer it keeps the last `window` arrival times (from the start of this
// rank's round to the arrival of the peer's whole message) and how many of
// its rounds in a row it missed. The deadline of a round:
//   - is set by the fastest quorum of the peers: the ceil(quorum * P) peers
//     with the lowest median arrival, P the peers this rank has exchanged
//     with; their pooled arrivals give median + k * MAD. Once this rank has
//     met most of its peers, a minority of slow ones never enters it (before,
//     the few peers met so far set it);
//   - is clamped to [floor, cap]; the floor is floor_fraction of the
//     measured interval between this rank's rounds (its step), and at least
//     min_floor, so that it scales with the step rather than being a fixed
//     time that a short step cannot afford;
//   - before any arrival was seen is `cap` (the first round waits for its
//     peers; one arrival of any peer is enough to set it).
// A peer that missed its deadline in `straggler_misses` rounds in a row is a
// straggler: rounds do not wait for it (wait 0: its message is taken if it
// is already there, or has begun to arrive, when the round starts), and
// every probe_interval-th round with it probes it without waiting: its
// message is listened for in the background for four round intervals
// (steps). A peer behind by rounds misses every probe and costs nothing; a
// healthy peer that only fell behind in phase (after a hiccup, or a round
// that waited for a straggler) is heard within them, and the next round
// with it waits once for that lag (caught_up), which brings the two back in
// phase. Any arrival on time ends the straggler state: a peer contributes
// whenever it is on time. The rounds apply the wait to the start of a
// peer's message: a peer whose message has begun to arrive by then is
// waited for until `cap` (peer_mixing) and sampled at its whole arrival.
// Thread-safe: rounds observe from the engine thread while callers plan.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace relaxcc {

struct AdaptiveDeadlineOptions {
  double k = 3.0;
  // Fraction of the peers, in (0, 1], whose arrivals set the deadline.
  double quorum = 0.5;
  // The floor: this fraction, in [0, 1], of the median interval between
  // this rank's rounds, and at least min_floor.
  double floor_fraction = 0.1;
  std::chrono::microseconds min_floor{5000};
  std::chrono::microseconds cap{std::chrono::seconds(2)};
  int window = 16;           // arrivals kept per peer, and round intervals
  int straggler_misses = 2;  // missed rounds in a row that make a straggler
  int probe_interval = 8;    // a straggler's rounds per full-deadline probe
};

class AdaptiveDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  // Throws InvalidArgument for k < 0, quorum outside (0, 1], floor_fraction
  // outside [0, 1], min_floor < 0, cap < min_floor, or window,
  // straggler_misses or probe_interval < 1.
  explicit AdaptiveDeadline(AdaptiveDeadlineOptions options = {});
  ~AdaptiveDeadline();
  AdaptiveDeadline(const AdaptiveDeadline&) = delete;
  AdaptiveDeadline& operator=(const AdaptiveDeadline&) = delete;

  // Round `round` starts at `start`. The first start of each higher round
  // number measures the interval between rounds (the floor's step); starts
  // of a round number already seen (other tensors of the same round) do not.
  void begin_round(uint64_t round, Clock::time_point start);

  struct Wait {
    std::chrono::microseconds wait{0};  // after the round's start
    bool straggler = false;             // this round leaves the peer out (wait 0)
    // > 0: a probe; listen for the peer's message this long after the
    // round's start, without the round waiting for it.
    std::chrono::microseconds probe{0};
  };
  // The wait for `peer` in round `round`, which starts now. Every call of
  // one round number (its tensors) gets the same answer: a round counts
  // once towards a straggler's next probe, and a catch-up wait serves all
  // of its round.
  Wait wait_for(int peer, uint64_t round);
  // The deadline of peers on time.
  std::chrono::microseconds current() const;
  std::chrono::microseconds floor() const;
  // `peer`'s whole message came `arrival` after the round's start.
  void observe(int peer, std::chrono::microseconds arrival);
  // `peer` was left out of round `round` (its message had not begun by its
  // wait); counted once per round number.
  void missed(int peer, uint64_t round);
  // A probe heard `peer`'s message `arrival` after the round's start: the
  // next round with it waits for that lag (and the deadline) once.
  void caught_up(int peer, std::chrono::microseconds arrival);
  // Runs a function on this AdaptiveDeadline if it still lives, for the
  // callbacks of rounds that may complete after it is gone (then nothing).
  using Guard = std::function<void(const std::function<void(AdaptiveDeadline&)>&)>;
  Guard guard();
  bool straggler(int peer) const;

  struct PeerRecord {
    int peer = 0;
    int64_t arrived = 0;   // rounds it contributed to
    int64_t left_out = 0;  // rounds (of each tensor) that went on without it
    bool straggler = false;
    std::chrono::microseconds median{0};  // of its kept arrivals (0: none)
  };
  // Every peer seen, by rank.
  std::vector<PeerRecord> peers() const;
  const AdaptiveDeadlineOptions& options() const noexcept { return options_; }

 private:
  struct Peer {
    std::vector<int64_t> samples;  // ring buffer of the last `window` arrivals, in us
    size_t next = 0;
    int misses_in_row = 0;
    int64_t straggler_rounds = 0;
    int64_t catch_up = 0;     // us: the next round's wait, once (0: none)
    uint64_t wait_round = 0;  // the last round asked, and its answer
    Wait wait;
    uint64_t miss_round = 0;  // the last round counted missed
    int64_t arrived = 0, left_out = 0;
  };
  std::chrono::microseconds current_locked() const;
  std::chrono::microseconds floor_locked() const;
  bool straggler_locked(const Peer& p) const {
    return p.misses_in_row >= options_.straggler_misses;
  }

  // A probe's listening time, in round intervals.
  static constexpr int64_t kProbeIntervals = 4;

  // Whether this AdaptiveDeadline still lives, for guard().
  struct Alive {
    std::mutex mutex;
    AdaptiveDeadline* self;
  };

  AdaptiveDeadlineOptions options_;
  std::shared_ptr<Alive> alive_;
  mutable std::mutex mutex_;
  std::map<int, Peer> peers_;
  uint64_t last_round_ = 0;
  Clock::time_point last_start_{};
  std::vector<int64_t> intervals_;  // ring buffer of round intervals per round number, in us
  size_t next_interval_ = 0;
};

}  // namespace relaxcc
