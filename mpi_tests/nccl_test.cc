// The NCCL communicator (relaxcc/nccl_communicator.h).
//
// Without a GPU (or with fewer GPUs than ranks), or in a build without NCCL,
// the GPU tests skip with the reason; the factory's error and the device
// rule for tensors are checked everywhere. Data encodes (rank, index) as
// small integers, exact in f32, so every result is compared exactly.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "relaxcc/config.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/cuda_runtime.h"
#include "relaxcc/nccl_communicator.h"
#include "src/nccl/device_checks.h"
#include "src/nccl/watchdog.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using test::encode;
using test::world_rank;
using test::world_size;

// Why the GPU tests cannot run here; empty when they can.
std::string gpu_skip_reason() {
  if (!build::kHaveNccl) return "relaxcc was built without NCCL";
  const kernels::CudaAvailability cuda = kernels::cuda_availability();
  if (cuda.device_count == 0) return "no CUDA device: " + cuda.reason;
  if (cuda.device_count < world_size())
    return detail::concat(world_size(),
                          " ranks need as many GPUs (NCCL refuses two ranks on one "
                          "GPU), ",
                          cuda.device_count, " visible");
  return {};
}

#define SKIP_WITHOUT_GPUS()                                     \
  do {                                                          \
    const std::string reason = gpu_skip_reason();               \
    if (!reason.empty()) GTEST_SKIP() << "skipped: " << reason; \
  } while (0)

void check_cuda(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

// One NCCL communicator per program for the tests that leave it usable,
// released before MPI_Finalize (the test main finalizes after RUN_ALL_TESTS).
CommunicatorPtr& shared_slot() {
  static CommunicatorPtr comm;
  return comm;
}
class ReleaseShared : public testing::Environment {
 public:
  void TearDown() override { shared_slot().reset(); }
};
[[maybe_unused]] testing::Environment* const release_shared =
    testing::AddGlobalTestEnvironment(new ReleaseShared);

CommunicatorPtr shared_comm() {
  if (!shared_slot()) {
    NcclCommunicatorOptions options;
    options.bootstrap = test::world();
    options.timeout = std::chrono::milliseconds(60000);
    shared_slot() = create_nccl_communicator(options);
  }
  return shared_slot();
}

// A communicator of its own, for tests that poison it.
CommunicatorPtr own_comm(std::chrono::milliseconds timeout) {
  NcclCommunicatorOptions options;
  options.bootstrap = test::world();
  options.timeout = timeout;
  return create_nccl_communicator(options);
}

std::vector<float> encoded(int rank, int64_t n, int64_t first = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>(encode(rank, first + i));
  return v;
}

TensorView upload(Communicator& comm, const std::vector<float>& v) {
  TensorView t = comm.allocate(static_cast<int64_t>(v.size()), DType::f32);
  if (!v.empty())
    check_cuda(cudaMemcpy(t.data, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy to the device");
  return t;
}

std::vector<float> download(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel));
  if (!v.empty())
    check_cuda(cudaMemcpy(v.data(), t.data, v.size() * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy to the host");
  return v;
}

ExecContext on(const TensorView& t, void* stream = nullptr) {
  ExecContext ctx;
  ctx.device = t.device;
  ctx.stream = stream;
  return ctx;
}

// ---- everywhere ------------------------------------------------------------

TEST(NcclCommunicator, FactoryWithoutDeviceIsUnsupported) {
  if (build::kHaveNccl && kernels::cuda_availability().device_count > 0)
    GTEST_SKIP() << "skipped: a CUDA device is visible (the factory works here)";
  try {
    create_nccl_communicator();
    FAIL() << "create_nccl_communicator succeeded without a device";
  } catch (const Unsupported& e) {
    const std::string message = e.message();
    EXPECT_NE(message.find("create_nccl_communicator"), std::string::npos) << message;
    EXPECT_TRUE(message.find("no usable CUDA device") != std::string::npos ||
                message.find("built without NCCL") != std::string::npos)
        << message;
  }
}

TEST(NcclCommunicator, HostAndOtherDeviceTensorsAreRejected) {
  std::vector<float> host(4, 1.0f);
  const TensorView on_host = TensorView::host(host.data(), 4);
  const TensorView on_cuda1(host.data(), 4, DType::f32, Device::cuda(1));
  const TensorView on_cuda0(host.data(), 4, DType::f32, Device::cuda(0));
  ExecContext ctx0;
  ctx0.device = Device::cuda(0);
  const std::string who = detail::concat("rank ", world_rank(), " (cuda:0)");
  try {
    nccl::check_device_tensor(who, "allreduce input", "bucket 3", on_host, ctx0, 0);
    FAIL() << "a host tensor was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find(who + ": allreduce input of 'bucket 3' is on host"),
              std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("cuda:0"), std::string::npos) << e.message();
  }
  try {
    nccl::check_device_tensor(who, "allreduce output", "", on_cuda1, ctx0, 0);
    FAIL() << "a tensor of another device was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("allreduce output is on cuda:1, but this NCCL communicator drives "
                               "cuda:0"),
              std::string::npos)
        << e.message();
  }
  EXPECT_THROW(
      nccl::check_device_tensor(who, "broadcast tensor", "", on_cuda0, ExecContext::host(), 0),
      InvalidArgument);
  EXPECT_NO_THROW(nccl::check_device_tensor(who, "broadcast tensor", "", on_cuda0, ctx0, 0));
}

