// Relaxed primitives on device tensors (relaxcc/relaxed/compressed_allreduce.h,
// "Device tensors"). Without a GPU: the primitives that take host tensors only
// refuse device tensors with Unsupported at their entry, before touching
// memory, and the compressed allreduce refuses a communicator that cannot
// move device memory (MPI). With a GPU and NCCL: the compressed allreduce on
// device tensors over NCCL equals the host path over MPI bit for bit (results
// and error-feedback residuals), and rejects a corrupt payload on every rank.
// GPU cases skip with the reason when no device (or, at 2 ranks, fewer
// devices than ranks: NCCL refuses two ranks on one GPU) is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/forwarding_communicator.h"
#include "relaxcc/kernels/cuda_runtime.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/nccl_communicator.h"
#include "relaxcc/relaxed/async_average.h"
#include "relaxcc/relaxed/auto_codec.h"
#include "relaxcc/relaxed/choco_gossip.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "relaxcc/relaxed/gossip.h"
#include "relaxcc/relaxed/group_average.h"
#include "relaxcc/relaxed/sparse_allreduce.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;
using test::world;

// What `fn` threw as E (the test fails otherwise): its message.
template <typename E>
std::string thrown(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another error: " << e.what();
    return {};
  }
  ADD_FAILURE() << "threw nothing";
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Host memory labelled as cuda:0: the entry checks must refuse it before
// reading or writing it (reading it as device memory would fault on a GPU).
struct FakeDeviceTensor {
  std::vector<float> memory = std::vector<float>(64, 1.0f);
  TensorView view() { return TensorView(memory.data(), 64, DType::f32, Device::cuda(0)); }
  static ExecContext context() {
    ExecContext ctx;
    ctx.device = Device::cuda(0);
    return ctx;
  }
};

TEST(DeviceEntry, HostOnlyPrimitivesRefuseDeviceTensors) {
  auto comm = world();
  FakeDeviceTensor t;
  const ExecContext ctx = FakeDeviceTensor::context();
  const auto names = [](const std::string& what, const char* primitive) {
    EXPECT_TRUE(contains(what, primitive)) << what;
    EXPECT_TRUE(contains(what, "cuda:0")) << what;
    EXPECT_TRUE(contains(what, "rank " + std::to_string(test::world_rank()))) << what;
  };
  names(thrown<Unsupported>([&] { gossip(*comm, t.view(), ctx); }), "gossip");
  names(thrown<Unsupported>([&] { group_average(*comm, t.view(), ctx); }), "group_average");
  ChocoGossip choco(comm, 64);
  names(thrown<Unsupported>([&] { choco.step(t.view(), 1, ctx); }), "ChocoGossip");
  std::mutex lock;
  names(thrown<Unsupported>([&] { AsyncModelAverager averager(comm, t.view(), lock); }),
        "AsyncModelAverager");
  names(thrown<Unsupported>([&] { AutoCodec::calibrate(*comm, ctx); }), "AutoCodec::calibrate");
  // A host tensor with a device context is refused the same way.
  std::vector<float> host(64, 1.0f);
  names(thrown<Unsupported>([&] { gossip(*comm, TensorView::host(host.data(), 64), ctx); }),
        "gossip");
  // The communicator is still in step: a host gossip round goes through.
  gossip(*comm, TensorView::host(host.data(), 64), ExecContext::host())->wait();
}

