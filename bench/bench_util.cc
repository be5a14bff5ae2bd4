#include "bench_util.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "relaxcc/create_communicator.h"
#include "relaxcc/element_cast.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/reduce.h"
#include "relaxcc/launch.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc::bench {

namespace {

// The UCX communicator of the next generation on world's store.
CommunicatorPtr create_on_store(BenchWorld& world, const Tunables& tunables, int rank, int size) {
  UcxCommunicatorOptions o;
  o.tunables = tunables;
  o.store = world.ucx_store;
  o.rendezvous.rank = rank;
  o.rendezvous.size = size;
  o.rendezvous.job = "relaxcc-bench";
  o.rendezvous.generation = world.ucx_generation++;
  if (world.mpi()) o.net_devices = "lo";
  return create_ucx_communicator(o);
}

}  // namespace

BenchWorld::BenchWorld(bool without_mpirun) : tunables(Tunables::from_env()) {
  if (LaunchEnvironment::from_env().launcher != Launcher::mpi) {
    const RendezvousOptions r = RendezvousOptions::from_env();
    if (!r.host.empty()) {
      RELAXCC_ENFORCE(without_mpirun, InvalidArgument, "started without mpirun (rendezvous at ",
                      r.address(),
                      "): only relaxcc-bench allreduce --transport ucx runs so; this mode needs "
                      "mpirun");
      RELAXCC_ENFORCE(r.rank >= 0 && r.size >= 1, InvalidArgument,
                      "relaxcc-bench without mpirun: set RANK and WORLD_SIZE (rendezvous at ",
                      r.address(), ")");
      TcpStoreOptions t;
      t.host = r.host;
      t.port = r.port;
      t.is_server = r.rank == 0;
      t.timeout = r.timeout;
      ucx_store = std::make_shared<TcpStore>(t);
      mpi_ = false;
      control = create_on_store(*this, tunables, r.rank, r.size);
      rank = control->rank();
      size = control->size();
      return;
    }
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    owns_mpi_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
}

BenchWorld::~BenchWorld() {
  keep_alive.clear();
  relaxcc_root.reset();
  ucx_root.reset();
  // Rank 0 serves the store: it goes once every rank is done with it.
  try {
    barrier();
  } catch (const Error& e) {
    std::fprintf(stderr, "relaxcc-bench: the last barrier failed: %s\n", e.what());
  }
  control.reset();
  ucx_store.reset();
  if (owns_mpi_) MPI_Finalize();
}

void add_transport_option(CLI::App* sub, std::string& transport) {
  sub->add_option("--transport", transport,
                  "The wing of relaxcc's communicators: mpi (create_mpi_communicator) or ucx "
                  "(create_ucx_communicator: RELAXCC_RENDEZVOUS or MASTER_ADDR/MASTER_PORT when "
                  "set, else a store served by rank 0 on 127.0.0.1)")
      ->check(CLI::IsMember({"mpi", "ucx"}))
      ->capture_default_str();
}

CommunicatorPtr create_communicator(BenchWorld& world, const std::string& transport,
                                    const Tunables& tunables) {
  // The environment names the rendezvous (and the ranks), or MPI's world is
  // the communicator: the library's choice.
  RELAXCC_ENFORCE(world.mpi() || transport == "ucx", InvalidArgument,
                  "relaxcc-bench without mpirun: --transport ucx (not ", transport, ")");
  if (world.mpi() && (transport != "ucx" || !RendezvousOptions::from_env().host.empty()))
    return relaxcc::create_communicator(transport, tunables);
  if (!world.ucx_store) {
    TcpStoreOptions t;
    t.is_server = world.rank == 0;
    int port = 0;
    if (t.is_server) {
      auto served = std::make_shared<TcpStore>(t);
      port = served->port();
      world.ucx_store = served;
    }
    MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
    t.port = static_cast<uint16_t>(port);
    if (!world.ucx_store) world.ucx_store = std::make_shared<TcpStore>(t);
  }
  return create_on_store(world, tunables, world.rank, world.size);
}

double BenchWorld::max_over_ranks(double v) const {
  double out = v;
  if (!mpi_) {
    AllreduceOptions o;
    o.op = ReduceOp::max;
    control->allreduce(TensorView::host(&out, 1), ExecContext::host(), o)->wait();
  } else {
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  return out;
}

int64_t BenchWorld::sum_over_ranks(int64_t v) const {
  int64_t out = v;
  if (!mpi_)
    control->allreduce(TensorView::host(&out, 1), ExecContext::host())->wait();
  else
    MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

void BenchWorld::barrier() const {
  if (!mpi_)
    control->barrier()->wait();
  else
    MPI_Barrier(MPI_COMM_WORLD);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

namespace {

// fill_encoded's element i on rank r.
template <typename T>
T encoded(int rank, int64_t i) {
  return from_double<T>(static_cast<double>((rank + i) % 4));
}

// The exact result at index i: the sum/min/max of (r + i) % 4 over ranks,
// then the division of avg done the way the reduction kernels do it.
template <typename T>
T expected(int64_t i, ReduceOp op, int ranks) {
  int64_t sum = 0, lo = 4, hi = -1;
  for (int r = 0; r < ranks; ++r) {
    const int64_t v = (r + i) % 4;
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (op) {
    case ReduceOp::sum:
      return from_double<T>(static_cast<double>(sum));
    case ReduceOp::min:
      return from_double<T>(static_cast<double>(lo));
    case ReduceOp::max:
      return from_double<T>(static_cast<double>(hi));
    case ReduceOp::avg:
      break;
  }
  T out = from_double<T>(static_cast<double>(sum));
  kernels::finish_average(TensorView{&out, 1, dtype_of<T>()}, ranks, ExecContext::host());
  return out;
}

}  // namespace

TensorView host_buffer(int64_t numel, DType dtype) {
  auto memory = std::make_shared<std::vector<unsigned char>>(
      static_cast<size_t>(std::max<int64_t>(numel, 1)) * dtype_size(dtype));
  return TensorView(memory->data(), numel, dtype, Device::host(), memory);
}

void fill_encoded(const TensorView& t, int rank) {
  visit_dtype(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* p = t.as<T>();
    for (int64_t i = 0; i < t.numel; ++i) p[i] = encoded<T>(rank, i);
  });
}

int64_t count_wrong(const TensorView& t, ReduceOp op, int ranks, int64_t first_index) {
  return visit_dtype(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* p = t.as<T>();
    T want[4];
    for (int k = 0; k < 4; ++k) want[k] = expected<T>(k, op, ranks);
    int64_t wrong = 0;
    for (int64_t i = 0; i < t.numel; ++i)
      wrong += same_element(p[i], want[(first_index + i) % 4]) ? 0 : 1;
    return wrong;
  });
}

std::function<void()> encoded_refill(const TensorView& t, int rank) {
  const TensorView pristine = host_buffer(t.numel, t.dtype);
  fill_encoded(pristine, rank);
  return [t, pristine] {
    if (t.numel > 0) std::memcpy(t.data, pristine.data, t.nbytes());
  };
}

int64_t count_not_encoded(const TensorView& t, int rank) {
  return visit_dtype(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* p = t.as<T>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < t.numel; ++i) wrong += same_element(p[i], encoded<T>(rank, i)) ? 0 : 1;
    return wrong;
  });
}

int64_t count_wrong_gathered(const TensorView& t, int64_t per_rank) {
  int64_t wrong = 0;
  for (int64_t off = 0, owner = 0; off < t.numel; off += per_rank, ++owner)
    wrong +=
        count_not_encoded(t.slice(off, std::min(per_rank, t.numel - off)), static_cast<int>(owner));
  return wrong;
}

namespace {

template <typename Convert, typename Back>
void f32_user_op(void* in, void* inout, int* len, Convert to_f32_fn, Back back) {
  auto* a = static_cast<uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = back(to_f32_fn(a[i]) + to_f32_fn(b[i]));
}
void f16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  f32_user_op(in, inout, len, f16_bits_to_f32, f32_to_f16_bits);
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  f32_user_op(in, inout, len, bf16_bits_to_f32, f32_to_bf16_bits);
}
template <typename Pick>
void f32_pick(void* in, void* inout, int* len, bool bf, Pick pick) {
  auto* a = static_cast<uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf ? bf16_bits_to_f32(a[i]) : f16_bits_to_f32(a[i]);
    const float y = bf ? bf16_bits_to_f32(b[i]) : f16_bits_to_f32(b[i]);
    if (pick(x, y)) b[i] = a[i];
  }
}
void f16_min(void* a, void* b, int* n, MPI_Datatype*) {
  f32_pick(a, b, n, false, std::less<float>());
}
void f16_max(void* a, void* b, int* n, MPI_Datatype*) {
  f32_pick(a, b, n, false, std::greater<float>());
}
void bf16_min(void* a, void* b, int* n, MPI_Datatype*) {
  f32_pick(a, b, n, true, std::less<float>());
}
void bf16_max(void* a, void* b, int* n, MPI_Datatype*) {
  f32_pick(a, b, n, true, std::greater<float>());
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::f16:
    case DType::bf16:
      return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

struct MpiOps {
  MPI_Op half[2][3];  // [bf16][sum, min, max]
  MpiOps() {
    MPI_User_function* fns[2][3] = {{f16_sum, f16_min, f16_max}, {bf16_sum, bf16_min, bf16_max}};
    for (int b = 0; b < 2; ++b)
      for (int k = 0; k < 3; ++k) MPI_Op_create(fns[b][k], 1, &half[b][k]);
  }
  ~MpiOps() {
    for (auto& row : half)
      for (auto& op : row) MPI_Op_free(&op);
  }
  MPI_Op get(DType t, ReduceOp op) const {
    const int k = op == ReduceOp::min ? 1 : op == ReduceOp::max ? 2 : 0;
    if (t == DType::f16 || t == DType::bf16) return half[t == DType::bf16][k];
    return k == 1 ? MPI_MIN : k == 2 ? MPI_MAX : MPI_SUM;
  }
};

}  // namespace

