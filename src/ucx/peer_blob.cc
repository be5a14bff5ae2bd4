#include "src/ucx/peer_blob.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "relaxcc/errors.h"

namespace relaxcc::ucx {

namespace {

constexpr uint32_t kMagic = 0x43555852;  // "RXUC"
constexpr uint16_t kVersion = 2;

uint64_t namespace_inode(const char* name) {
  struct stat st {};
  const std::string path = std::string("/proc/self/ns/") + name;
  RELAXCC_ENFORCE(stat(path.c_str(), &st) == 0, Unsupported, "cannot stat ", path,
                  ": the UCX wing needs /proc");
  return static_cast<uint64_t>(st.st_ino);
}

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_bytes(const std::byte* p, size_t n) { out_.insert(out_.end(), p, p + n); }
  Blob take() { return std::move(out_); }

 private:
  Blob out_;
};

class Reader {
 public:
  Reader(const Blob& in, int rank) : in_(in), rank_(rank) {}
  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  const std::byte* take(size_t n) {
    if (n > in_.size() - pos_)
      RELAXCC_THROW(CorruptPayload, "the UCX address blob of rank ", rank_, " is truncated (",
                    in_.size(), " bytes)");
    const std::byte* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  const Blob& in_;
  size_t pos_ = 0;
  int rank_;
};

}  // namespace

HostIdentity HostIdentity::of_this_process() {
  HostIdentity id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  in >> boot;
  RELAXCC_ENFORCE(boot.size() == id.boot_id.size(), Unsupported,
                  "cannot read /proc/sys/kernel/random/boot_id: the UCX wing needs it");
  std::copy(boot.begin(), boot.end(), id.boot_id.begin());
  id.pid_ns = namespace_inode("pid");
  id.net_ns = namespace_inode("net");
  id.ipc_ns = namespace_inode("ipc");
  return id;
}

ProcessStatus process_status(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return {};
  // The command name (field 2) may hold spaces and parentheses: fields
  // after it are counted from the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream fields(line.substr(close + 1));
  ProcessStatus status;
  fields >> status.state;  // field 3
  std::string skip;
  for (int f = 4; f < 22; ++f) fields >> skip;
  fields >> status.start_time;
  return status;
}

ProcessIdentity ProcessIdentity::of_this_process() {
  ProcessIdentity id;
  id.pid = getpid();
  id.start_time = process_status(id.pid).start_time;
  RELAXCC_ENFORCE(id.start_time != 0, Unsupported,
                  "cannot read /proc/self/stat: the UCX wing needs it");
  return id;
}

Blob PeerBlob::encode() const {
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put(uint16_t{0});
  w.put(host.boot_id);
  w.put(host.pid_ns);
  w.put(host.net_ns);
  w.put(host.ipc_ns);
  w.put(static_cast<int64_t>(process.pid));
  w.put(process.start_time);
  w.put(liveness.port);
  w.put(static_cast<uint16_t>(liveness.hosts.size()));
  for (uint32_t address : liveness.hosts) w.put(address);
  w.put(static_cast<uint64_t>(worker_address.size()));
  w.put_bytes(worker_address.data(), worker_address.size());
  return w.take();
}

PeerBlob PeerBlob::decode(const Blob& blob, int rank) {
  Reader r(blob, rank);
  const auto magic = r.get<uint32_t>();
  const auto version = r.get<uint16_t>();
  r.get<uint16_t>();
  if (magic != kMagic || version != kVersion)
    RELAXCC_THROW(CorruptPayload, "the UCX address blob of rank ", rank, " is not one (magic ",
                  magic, ", version ", version, "; expected ", kMagic, ", ", kVersion, ")");
  PeerBlob b;
  b.host.boot_id = r.get<decltype(b.host.boot_id)>();
  b.host.pid_ns = r.get<uint64_t>();
  b.host.net_ns = r.get<uint64_t>();
  b.host.ipc_ns = r.get<uint64_t>();
  b.process.pid = static_cast<pid_t>(r.get<int64_t>());
  b.process.start_time = r.get<uint64_t>();
  b.liveness.port = r.get<uint16_t>();
  const auto hosts = r.get<uint16_t>();
  if (hosts > engine::UdpSocket::kMaxHosts)
    RELAXCC_THROW(CorruptPayload, "the UCX address blob of rank ", rank, " lists ", hosts,
                  " liveness addresses (at most ", engine::UdpSocket::kMaxHosts, ")");
  for (uint16_t i = 0; i < hosts; ++i) b.liveness.hosts.push_back(r.get<uint32_t>());
  const auto n = r.get<uint64_t>();
  if (n == 0 || n != r.left())
    RELAXCC_THROW(CorruptPayload, "the UCX address blob of rank ", rank, " holds ", r.left(),
                  " address bytes but says ", n);
  const std::byte* p = r.take(n);
  b.worker_address.assign(p, p + n);
  return b;
}

}  // namespace relaxcc::ucx
