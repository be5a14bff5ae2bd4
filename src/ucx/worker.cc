#include "src/ucx/worker.h"

#include <cstdlib>
#include <cstring>

#include "relaxcc/errors.h"

namespace relaxcc::ucx {

void check_ucs(ucs_status_t status, std::string_view what) {
  if (status != UCS_OK)
    RELAXCC_THROW(CommunicationError, what, " failed: ", ucs_status_string(status));
}

Context::Context(const std::string& net_devices, bool heartbeats) {
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucs_status_t status = UCS_OK;
  if (!net_devices.empty()) status = ucp_config_modify(config, "NET_DEVICES", net_devices.c_str());
  // UCX's own keepalive rides the data's connection, so on a slow link it
  // queues behind bulk transfers and fails live endpoints ("Endpoint
  // timeout"); the engine's heartbeats (their own UDP socket) judge silent
  // peers instead. The user's UCX_KEEPALIVE_INTERVAL wins; a UCX without
  // the setting keeps its own.
  const char* keepalive = std::getenv("UCX_KEEPALIVE_INTERVAL");
  if (heartbeats && (keepalive == nullptr || *keepalive == '\0'))
    static_cast<void>(ucp_config_modify(config, "KEEPALIVE_INTERVAL", "inf"));
  if (status == UCS_OK) status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check_ucs(status, net_devices.empty() ? std::string("ucp_init")
                                        : "ucp_init with UCX_NET_DEVICES=" + net_devices);
}

Context::~Context() {
  ucp_cleanup(context_);
}

Worker::Worker(std::shared_ptr<Context> context) : context_(std::move(context)) {
  RELAXCC_ENFORCE(context_ != nullptr, InvalidArgument, "ucx::Worker needs a context");
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  check_ucs(ucp_worker_create(context_->get(), &params, &worker_), "ucp_worker_create");
  try {
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE | UCP_WORKER_ATTR_FIELD_ADDRESS;
    check_ucs(ucp_worker_query(worker_, &attr), "ucp_worker_query");
    const auto* p = reinterpret_cast<const std::byte*>(attr.address);
    self_.worker_address.assign(p, p + attr.address_length);
    ucp_worker_release_address(worker_, attr.address);
    RELAXCC_ENFORCE(attr.thread_mode != UCS_THREAD_MODE_SINGLE, Unsupported,
                    "this UCX gives a single-threaded worker; relaxcc needs "
                    "UCS_THREAD_MODE_SERIALIZED");
    check_ucs(ucp_worker_get_efd(worker_, &event_fd_), "ucp_worker_get_efd");
    self_.host = HostIdentity::of_this_process();
    self_.process = ProcessIdentity::of_this_process();
  } catch (...) {
    ucp_worker_destroy(worker_);
    throw;
  }
}

Worker::~Worker() {
  ucp_worker_destroy(worker_);
}

Blob Worker::blob(const engine::UdpSocket* liveness) const {
  if (liveness == nullptr) return self_.encode();
  PeerBlob b = self_;
  b.liveness = liveness->address();
  return b.encode();
}

bool Worker::arm() {
  const ucs_status_t status = ucp_worker_arm(worker_);
  if (status == UCS_ERR_BUSY) return false;
  check_ucs(status, "ucp_worker_arm");
  return true;
}

}  // namespace relaxcc::ucx
