// relaxcc-relay: the one-way delay of relaxcc-hosts' emulated links.
//
// This kernel has no netem, so a link's latency is added in user space. Each
// emulated host's link is cut in two veth pairs that meet in a namespace of
// their own (no addresses there, so its kernel neither answers nor routes
// anything); this program owns one AF_PACKET socket on each of the two ends
// and copies every frame from one end to the other after the link's delay,
// in both directions. It works at layer 2, so every kind of traffic (TCP of
// MPI, UCX and gloo, ARP, ICMP) meets the same delay, and the rate stays
// shaped by the tbf/htb qdiscs of the host's and the bridge's veth ends,
// which lie outside the relay.
//
// Why AF_PACKET and not a TUN device: a TUN device is a layer-3 hop (its own
// routes and addresses in every host) and sees packets after segmentation
// unless offloads are negotiated; a packet socket with PACKET_VNET_HDR
// receives the frames as the veth carries them, TSO/GSO super-frames of up to
// 64 KiB with their checksum-offload state included, and sends them back in
// the same form, so the relay handles about one syscall per 64 KiB at
// 1 Gbit/s and the hosts keep their offloads.
//
// Why no timer wheel: a direction has one constant delay, so its frames
// leave in the order they arrived and the FIFO of held frames is sorted by
// deadline. Each direction keeps its frames in a byte ring and arms one
// timerfd at the deadline of its oldest frame. One thread, one epoll set:
// packet sockets, timerfds and a signalfd.
//
// Usage: relaxcc-relay [--queue-mib N] IFA,IFB,DELAY_US [IFA,IFB,DELAY_US ...]
// Each triple relays IFA->IFB and IFB->IFA, each way delayed by DELAY_US
// microseconds. Prints "ready" on stdout once every socket is bound, runs
// until SIGTERM/SIGINT (or the death of its parent), then prints per-direction
// counts on stderr. Frames that do not fit a direction's ring (N MiB each,
// default 64) are dropped, as a full queue would drop them.

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Frames of one direction, oldest first, in one ring of bytes. A record is a
// header and the frame, padded to 16 bytes; a record never wraps: when the
// space left at the end is too small, the ring continues at offset 0 and
// `wrap_` marks where the older records end.
class FrameFifo {
 public:
  explicit FrameFifo(size_t capacity)
      : capacity_(capacity & ~size_t{15}), buf_(new std::byte[capacity_]) {}

  bool empty() const { return count_ == 0; }

  // Appends a frame; false when it does not fit (the caller drops it).
  bool push(int64_t deadline, const std::byte* data, uint32_t len) {
    const size_t need = record_size(len);
    size_t at;
    if (wrap_ == 0) {
      if (capacity_ - tail_ >= need) {
        at = tail_;
      } else if (head_ >= need) {
        wrap_ = tail_;
        at = 0;
      } else {
        return false;
      }
    } else if (head_ - tail_ >= need) {
      at = tail_;
    } else {
      return false;
    }
    Header h{deadline, len};
    std::memcpy(buf_.get() + at, &h, sizeof h);
    std::memcpy(buf_.get() + at + sizeof h, data, len);
    tail_ = at + need;
    ++count_;
    return true;
  }

  int64_t front_deadline() const { return header().deadline; }
  const std::byte* front_data() const { return buf_.get() + head_ + sizeof(Header); }
  uint32_t front_len() const { return header().len; }

  void pop() {
    head_ += record_size(header().len);
    --count_;
    if (wrap_ != 0 && head_ == wrap_) {
      head_ = 0;
      wrap_ = 0;
    } else if (wrap_ == 0 && head_ == tail_) {
      head_ = tail_ = 0;
    }
  }

 private:
  struct Header {
    int64_t deadline;
    uint32_t len;
    uint32_t pad = 0;
  };
  static_assert(sizeof(Header) == 16);
  static size_t record_size(uint32_t len) { return (sizeof(Header) + len + 15) & ~size_t{15}; }
  Header header() const {
    Header h{};
    std::memcpy(&h, buf_.get() + head_, sizeof h);
    return h;
  }

  size_t capacity_;
  std::unique_ptr<std::byte[]> buf_;
  size_t head_ = 0, tail_ = 0, wrap_ = 0, count_ = 0;
};

struct Port;

// One way of one link: frames read from `in` leave through `out` after
// `delay_ns`, in order.
struct Direction {
  Port* in = nullptr;
  Port* out = nullptr;
  int64_t delay_ns = 0;
  FrameFifo fifo;
  int timer_fd = -1;
  bool blocked = false;  // `out` returned EAGAIN; waiting for EPOLLOUT
  uint64_t frames = 0, bytes = 0, dropped = 0;