// sparse_allreduce takes device tensors (random-k and top-k) over a
// communicator that moves device memory: on MPI (host memory) it refuses
// them with Unsupported naming the call, the rank, the device and NCCL; a
// context on another device is InvalidArgument. Nothing is read or written.
TEST(DeviceEntry, SparseAllreduceChecksDeviceTensors) {
  auto comm = world();
  FakeDeviceTensor t;
  const ExecContext ctx = FakeDeviceTensor::context();
  const std::string rank = "rank " + std::to_string(test::world_rank());
  SparseAllreduceOptions o;  // randomk
  const std::string on_mpi =
      thrown<Unsupported>([&] { sparse_allreduce(*comm, t.view(), ctx, o); });
  EXPECT_TRUE(contains(on_mpi, "sparse_allreduce")) << on_mpi;
  EXPECT_TRUE(contains(on_mpi, "cuda:0")) << on_mpi;
  EXPECT_TRUE(contains(on_mpi, rank)) << on_mpi;
  EXPECT_TRUE(contains(on_mpi, "NCCL")) << on_mpi;
  o.codec.kind = CompressorKind::topk;
  o.codec.ratio = 0.25;
  o.feedback = nullptr;
  const std::string topk = thrown<Unsupported>([&] { sparse_allreduce(*comm, t.view(), ctx, o); });
  EXPECT_TRUE(contains(topk, "sparse_allreduce")) << topk;
  EXPECT_TRUE(contains(topk, "cuda:0")) << topk;
  EXPECT_TRUE(contains(topk, rank)) << topk;
  EXPECT_TRUE(contains(topk, "NCCL")) << topk;
  const std::string mixed = thrown<InvalidArgument>(
      [&] { sparse_allreduce(*comm, t.view(), ExecContext::host(), SparseAllreduceOptions{}); });
  EXPECT_TRUE(contains(mixed, "expected the same device")) << mixed;
  EXPECT_EQ(t.memory, std::vector<float>(64, 1.0f));
  // The communicator is still in step.
  std::vector<float> host(64, 1.0f);
  sparse_allreduce(*comm, TensorView::host(host.data(), 64), ExecContext::host())->wait();
}

TEST(DeviceEntry, CompressedAllreduceOnMpiRefusesDeviceTensors) {
  auto comm = world();
  FakeDeviceTensor t;
  const ExecContext ctx = FakeDeviceTensor::context();
  CompressedAllreduceOptions o;
  // The MPI communicator allocates host memory: refused before anything is read.
  const std::string what =
      thrown<Unsupported>([&] { compressed_allreduce(*comm, t.view(), ctx, o); });
  EXPECT_TRUE(contains(what, "compressed_allreduce")) << what;
  EXPECT_TRUE(contains(what, "cuda:0")) << what;
  EXPECT_TRUE(contains(what, "NCCL")) << what;
  // A context on another device than the tensor.
  const std::string mixed = thrown<InvalidArgument>(
      [&] { compressed_allreduce(*comm, t.view(), ExecContext::host(), o); });
  EXPECT_TRUE(contains(mixed, "expected the same device")) << mixed;
  // Robust aggregation sorts on the host.
  o.op = ReduceOp::avg;
  o.robust.kind = RobustAggregation::Kind::trimmed_mean;
  o.robust.trim = 0;
  const std::string robust =
      thrown<Unsupported>([&] { compressed_allreduce(*comm, t.view(), ctx, o); });
  EXPECT_TRUE(contains(robust, "robust aggregation")) << robust;
  // No CUDA kernel encodes the sign codec.
  o = {};
  o.codec = CompressorConfig{};
  o.codec->kind = CompressorKind::sign;
  const std::string sign =
      thrown<Unsupported>([&] { compressed_allreduce(*comm, t.view(), ctx, o); });
  EXPECT_TRUE(contains(sign, "sign codec on cuda:0")) << sign;
  EXPECT_EQ(t.memory, std::vector<float>(64, 1.0f));
  // The communicator is still in step.
  std::vector<float> host(64, 1.0f);
  compressed_allreduce(*comm, TensorView::host(host.data(), 64), ExecContext::host())->wait();
}

// ---- on a GPU, over NCCL ------------------------------------------------------