AllreduceFn mpi_allreduce_fn(BenchWorld& world) {
  RELAXCC_ENFORCE(world.mpi(), InvalidArgument,
                  "--impl mpi (MPI_Allreduce) needs mpirun: relaxcc-bench started without it");
  auto ops = std::make_shared<MpiOps>();
  world.keep_alive.push_back(ops);
  const int ranks = world.size;
  return [ops, ranks](const TensorView& input, const TensorView& output, ReduceOp op) {
    RELAXCC_ENFORCE_LE(output.numel, int64_t{INT32_MAX}, InvalidArgument, "MPI_Allreduce count");
    const void* send = input.data == output.data ? MPI_IN_PLACE : input.data;
    const int rc =
        MPI_Allreduce(send, output.data, static_cast<int>(output.numel), mpi_type(output.dtype),
                      ops->get(output.dtype, op), MPI_COMM_WORLD);
    RELAXCC_ENFORCE_EQ(rc, MPI_SUCCESS, CommunicationError, "MPI_Allreduce");
    if (op == ReduceOp::avg) kernels::finish_average(output, ranks, ExecContext::host());
  };
}

ReduceScatterFn mpi_reduce_scatter_fn(BenchWorld& world) {
  auto ops = std::make_shared<MpiOps>();
  world.keep_alive.push_back(ops);
  const int ranks = world.size;
  return [ops, ranks](const TensorView& input, const TensorView& output, ReduceOp op) {
    RELAXCC_ENFORCE_LE(output.numel, int64_t{INT32_MAX}, InvalidArgument,
                       "MPI_Reduce_scatter_block count");
    const int rc = MPI_Reduce_scatter_block(input.data, output.data, static_cast<int>(output.numel),
                                            mpi_type(output.dtype), ops->get(output.dtype, op),
                                            MPI_COMM_WORLD);
    RELAXCC_ENFORCE_EQ(rc, MPI_SUCCESS, CommunicationError, "MPI_Reduce_scatter_block");
    if (op == ReduceOp::avg) kernels::finish_average(output, ranks, ExecContext::host());
  };
}