  explicit Direction(size_t queue_bytes) : fifo(queue_bytes) {}
};

// One interface end: its packet socket reads for one direction and writes
// for the other.
struct Port {
  std::string name;
  int fd = -1;
  Direction* reads = nullptr;
  Direction* writes = nullptr;
};

constexpr size_t kFrameBytes = 65536 + 1024;  // a 64 KiB GSO frame, its Ethernet and vnet headers
constexpr int kBatch = 32;

class Relay {
 public:
  explicit Relay(size_t queue_bytes) : queue_bytes_(queue_bytes) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) fail("epoll_create1");
    scratch_.resize(kBatch * kFrameBytes);
  }

  void add_link(const std::string& a, const std::string& b, int64_t delay_us) {
    Port* pa = open_port(a);
    Port* pb = open_port(b);
    for (auto [from, to] : {std::pair{pa, pb}, std::pair{pb, pa}}) {
      auto& d = directions_.emplace_back(queue_bytes_);
      d.in = from;
      d.out = to;
      d.delay_ns = delay_us * 1000;
      d.timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
      if (d.timer_fd < 0) fail("timerfd_create");
      from->reads = &d;
      to->writes = &d;
      watch(d.timer_fd, &d, EPOLLIN);
    }
  }

  void run() {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) fail("sigprocmask");
    int sig_fd = signalfd(-1, &mask, SFD_CLOEXEC);
    if (sig_fd < 0) fail("signalfd");
    watch(sig_fd, nullptr, EPOLLIN);
    std::printf("ready\n");
    std::fflush(stdout);
    epoll_event events[64];
    for (;;) {
      int n = epoll_wait(epoll_fd_, events, 64, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("epoll_wait");
      }
      for (int i = 0; i < n; ++i) {
        const auto& tag = tags_[events[i].data.u64];
        if (tag.fd == sig_fd) return;
        if (tag.port != nullptr) {
          if (events[i].events & (EPOLLERR | EPOLLHUP)) {
            throw std::runtime_error("relaxcc-relay: interface " + tag.port->name + " went away");
          }
          if (events[i].events & EPOLLOUT) unblock(*tag.port->writes);
          if (events[i].events & EPOLLIN) receive(*tag.port);
        } else {
          uint64_t expirations;
          while (read(tag.fd, &expirations, sizeof expirations) > 0) {
          }
          flush(*tag.direction);
        }
      }
    }
  }

  void report() const {
    for (const auto& d : directions_) {
      std::fprintf(
          stderr, "relaxcc-relay: %s -> %s: %llu frames, %llu bytes, %llu dropped, delay %.3f ms\n",
          d.in->name.c_str(), d.out->name.c_str(), static_cast<unsigned long long>(d.frames),
          static_cast<unsigned long long>(d.bytes), static_cast<unsigned long long>(d.dropped),
          d.delay_ns / 1e6);
    }
  }

 private:
  struct Tag {
    int fd;
    Port* port;
    Direction* direction;
  };

  void watch(int fd, Direction* d, uint32_t events, Port* p = nullptr) {
    tags_.push_back({fd, p, d});
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tags_.size() - 1;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) fail("epoll_ctl ADD");
    if (p != nullptr) port_tag_.emplace_back(p, tags_.size() - 1);
  }

  void set_port_events(Port& p, uint32_t events) {
    for (auto& [port, tag] : port_tag_) {
      if (port != &p) continue;
      epoll_event ev{};
      ev.events = events;
      ev.data.u64 = tag;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, p.fd, &ev) != 0) fail("epoll_ctl MOD on " + p.name);
    }
  }

  Port* open_port(const std::string& name) {
    unsigned index = if_nametoindex(name.c_str());
    if (index == 0) fail("relaxcc-relay: no interface " + name);
    // Protocol 0 until bound: a socket opened for ETH_P_ALL would receive
    // the frames of every interface until bind() narrows it.
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket(AF_PACKET) for " + name);
    int one = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0)
      fail("PACKET_VNET_HDR on " + name);
    if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) != 0) {
      fail("PACKET_IGNORE_OUTGOING on " + name);
    }
    int buffer = 32 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
      fail("SO_RCVBUFFORCE on " + name);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0)
      fail("SO_SNDBUFFORCE on " + name);
    sockaddr_ll addr{};
    addr.sll_family = AF_PACKET;
    addr.sll_protocol = htons(ETH_P_ALL);
    addr.sll_ifindex = static_cast<int>(index);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("bind to " + name);
    auto& p = ports_.emplace_back();
    p.name = name;
    p.fd = fd;
    watch(fd, nullptr, EPOLLIN, &p);
    return &p;
  }

  void receive(Port& p) {
    Direction& d = *p.reads;
    mmsghdr msgs[kBatch];
    iovec iovs[kBatch];
    // A bounded number of batches per wakeup, so one busy port cannot
    // starve the timers of the others.
    for (int round = 0; round < 8; ++round) {
      for (int i = 0; i < kBatch; ++i) {
        iovs[i] = {scratch_.data() + i * kFrameBytes, kFrameBytes};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      int n = recvmmsg(p.fd, msgs, kBatch, MSG_DONTWAIT, nullptr);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        fail("recvmmsg on " + p.name);
      }
      const int64_t deadline = now_ns() + d.delay_ns;
      for (int i = 0; i < n; ++i) {
        const auto* data = reinterpret_cast<const std::byte*>(iovs[i].iov_base);
        uint32_t len = msgs[i].msg_len;
        if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
          ++d.dropped;
          continue;
        }
        if (d.delay_ns == 0 && d.fifo.empty() && !d.blocked) {
          if (send_frame(d, data, len)) continue;
        }
        const bool was_empty = d.fifo.empty();
        if (!d.fifo.push(deadline, data, len)) {
          ++d.dropped;
          continue;
        }
        if (was_empty && !d.blocked) arm(d);
      }
      if (n < kBatch) return;
    }
  }

  // Sends one frame; false when the socket would block (the frame is kept).
  bool send_frame(Direction& d, const std::byte* data, uint32_t len) {
    ssize_t r = send(d.out->fd, data, len, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        d.blocked = true;
        set_port_events(*d.out, EPOLLIN | EPOLLOUT);
        return false;
      }
      if (errno == ENOBUFS || errno == EMSGSIZE) {  // the frame is lost, as on a congested link
        ++d.dropped;
        return true;
      }
      fail("send on " + d.out->name);
    }
    ++d.frames;
    d.bytes += len;
    return true;
  }

  void flush(Direction& d) {
    if (d.blocked) return;
    const int64_t now = now_ns();
    while (!d.fifo.empty() && d.fifo.front_deadline() <= now) {
      if (!send_frame(d, d.fifo.front_data(), d.fifo.front_len())) return;
      d.fifo.pop();
    }
    if (!d.fifo.empty()) arm(d);
  }

  void unblock(Direction& d) {
    d.blocked = false;
    set_port_events(*d.out, EPOLLIN);
    flush(d);
  }

  static void arm(Direction& d) {
    const int64_t at = d.fifo.front_deadline();
    itimerspec spec{};
    spec.it_value.tv_sec = at / 1'000'000'000;
    spec.it_value.tv_nsec = at % 1'000'000'000;
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
    if (timerfd_settime(d.timer_fd, TFD_TIMER_ABSTIME, &spec, nullptr) != 0)
      fail("timerfd_settime");
  }

  size_t queue_bytes_;
  int epoll_fd_ = -1;
  std::deque<Port> ports_;  // stable addresses
  std::deque<Direction> directions_;
  std::vector<Tag> tags_;
  std::vector<std::pair<Port*, size_t>> port_tag_;
  std::vector<std::byte> scratch_;
};