// Device memory of n floats, copied from and to the host (legacy stream).
class DeviceFloats {
 public:
  DeviceFloats(const std::vector<float>& host, int device)
      : n_(static_cast<int64_t>(host.size())),
        memory_(kernels::cuda::allocate(host.size() * sizeof(float), device, nullptr)),
        device_(device) {
    kernels::cuda::copy_async(memory_.get(), host.data(), host.size() * sizeof(float), nullptr);
    kernels::cuda::synchronize(nullptr);
  }
  TensorView view() const {
    return TensorView(memory_.get(), n_, DType::f32, Device::cuda(device_), memory_);
  }
  std::vector<float> to_host() const {
    std::vector<float> out(static_cast<size_t>(n_));
    kernels::cuda::copy_async(out.data(), memory_.get(), out.size() * sizeof(float), nullptr);
    kernels::cuda::synchronize(nullptr);
    return out;
  }

 private:
  int64_t n_;
  std::shared_ptr<void> memory_;
  int device_;
};

// The GPU fixture: an NCCL communicator over the world, one device per rank.
class DeviceCompressed : public ::testing::Test {
 protected:
  void SetUp() override {
    const kernels::CudaAvailability cuda = kernels::cuda_availability();
    if (cuda.device_count == 0) GTEST_SKIP() << "no CUDA device: " << cuda.reason;
    if (cuda.device_count < test::world_size())
      GTEST_SKIP() << test::world_size() << " ranks, " << cuda.device_count
                   << " CUDA device(s): NCCL refuses two ranks on one GPU";
    device_ = test::world_rank() % cuda.device_count;
    NcclCommunicatorOptions o;
    o.device = device_;
    o.bootstrap = world();
    try {
      nccl_ = create_nccl_communicator(o);
    } catch (const Unsupported& e) {
      GTEST_SKIP() << "no NCCL communicator: " << e.message();
    }
    kernels::cuda::set_device(device_);
  }
  ExecContext device_context() const {
    ExecContext ctx;
    ctx.device = Device::cuda(device_);
    return ctx;  // the legacy default stream
  }
  // A sparse allreduce with options `o` on which the ranks disagree, of
  // x[i] = test::encode(rank, i) (1000 elements, on the device) with error
  // feedback (a residual of one nonzero element; o.feedback is set here):
  // expects PeerMismatch on this rank, x and the residual as they were,
  // and the communicator not poisoned.
  void expect_disagreement_fails_every_rank(SparseAllreduceOptions o);

  int device_ = 0;
  CommunicatorPtr nccl_;
};

// Values in [-1, 1] drawn from (seed, rank), with a few larger ones.
std::vector<float> data(int64_t n, int rank, unsigned seed) {
  std::mt19937 rng(seed * 1000u + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = u(rng);
  for (size_t i = 0; i < v.size(); i += 997) v[i] *= 40.0f;
  return v;
}

std::vector<float> saved(const CompressedAllreduceState& s, const char* which) {
  StateDict d;
  s.save(d, "s.");
  return d.get_floats(std::string("s.") + which);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(DeviceCompressed, EqualsHostPathBitForBit) {
  auto host_comm = world();
  const int r = host_comm->rank(), n = host_comm->size();
  // 100000 elements in 16384-element pieces: several segments per call.
  const int64_t numel = 100000;
  std::vector<std::optional<CompressorConfig>> codecs;
  for (int bits : {8, 4}) {
    CompressorConfig c;
    c.kind = CompressorKind::minmax;
    c.bits = bits;
    c.chunk = 256;
    codecs.push_back(c);
  }
  CompressorConfig sr;
  sr.kind = CompressorKind::minmax;
  sr.rounding = kernels::Rounding::stochastic;
  codecs.push_back(sr);
  for (CompressorKind k : {CompressorKind::f16, CompressorKind::bf16}) {
    CompressorConfig c;
    c.kind = k;
    codecs.push_back(c);
  }
  codecs.push_back(std::nullopt);  // f32 on the wire
  for (size_t v = 0; v < codecs.size(); ++v) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      CompressedAllreduceState host_state(numel, r, n);
      CompressedAllreduceState device_state(numel, r, n, Device::cuda(device_));
      RelaxedStats host_stats, device_stats;
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> x = data(numel, r, static_cast<unsigned>(step + 10 * v));
        std::vector<float> on_host = x;
        DeviceFloats on_device(x, device_);
        CompressedAllreduceOptions o;
        o.codec = codecs[v];
        o.op = op;
        o.segment_bytes = 64 << 10;
        ExecContext host_ctx = ExecContext::host(), device_ctx = device_context();
        host_ctx.rng = device_ctx.rng = {7, static_cast<uint64_t>(step) << 32};
        o.state = &host_state;
        o.stats = &host_stats;
        compressed_allreduce(*host_comm, TensorView::host(on_host.data(), numel), host_ctx, o)
            ->wait();
        o.state = &device_state;
        o.stats = &device_stats;
        WorkPtr w = compressed_allreduce(*nccl_, on_device.view(), device_ctx, o);
        EXPECT_TRUE(w->is_completed());
        w->wait();
        EXPECT_TRUE(same_bits(on_device.to_host(), on_host))
            << "codec " << v << " op " << op << " step " << step;
        EXPECT_TRUE(same_bits(saved(device_state, "worker"), host_state.worker()))
            << "codec " << v << " step " << step;
        EXPECT_TRUE(same_bits(saved(device_state, "server"), host_state.server()))
            << "codec " << v << " step " << step;
      }
      const RelaxedCounts on_device = device_stats.counts(), on_host = host_stats.counts();
      EXPECT_EQ(on_device.rounds, on_host.rounds);
      EXPECT_EQ(on_device.sent_to, on_host.sent_to);
      EXPECT_EQ(on_device.received_from, on_host.received_from);
    }
  }
}

