// create_ucx_communicator: the UCX wing's factory (ucx_communicator.h). It
// meets the other processes on the rendezvous store, connects a UcxEndpoints
// set from their worker addresses and builds the transport-neutral
// communicator over it.
#include "relaxcc/ucx_communicator.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "src/communicator/engine_communicator.h"
#include "src/engine/clock.h"
#include "src/engine/tunables_check.h"
#include "src/ucx/ucx_transport.h"
#include "src/ucx/worker.h"

namespace relaxcc {
namespace {

using engine::Clock;

bool is_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

// UCX_NET_DEVICES for the worker (ucx_communicator.h): "" leaves UCX's own.
std::string net_devices(const UcxCommunicatorOptions& options) {
  if (is_set("UCX_NET_DEVICES") || is_set("UCX_TLS")) return {};
  if (options.net_devices != "auto") return options.net_devices;
  return !options.store && is_loopback(options.rendezvous.host) ? "lo" : "";
}

std::chrono::milliseconds left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

// The UDP socket of an endpoint set's heartbeats (src/engine/udp_channel.h);
// null when heartbeats are off, or when the kernel refuses one (then they go
// over UCX, as for every set where some rank has none).
std::shared_ptr<engine::UdpSocket> liveness_socket(const Tunables& tunables) {
  if (tunables.peer_timeout_ms <= 0) return nullptr;
  try {
    return std::make_shared<engine::UdpSocket>();
  } catch (const Error& e) {
    RELAXCC_LOG(warn, "heartbeats go over UCX: ", e.message());
    return nullptr;
  }
}

}  // namespace

bool ucx_available() {
  return true;
}

CommunicatorPtr create_ucx_communicator(const UcxCommunicatorOptions& options) {
  // Before any connection: a bad tunable fails this rank alone, at once.
  engine::check_tunables(options.tunables);
  const auto timeout = options.timeout.count() >= 0
                           ? options.timeout
                           : std::chrono::milliseconds(options.tunables.timeout_ms);
  const auto deadline = Clock::now() + timeout;
  RendezvousOptions r = options.rendezvous;
  r.timeout = timeout;
  if (options.store) {
    // The caller's store: only rank, size, job and generation matter.
    if (r.host.empty()) r.host = "-";
    if (r.port == 0) r.port = 1;
  }
  r.validate();
  // The worker first: its address is what the rendezvous exchanges.
  std::shared_ptr<ucx::UcxTransport> shared;
  if (options.share_engine_with) {
    shared = std::dynamic_pointer_cast<ucx::UcxTransport>(
        engine::transport_of(*options.share_engine_with));
    RELAXCC_ENFORCE(shared != nullptr, InvalidArgument,
                    "create_ucx_communicator: share_engine_with is not a UCX communicator");
  }
  auto worker = shared ? shared->worker()
                       : std::make_shared<ucx::Worker>(std::make_shared<ucx::Context>(
                             net_devices(options), options.tunables.peer_timeout_ms > 0));
  // This set's heartbeat socket: its address goes out with the worker's.
  auto liveness = liveness_socket(options.tunables);
  const ucx::Blob own = worker->blob(liveness.get());
  std::vector<uint8_t> blob(own.size());
  for (size_t i = 0; i < own.size(); ++i) blob[i] = static_cast<uint8_t>(own[i]);
  RendezvousResult met;
  if (options.store) {
    met = rendezvous(r, *options.store, blob);
  } else {
    auto store = open_rendezvous_store(r);
    r.timeout = left(deadline);
    met = rendezvous(r, *store, blob);
  }
  std::vector<ucx::Blob> blobs(met.blobs.size());
  for (size_t k = 0; k < blobs.size(); ++k) {
    blobs[k].resize(met.blobs[k].size());
    for (size_t i = 0; i < met.blobs[k].size(); ++i)
      blobs[k][i] = static_cast<std::byte>(met.blobs[k][i]);
  }
  ucx::EndpointOptions e;
  e.generation = static_cast<uint32_t>(r.generation);
  e.share_memory = options.share_memory;
  e.liveness = std::move(liveness);
  ucx::UcxConnection c;
  if (shared) {
    c.transport = shared;
    c.endpoints = std::make_shared<ucx::UcxEndpoints>(shared, blobs, met.rank, e);
  } else {
    c = ucx::connect(std::move(worker), blobs, met.rank, e);
  }
  engine::EngineCommunicatorOptions o;
  o.share_engine_with = options.share_engine_with;
  o.tunables = options.tunables;
  o.timeout = left(deadline);
  o.creator = detail::concat("create_ucx_communicator (rank ", met.rank, " of ", met.size,
                             ", rendezvous at ",
                             options.store ? options.store->address() : r.address(), ")");
  return engine::create_engine_communicator(std::move(c.transport), std::move(c.endpoints), o);
}

}  // namespace relaxcc