int usage() {
  std::fprintf(stderr,
               "usage: relaxcc-relay [--queue-mib N] IFA,IFB,DELAY_US [IFA,IFB,DELAY_US ...]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  size_t queue_mib = 64;
  std::vector<std::string> links;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--queue-mib" && i + 1 < argc) {
      queue_mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg.rfind("--", 0) == 0) {
      return usage();
    } else {
      links.push_back(arg);
    }
  }
  if (links.empty() || queue_mib == 0) return usage();
  // The relay lives as long as the relaxcc-hosts that started it.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // Frames wait for the relay on a machine that may be busy compiling: a
  // real-time priority keeps the added delay close to the one asked for.
  // Optional: without the privilege the relay runs at normal priority.
  sched_param prio{};
  prio.sched_priority = 10;
  sched_setscheduler(0, SCHED_FIFO, &prio);
  try {
    Relay relay(queue_mib << 20);
    for (const auto& link : links) {
      auto c1 = link.find(',');
      auto c2 = link.find(',', c1 == std::string::npos ? c1 : c1 + 1);
      if (c1 == std::string::npos || c2 == std::string::npos) return usage();
      char* end = nullptr;
      long long delay_us = std::strtoll(link.c_str() + c2 + 1, &end, 10);
      if (*end != '\0' || delay_us < 0) return usage();
      relay.add_link(link.substr(0, c1), link.substr(c1 + 1, c2 - c1 - 1), delay_us);
    }
    relay.run();
    relay.report();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relaxcc-relay: %s\n", e.what());
    return 1;
  }
  return 0;
}