AllreduceFn p2p_ring_allreduce_fn(BenchWorld& world) {
  const int rank = world.rank, n = world.size;
  const int64_t segment_bytes = std::max<int64_t>(world.tunables.segment_bytes, 1);
  auto scratch = std::make_shared<std::vector<unsigned char>>();
  world.keep_alive.push_back(scratch);
  return [rank, n, segment_bytes, scratch](const TensorView& input, const TensorView& output,
                                           ReduceOp op) {
    if (n == 1) {
      if (input.data != output.data) std::memcpy(output.data, input.data, output.nbytes());
      return;
    }
    const auto esize = static_cast<int64_t>(dtype_size(output.dtype));
    const int64_t seg = std::max<int64_t>(1, segment_bytes / esize);
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    auto chunk = [&](const TensorView& t, int c) {
      const int64_t lo = t.numel * c / n, hi = t.numel * (c + 1) / n;
      return t.slice(lo, hi - lo);
    };
    scratch->resize(static_cast<size_t>((output.numel / n + 1) * esize));
    auto mod = [n](int x) { return ((x % n) + n) % n; };
    // One step: send chunk `out` (from the input on the first reduce-scatter
    // step, the partial sums in the output after), receive chunk `in` segment
    // by segment into the output, combining each segment with the input as it
    // lands (reduce) or in place (gather).
    auto step = [&](int out, int in, bool reduce, bool first, int tag) {
      const TensorView src = chunk(first ? input : output, out), dst = chunk(output, in);
      const TensorView own = chunk(input, in);
      std::vector<MPI_Request> recvs, sends;
      for (int64_t off = 0; off < dst.numel; off += seg) {
        const int64_t len = std::min(seg, dst.numel - off);
        void* target = reduce ? scratch->data() + off * esize : dst.slice(off, len).data;
        recvs.emplace_back();
        MPI_Irecv(target, static_cast<int>(len * esize), MPI_BYTE, left, tag, MPI_COMM_WORLD,
                  &recvs.back());
      }
      for (int64_t off = 0; off < src.numel; off += seg) {
        const int64_t len = std::min(seg, src.numel - off);
        sends.emplace_back();
        MPI_Isend(src.slice(off, len).data, static_cast<int>(len * esize), MPI_BYTE, right, tag,
                  MPI_COMM_WORLD, &sends.back());
      }
      for (size_t k = 0; k < recvs.size(); ++k) {
        MPI_Wait(&recvs[k], MPI_STATUS_IGNORE);
        if (!reduce) continue;
        const int64_t off = static_cast<int64_t>(k) * seg, len = std::min(seg, dst.numel - off);
        kernels::combine(dst.slice(off, len), own.slice(off, len),
                         TensorView(scratch->data() + off * esize, len, output.dtype), op,
                         ExecContext::host());
      }
      MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
    };
    for (int s = 0; s < n - 1; ++s) step(mod(rank - s), mod(rank - s - 1), true, s == 0, 1);
    for (int s = 0; s < n - 1; ++s) step(mod(rank - s + 1), mod(rank - s), false, false, 2);
    if (op == ReduceOp::avg) kernels::finish_average(output, n, ExecContext::host());
  };
}

}  // namespace relaxcc::bench