// ---- with one GPU per rank -------------------------------------------------

TEST(NcclCommunicator, AllreduceIsExact) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 1000;
  TensorView data = upload(*comm, encoded(me, count));
  TensorView out = comm->allocate(count, DType::f32);
  AllreduceOptions options;
  options.label = "allreduce test";
  comm->allreduce(data, out, on(data), options)->wait();  // out of place
  options.op = ReduceOp::max;
  comm->allreduce(data, on(data), options)->wait();  // in place
  // No elements: nothing to call, a Work that completes all the same.
  TensorView empty = comm->allocate(0, DType::f32);
  comm->allreduce(empty, on(data))->wait();
  const std::vector<float> sum = download(out), max = download(data);
  for (int64_t i = 0; i < count; ++i) {
    float expected = 0.0f;
    for (int r = 0; r < n; ++r) expected += static_cast<float>(encode(r, i));
    ASSERT_EQ(sum[static_cast<size_t>(i)], expected) << "element " << i;
    ASSERT_EQ(max[static_cast<size_t>(i)], static_cast<float>(encode(n - 1, i))) << "element " << i;
  }
}

TEST(NcclCommunicator, ReduceScatterAndAllgatherAreExact) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  const int n = comm->size(), me = comm->rank();
  const int64_t block = 257;
  TensorView input = upload(*comm, encoded(me, block * n));
  TensorView mine = comm->allocate(block, DType::f32);
  comm->reduce_scatter(input, mine, on(input))->wait();
  const std::vector<float> reduced = download(mine);
  for (int64_t i = 0; i < block; ++i) {
    float expected = 0.0f;
    for (int r = 0; r < n; ++r) expected += static_cast<float>(encode(r, me * block + i));
    ASSERT_EQ(reduced[static_cast<size_t>(i)], expected) << "element " << i;
  }
  TensorView own = upload(*comm, encoded(me, block));
  TensorView all = comm->allocate(block * n, DType::f32);
  comm->allgather(own, all, on(own))->wait();
  const std::vector<float> gathered = download(all);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < block; ++i)
      ASSERT_EQ(gathered[static_cast<size_t>(r * block + i)], static_cast<float>(encode(r, i)))
          << "rank " << r << " element " << i;
}

TEST(NcclCommunicator, AllgathervAndAlltoallAreExact) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  const int n = comm->size(), me = comm->rank();
  std::vector<int64_t> counts(static_cast<size_t>(n));
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += counts[static_cast<size_t>(r)] = 3 * r + 1;
  TensorView own = upload(*comm, encoded(me, counts[static_cast<size_t>(me)]));
  TensorView all = comm->allocate(total, DType::f32);
  comm->allgatherv(own, all, counts, on(own))->wait();
  const std::vector<float> gathered = download(all);
  int64_t at = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i, ++at)
      ASSERT_EQ(gathered[static_cast<size_t>(at)], static_cast<float>(encode(r, i)))
          << "rank " << r << " element " << i;

  // Block p of rank r's input holds encode(r, p * block + i).
  const int64_t block = 33;
  TensorView input = upload(*comm, encoded(me, block * n));
  TensorView output = comm->allocate(block * n, DType::f32);
  comm->alltoall(input, output, on(input))->wait();
  const std::vector<float> got = download(output);
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < block; ++i)
      ASSERT_EQ(got[static_cast<size_t>(p * block + i)],
                static_cast<float>(encode(p, me * block + i)))
          << "from rank " << p << " element " << i;
}

