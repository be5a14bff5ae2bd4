// What one rank publishes so that others can reach it over UCX: its worker
// address, the identity of its host and its process. Peers whose host
// identity equals ours share our kernel, pid namespace, network namespace and
// IPC namespace: they get shared memory and a host-local liveness check.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/engine/udp_channel.h"

namespace relaxcc::ucx {

using Blob = std::vector<std::byte>;

// The kernel boot and the namespaces of this process. Two processes with the
// same HostIdentity can map each other's shared memory and see each other's
// process ids; emulated hosts (network namespaces) differ.
struct HostIdentity {
  std::array<char, 36> boot_id{};
  uint64_t pid_ns = 0;
  uint64_t net_ns = 0;
  uint64_t ipc_ns = 0;

  static HostIdentity of_this_process();
  bool operator==(const HostIdentity&) const = default;
};

// A process, named so that a reused pid is told apart: its pid and its start
// time (clock ticks after boot, /proc/<pid>/stat field 22).
struct ProcessIdentity {
  pid_t pid = 0;
  uint64_t start_time = 0;

  static ProcessIdentity of_this_process();
  bool operator==(const ProcessIdentity&) const = default;
};

struct PeerBlob {
  HostIdentity host;
  ProcessIdentity process;
  // The UDP socket of the endpoint set's heartbeats (engine/udp_channel.h);
  // port 0: none (heartbeats go over UCX).
  engine::UdpAddress liveness;
  std::vector<std::byte> worker_address;

  Blob encode() const;
  // Throws CorruptPayload naming `rank` when `blob` is not a PeerBlob.
  static PeerBlob decode(const Blob& blob, int rank);
};

// What /proc says of process `pid`: its state letter (R, S, D, T when
// stopped, t when traced, Z when it exited) and its start time; state 0 and
// start time 0 when there is no such process.
struct ProcessStatus {
  char state = 0;
  uint64_t start_time = 0;

  // The process `id` names still runs (or sleeps, or is stopped).
  bool runs(const ProcessIdentity& id) const {
    return start_time == id.start_time && state != 0 && state != 'Z' && state != 'X' &&
           state != 'x';
  }
};
ProcessStatus process_status(pid_t pid);

}  // namespace relaxcc::ucx