// Random-k sparse allreduce on device tensors over NCCL equals the host path
// over MPI bit for bit, with worker-side error feedback, over three calls
// whose step rolls the selection: results and residuals. The data are small
// integers encoding (rank, index, step), so every sum is exact in f32 and
// the reduction order (NCCL's or MPI's) does not matter. The call returns a
// completed Work.
TEST_F(DeviceCompressed, SparseRandomkEqualsHostPathBitForBit) {
  auto host_comm = world();
  const int r = host_comm->rank();
  const int64_t numel = 5000;
  for (auto mode : {kernels::RandomKMode::stratified, kernels::RandomKMode::rolling}) {
    kernels::ErrorFeedback host_feedback(numel), device_feedback(numel);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> x(static_cast<size_t>(numel));
      for (int64_t i = 0; i < numel; ++i)
        x[static_cast<size_t>(i)] = static_cast<float>(test::encode(r, i + 13 * step));
      std::vector<float> on_host = x;
      DeviceFloats on_device(x, device_);
      SparseAllreduceOptions o;
      o.codec.kind = CompressorKind::randomk;
      o.codec.ratio = 0.1;
      o.codec.seed = 42;
      o.codec.step = static_cast<uint64_t>(step);
      o.codec.random_mode = mode;
      o.feedback = &host_feedback;
      sparse_allreduce(*host_comm, TensorView::host(on_host.data(), numel), ExecContext::host(), o)
          ->wait();
      o.feedback = &device_feedback;
      WorkPtr w = sparse_allreduce(*nccl_, on_device.view(), device_context(), o);
      EXPECT_TRUE(w->is_completed());
      w->wait();
      EXPECT_TRUE(same_bits(on_device.to_host(), on_host)) << "step " << step;
      EXPECT_TRUE(same_bits(device_feedback.residual(), host_feedback.residual()))
          << "step " << step;
    }
  }
}

void DeviceCompressed::expect_disagreement_fails_every_rank(SparseAllreduceOptions o) {
  const int64_t numel = 1000;
  std::vector<float> x(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i)
    x[static_cast<size_t>(i)] = static_cast<float>(test::encode(nccl_->rank(), i));
  DeviceFloats on_device(x, device_);
  kernels::ErrorFeedback feedback(numel);
  feedback.residual()[3] = 0.5f;
  const std::vector<float> residual = feedback.residual();
  o.feedback = &feedback;
  WorkPtr w = sparse_allreduce(*nccl_, on_device.view(), device_context(), o);
  EXPECT_THROW(w->wait(), PeerMismatch);
  EXPECT_TRUE(same_bits(on_device.to_host(), x));
  EXPECT_TRUE(same_bits(feedback.residual(), residual));
  EXPECT_FALSE(nccl_->poisoned());
}