TEST(NcclCommunicator, BroadcastAndPointToPointAreExact) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 513;
  TensorView data = upload(*comm, encoded(me, count));
  BroadcastOptions options;
  options.root = n - 1;
  comm->broadcast(data, on(data), options)->wait();
  const std::vector<float> got = download(data);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_EQ(got[static_cast<size_t>(i)], static_cast<float>(encode(n - 1, i))) << "element " << i;

  // A ring: send to the right, receive from the left, in one batch.
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  TensorView out = upload(*comm, encoded(me, count));
  TensorView in = comm->allocate(count, DType::f32);
  comm->point_to_point({P2POp::send(right, out), P2POp::recv(left, in)}, on(out))->wait();
  const std::vector<float> received = download(in);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_EQ(received[static_cast<size_t>(i)], static_cast<float>(encode(left, i)))
        << "element " << i;
  const CommStats stats = comm->stats();
  EXPECT_GE(stats.sent_to[static_cast<size_t>(right)], static_cast<uint64_t>(count * 4));
  comm->barrier()->wait();
}

// The operation runs after what the caller's stream holds, and block_stream
// orders the caller's later work after it: no host wait in between.
TEST(NcclCommunicator, StreamOrderWithoutHostWaits) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 1 << 20;
  TensorView data = comm->allocate(count, DType::f32);
  cudaStream_t stream = nullptr;
  check_cuda(cudaSetDevice(data.device.index), "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  float* pinned = nullptr;
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&pinned), count * sizeof(float)),
             "cudaMallocHost");
  const std::vector<float> values = encoded(me, count);
  std::memcpy(pinned, values.data(), count * sizeof(float));
  check_cuda(
      cudaMemcpyAsync(data.data, pinned, count * sizeof(float), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync");
  WorkPtr work = comm->allreduce(data, on(data, stream));
  work->block_stream(stream);
  check_cuda(
      cudaMemcpyAsync(pinned, data.data, count * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (int64_t i = 0; i < count; i += 997) {
    float expected = 0.0f;
    for (int r = 0; r < n; ++r) expected += static_cast<float>(encode(r, i));
    ASSERT_EQ(pinned[i], expected) << "element " << i;
  }
  work->wait();
  EXPECT_TRUE(work->is_completed());
  check_cuda(cudaFreeHost(pinned), "cudaFreeHost");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST(NcclCommunicator, ThenRunsWhenTheEventCompletes) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  TensorView data = upload(*comm, encoded(comm->rank(), 4096));
  auto ran = std::make_shared<std::atomic<int>>(0);
  WorkPtr work = comm->allreduce(data, on(data));
  WorkPtr after = work->then([ran](const Work& done) {
    EXPECT_TRUE(done.is_completed());
    EXPECT_EQ(done.exception(), nullptr);
    ran->fetch_add(1);
  });
  // Nobody waits on `work`: the progress thread completes it and runs the callback.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!after->is_completed() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  after->wait();
  EXPECT_EQ(ran->load(), 1);
  // compute() runs on the progress thread.
  auto computed = std::make_shared<std::atomic<int>>(0);
  comm->compute([computed] { computed->fetch_add(1); })->wait();
  EXPECT_EQ(computed->load(), 1);
}

TEST(NcclCommunicator, HostTensorIsInvalidArgument) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  std::vector<float> host(16, 1.0f);
  AllreduceOptions options;
  options.label = "bucket 3";
  try {
    comm->allreduce(TensorView::host(host.data(), 16), ExecContext::host(), options);
    FAIL() << "a host tensor was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("allreduce input of 'bucket 3' is on host"), std::string::npos)
        << e.message();
  }
  EXPECT_FALSE(comm->poisoned());
}

TEST(NcclCommunicator, SplitNodeLocalAndGroup) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  CommunicatorPtr local = comm->split_node_local();
  ASSERT_NE(local, nullptr);
  EXPECT_EQ(local->size(), comm->size());  // one machine
  std::vector<int> members(static_cast<size_t>(comm->size()));
  for (int r = 0; r < comm->size(); ++r) members[static_cast<size_t>(r)] = comm->size() - 1 - r;
  CommunicatorPtr reversed = comm->group(members);
  ASSERT_EQ(reversed->rank(), comm->size() - 1 - comm->rank());
  TensorView data = upload(*reversed, encoded(reversed->rank(), 64));
  reversed->allreduce(data, on(data))->wait();
  const std::vector<float> got = download(data);
  for (int64_t i = 0; i < 64; ++i) {
    float expected = 0.0f;
    for (int r = 0; r < comm->size(); ++r) expected += static_cast<float>(encode(r, i));
    ASSERT_EQ(got[static_cast<size_t>(i)], expected) << "element " << i;
  }
}

// allocate() reuses a released block of the same size class from the
// communicator's pool, zeroed again (its bytes were 0xff when released),
// and a block of another size class is a different one. Local: each rank
// checks its own.
TEST(NcclCommunicator, AllocateReusesPooledBlocksZeroed) {
  SKIP_WITHOUT_GPUS();
  CommunicatorPtr comm = shared_comm();
  void* first = nullptr;
  {
    TensorView a = comm->allocate(1000, DType::f32);
    first = a.data;
    check_cuda(cudaMemset(a.data, 0xff, a.nbytes()), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  TensorView b = comm->allocate(1000, DType::f32);
  EXPECT_EQ(b.data, first) << "the released block was not reused";
  const std::vector<float> got = download(b);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f) << "element " << i;
  TensorView c = comm->allocate(1 << 20, DType::f32);  // another size class
  EXPECT_NE(c.data, b.data);
  EXPECT_EQ(download(c), std::vector<float>(static_cast<size_t>(1) << 20, 0.0f));
}

// A receive whose sender never sends: Timeout within the short timeout (from
// the call, when NCCL's connection setup already waits for the peer, or
// from wait()), then the communicator is aborted and poisoned. Nothing hangs.
TEST(NcclCommunicator, StuckReceiveTimesOutAndPoisons) {
  SKIP_WITHOUT_GPUS();
  if (world_size() < 2) GTEST_SKIP() << "skipped: needs 2 ranks";
  CommunicatorPtr comm = own_comm(std::chrono::milliseconds(3000));
  if (comm->rank() == 0) {
    TensorView in = comm->allocate(1024, DType::f32);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(
        {
          WorkPtr work = comm->point_to_point({P2POp::recv(1, in)}, on(in));
          work->wait();
        },
        Timeout);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
    EXPECT_TRUE(comm->poisoned());
    EXPECT_THROW(comm->allreduce(in, on(in)), CommunicatorPoisoned);
  }
  test::world()->barrier()->wait();
  comm.reset();  // rank 1's finalize is bounded by the timeout too
  test::world()->barrier()->wait();
}

// The watchdog's bookkeeping (src/nccl/watchdog.h), without a device: an
// operation is overdue exactly once the timeout passed since it was
// submitted, a zero timeout never expires, and the Timeout and the poison
// reason name the operation, the rank and the device.
TEST(NcclWatchdog, OverdueAfterTheTimeoutAndNamesTheOperation) {
  using std::chrono::milliseconds;
  const nccl::Watchdog watchdog(milliseconds(1500));
  const auto t0 = nccl::Watchdog::Clock::now();
  EXPECT_TRUE(watchdog.enabled());
  EXPECT_FALSE(watchdog.overdue(t0, t0));
  EXPECT_FALSE(watchdog.overdue(t0, t0 + milliseconds(1499)));
  EXPECT_TRUE(watchdog.overdue(t0, t0 + milliseconds(1500)));
  EXPECT_TRUE(watchdog.overdue(t0, t0 + milliseconds(90000)));
  const nccl::Watchdog off(milliseconds(0));
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.overdue(t0, t0 + std::chrono::hours(24)));
  const std::string op = "allreduce #7 (nccl, 4096 x f32, 'bucket 3')";
  const std::string message = watchdog.timeout_message("rank 1 (cuda:0)", op, milliseconds(1503));
  EXPECT_EQ(message,
            "rank 1 (cuda:0): allreduce #7 (nccl, 4096 x f32, 'bucket 3') was still pending 1503 "
            "ms after it was submitted (timeout 1500 ms); the watchdog failed it and aborted the "
            "NCCL communicator (ncclCommAbort)");
  EXPECT_EQ(watchdog.poison_reason(op),
            "watchdog: allreduce #7 (nccl, 4096 x f32, 'bucket 3') pending past the timeout of "
            "1500 ms; ncclCommAbort called");
}

// Holds a stream on the host until released: a host function that spins on
// a flag (it makes no CUDA call, as host functions must not).
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    while (!gate->open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// An operation nobody waits on, stuck behind a caller stream that never
// moves: the progress thread's watchdog fails its Work with Timeout naming
// the operation, the rank and the device once the communicator's timeout
// passed, aborts the NCCL communicator and poisons this one, so later calls
// throw CommunicatorPoisoned naming the watchdog. Every rank runs it on a
// group of its own (one NCCL rank: the sum is a local copy, so nothing of
// the aborted NCCL communicator runs once the stream moves again), so it
// runs at 1 rank too; the parent communicator is not poisoned.
TEST(NcclCommunicator, WatchdogFailsAnOperationNobodyWaitsOn) {
  SKIP_WITHOUT_GPUS();
  const auto timeout = std::chrono::milliseconds(1000);
  CommunicatorPtr parent = own_comm(timeout);
  CommunicatorPtr comm = parent->group({parent->rank()});
  TensorView data = upload(*comm, encoded(parent->rank(), 256));
  cudaStream_t blocked = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&blocked, cudaStreamNonBlocking), "cudaStreamCreate");
  auto gate = std::make_unique<StreamGate>();
  check_cuda(cudaLaunchHostFunc(blocked, &StreamGate::hold, gate.get()), "cudaLaunchHostFunc");
  AllreduceOptions options;
  options.label = "bucket 5";
  const auto start = std::chrono::steady_clock::now();
  WorkPtr work = comm->allreduce(data, on(data, blocked), options);
  // Nobody calls wait(): only looks, for at most 30 s.
  while (!work->is_completed() &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(work->is_completed()) << "the watchdog did not fail the operation within 30 s";
  EXPECT_GE(elapsed, timeout);
  const std::string who = detail::concat("rank ", comm->rank(), " (", data.device, ")");
  try {
    std::rethrow_exception(work->exception());
  } catch (const Timeout& e) {
    EXPECT_NE(e.message().find(who + ": allreduce #"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("'bucket 5'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("the watchdog failed it"), std::string::npos) << e.message();
  } catch (...) {
    ADD_FAILURE() << "the watchdog's failure is not a Timeout";
  }
  EXPECT_TRUE(comm->poisoned());
  try {
    comm->allreduce(data, on(data));
    ADD_FAILURE() << "a poisoned communicator accepted an allreduce";
  } catch (const CommunicatorPoisoned& e) {
    EXPECT_NE(e.message().find("watchdog: allreduce #"), std::string::npos) << e.message();
  }
  EXPECT_FALSE(parent->poisoned());
  gate->open.store(true);  // the stream drains; the aborted communicator is released
  check_cuda(cudaStreamSynchronize(blocked), "cudaStreamSynchronize");
  check_cuda(cudaStreamDestroy(blocked), "cudaStreamDestroy");
  comm.reset();
  parent.reset();
  test::world()->barrier()->wait();
}

// NCCL rejects a host pointer passed as device memory when NCCL_CHECK_POINTERS=1
// (set by CTest: its argument check finds no device pointer for pageable host
// memory): DeviceError naming the rank, the device, the call and the tensor;
// the communicator is poisoned. Skipped where that rejection cannot be relied
// on, since a kernel reading a host pointer would break the CUDA context of
// this process: without NCCL_CHECK_POINTERS=1, and on devices that access
// pageable host memory directly (HMM, ATS), where the pointer is valid. Last
// in the file for the same reason.
TEST(NcclCommunicator, NcclErrorNamesCallRankAndDevice) {
  SKIP_WITHOUT_GPUS();
  const char* check_pointers = std::getenv("NCCL_CHECK_POINTERS");
  if (check_pointers == nullptr || std::string(check_pointers) != "1")
    GTEST_SKIP() << "skipped: NCCL_CHECK_POINTERS=1 is not set (NCCL would not reject a host "
                    "pointer before its kernel reads it)";
  CommunicatorPtr comm = own_comm(std::chrono::milliseconds(20000));
  TensorView probe = comm->allocate(1, DType::f32);
  int pageable = 0;
  check_cuda(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, probe.device.index),
             "cudaDeviceGetAttribute");
  // Every rank decides alike (the same machine), so no rank is left in a collective.
  if (pageable != 0)
    GTEST_SKIP() << "skipped: cuda:" << probe.device.index
                 << " accesses pageable host memory directly, so NCCL accepts a host pointer";
  std::vector<float> host(16, 1.0f);
  const TensorView fake(host.data(), 16, DType::f32, probe.device);
  AllreduceOptions options;
  options.label = "bucket 3";
  const std::string who = detail::concat("rank ", comm->rank(), " (", probe.device, ")");
  try {
    comm->allreduce(fake, on(fake), options)->wait();
    FAIL() << "NCCL accepted a host pointer";
  } catch (const DeviceError& e) {
    EXPECT_NE(e.message().find(who + ": ncclAllReduce of 'bucket 3': "), std::string::npos)
        << e.message();
  }
  EXPECT_TRUE(comm->poisoned());
  EXPECT_THROW(comm->barrier(), CommunicatorPoisoned);
  test::world()->barrier()->wait();
}

}  // namespace
}  // namespace relaxcc