// Ranks that disagree on the random-k selection (rank 1's seed differs):
// every rank throws PeerMismatch, and x and the residual stay as they were.
TEST_F(DeviceCompressed, SparseRandomkSelectionMismatchFailsEveryRank) {
  const int r = nccl_->rank(), n = nccl_->size();
  if (n < 2) GTEST_SKIP() << "skipped: one rank cannot disagree with itself";
  SparseAllreduceOptions o;
  o.codec.ratio = 0.25;
  o.codec.seed = r == 1 ? 8 : 7;
  expect_disagreement_fails_every_rank(o);
}

// Top-k sparse allreduce on device tensors over NCCL equals the host path
// over MPI bit for bit, with worker- and server-side error feedback, sum
// and avg, over three calls whose step rotates the shares: results,
// residuals and traffic. The data are small integers encoding (rank,
// index, step), with many equal magnitudes (ties) and signs, so every sum
// is exact in f32; k = 1, a few, and every element.
TEST_F(DeviceCompressed, SparseTopkEqualsHostPathBitForBit) {
  auto host_comm = world();
  const int r = host_comm->rank(), n = host_comm->size();
  const int64_t numel = 5003;
  for (const int64_t keep : {int64_t{1}, int64_t{7}, int64_t{600}, numel}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const int64_t owned = sparse_allreduce_owned(numel, r, n);
      kernels::ErrorFeedback host_worker(numel), device_worker(numel);
      kernels::ErrorFeedback host_server(owned), device_server(owned);
      RelaxedStats host_stats, device_stats;
      for (int step = 0; step < 3; ++step) {
        std::vector<float> x(static_cast<size_t>(numel));
        for (int64_t i = 0; i < numel; ++i) {
          const int64_t e = test::encode(r, (i + 13 * step) % 64);  // ties
          x[static_cast<size_t>(i)] = static_cast<float>(i % 3 == 0 ? -e : e);
        }
        std::vector<float> on_host = x;
        DeviceFloats on_device(x, device_);
        SparseAllreduceOptions o;
        o.codec.kind = CompressorKind::topk;
        o.codec.keep = keep;
        o.codec.step = static_cast<uint64_t>(step);
        o.codec.approximate = step == 1;
        o.op = op;
        o.feedback = &host_worker;
        o.server_feedback = &host_server;
        o.stats = &host_stats;
        sparse_allreduce(*host_comm, TensorView::host(on_host.data(), numel), ExecContext::host(),
                         o)
            ->wait();
        o.feedback = &device_worker;
        o.server_feedback = &device_server;
        o.stats = &device_stats;
        WorkPtr w = sparse_allreduce(*nccl_, on_device.view(), device_context(), o);
        EXPECT_TRUE(w->is_completed());
        w->wait();
        const std::string where = "keep " + std::to_string(keep) + " op " +
                                  std::to_string(static_cast<int>(op)) + " step " +
                                  std::to_string(step);
        EXPECT_TRUE(same_bits(on_device.to_host(), on_host)) << where;
        EXPECT_TRUE(same_bits(device_worker.residual(), host_worker.residual())) << where;
        EXPECT_TRUE(same_bits(device_server.residual(), host_server.residual())) << where;
      }
      const RelaxedCounts on_device = device_stats.counts(), on_host = host_stats.counts();
      EXPECT_EQ(on_device.rounds, on_host.rounds);
      EXPECT_EQ(on_device.sent_to, on_host.sent_to);
      EXPECT_EQ(on_device.received_from, on_host.received_from);
    }
  }
}

// Ranks that disagree on the top-k call (rank 1 selects approximately, so
// the blocks' layout agrees but the fingerprints differ): every rank
// throws PeerMismatch, x and the worker residual stay as they were, and
// the communicator stays usable.
TEST_F(DeviceCompressed, SparseTopkMismatchFailsEveryRank) {
  const int r = nccl_->rank(), n = nccl_->size();
  if (n < 2) GTEST_SKIP() << "skipped: one rank cannot disagree with itself";
  SparseAllreduceOptions o;
  o.codec.kind = CompressorKind::topk;
  o.codec.keep = 10;
  o.codec.approximate = r == 1;
  expect_disagreement_fails_every_rank(o);
}

TEST_F(DeviceCompressed, StateSavesAndLoadsBitForBit) {
  const int r = nccl_->rank(), n = nccl_->size();
  CompressedAllreduceState state(1000, r, n, Device::cuda(device_));
  std::vector<float> worker = data(1000, r, 3);
  std::vector<float> server(static_cast<size_t>(saved(state, "server").size()), 0.5f);
  StateDict d;
  d.put_floats("s.worker", worker);
  d.put_floats("s.server", server);
  state.load(d, "s.");
  EXPECT_TRUE(same_bits(saved(state, "worker"), worker));
  EXPECT_TRUE(same_bits(saved(state, "server"), server));
  EXPECT_TRUE(state.worker().empty());  // a device state keeps them on the device
  d.put_floats("s.worker", std::vector<float>(999));
  EXPECT_THROW(state.load(d, "s."), InvalidArgument);
}

// Forwards to an NCCL communicator; rank `bad` overwrites the first chunk's
// min of its first alltoallv payload to its right neighbour with NaN.
class CorruptingCommunicator final : public ForwardingCommunicator {
 public:
  CorruptingCommunicator(CommunicatorPtr inner, int bad)
      : ForwardingCommunicator(std::move(inner)), bad_(bad) {}
  WorkPtr alltoallv(const TensorView& in, const std::vector<int64_t>& send_counts,
                    const TensorView& out, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& o) override {
    // The device schedule submits each alltoallv once its payloads were
    // written (stream synchronized): corrupt it now, once.
    if (rank() == bad_ && !done_) {
      done_ = true;
      const int to = (rank() + 1) % size();
      int64_t offset = 0;
      for (int p = 0; p < to; ++p) offset += send_counts[static_cast<size_t>(p)];
      const float nan = NAN;
      kernels::cuda::copy_async(static_cast<unsigned char*>(in.data) + offset + 48, &nan,
                                sizeof nan, ctx.stream);
      kernels::cuda::synchronize(ctx.stream);
    }
    return inner_->alltoallv(in, send_counts, out, recv_counts, ctx, o);
  }

 private:
  int bad_;
  bool done_ = false;
};

TEST_F(DeviceCompressed, CorruptPayloadFailsEveryRankAndChangesNothing) {
  const int r = nccl_->rank(), n = nccl_->size();
  if (n < 2) GTEST_SKIP() << "one rank: nothing is exchanged";
  CorruptingCommunicator comm(nccl_, 0);
  const int64_t numel = 50000;
  const std::vector<float> x = data(numel, r, 5);
  DeviceFloats on_device(x, device_);
  CompressedAllreduceState state(numel, r, n, Device::cuda(device_));
  CompressedAllreduceOptions o;
  o.state = &state;
  WorkPtr w = compressed_allreduce(comm, on_device.view(), device_context(), o);
  const std::string what = thrown<CorruptPayload>([&] { w->wait(); });
  EXPECT_FALSE(what.empty());
  EXPECT_TRUE(same_bits(on_device.to_host(), x));
  EXPECT_TRUE(same_bits(saved(state, "worker"), std::vector<float>(numel, 0.0f)));
  // The communicator is still in step: the next call succeeds on every rank.
  compressed_allreduce(*nccl_, on_device.view(), device_context(), o)->wait();
}

}  // namespace
}  // namespace relaxcc
