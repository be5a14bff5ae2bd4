#include "python/src/process_group.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <numeric>
#include <string>
#include <thread>
#include <utility>

#include "relaxcc/config.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/nccl_communicator.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc::python {
namespace {

using ::c10d::OpType;
using Tensors = std::vector<at::Tensor>;

// Keeps `t`'s storage alive for as long as a relaxcc operation uses it.
std::shared_ptr<const void> keep(const at::Tensor& t) {
  return std::make_shared<at::Tensor>(t);
}

// Where `t` lives: the host or a CUDA device (Unsupported for another
// device, or CUDA in a build without the NCCL communicator).
Device device_of(const at::Tensor& t, const char* op) {
  if (t.device().is_cpu()) return Device::host();
  RELAXCC_ENFORCE(t.device().is_cuda() && build::kHaveNccl, Unsupported, "relaxcc backend: ", op,
                  ": a tensor on ", t.device().str(), "; this build moves CPU tensors",
                  build::kHaveNccl ? " and CUDA tensors" : "", " only");
  return Device::cuda(t.device().index());
}
void check_host(const at::Tensor& t, const char* op) {
  device_of(t, op);
}
// CUDA tensors run on CUDA's legacy default stream (the null stream).
ExecContext context(const at::Tensor& t) {
  ExecContext ctx;
  ctx.device = device_of(t, "");
  return ctx;
}

// The relaxcc dtype that reduces `t`.
DType reduce_dtype(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::f32;
    case at::kDouble:
      return DType::f64;
    case at::kHalf:
      return DType::f16;
    case at::kBFloat16:
      return DType::bf16;
    case at::kInt:
      return DType::i32;
    case at::kLong:
      return DType::i64;
    case at::kByte:
      return DType::u8;
    default:
      RELAXCC_THROW(Unsupported, "relaxcc backend: ", op, ": relaxcc does not reduce dtype ",
                    c10::toString(t.scalar_type()),
                    " (it reduces float32, float64, float16, bfloat16, int32, int64 and uint8)");
  }
}

ReduceOp reduce_op(const ::c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM:
      return ReduceOp::sum;
    case ::c10d::ReduceOp::AVG:
      return ReduceOp::avg;
    case ::c10d::ReduceOp::MIN:
      return ReduceOp::min;
    case ::c10d::ReduceOp::MAX:
      return ReduceOp::max;
    case ::c10d::ReduceOp::PRODUCT:
      RELAXCC_THROW(Unsupported, "relaxcc backend: ", what,
                    ": relaxcc has no reduction PRODUCT (it has SUM, AVG, MIN, MAX)");
    case ::c10d::ReduceOp::BAND:
      RELAXCC_THROW(Unsupported, "relaxcc backend: ", what,
                    ": relaxcc has no reduction BAND (it has SUM, AVG, MIN, MAX)");
    case ::c10d::ReduceOp::BOR:
      RELAXCC_THROW(Unsupported, "relaxcc backend: ", what,
                    ": relaxcc has no reduction BOR (it has SUM, AVG, MIN, MAX)");
    case ::c10d::ReduceOp::BXOR:
      RELAXCC_THROW(Unsupported, "relaxcc backend: ", what,
                    ": relaxcc has no reduction BXOR (it has SUM, AVG, MIN, MAX)");
    case ::c10d::ReduceOp::PREMUL_SUM:
      RELAXCC_THROW(Unsupported, "relaxcc backend: ", what,
                    ": relaxcc has no reduction PREMUL_SUM (it has SUM, AVG, MIN, MAX)");
    default:
      break;
  }
  RELAXCC_THROW(Unsupported, "relaxcc backend: ", what, ": unknown reduction ",
                static_cast<int>(op.op_));
}

TensorView typed_view(const at::Tensor& t, DType dtype) {
  return TensorView(t.data_ptr(), t.numel(), dtype, device_of(t, ""), keep(t));
}
TensorView byte_view(const at::Tensor& t) {
  return TensorView(t.data_ptr(), static_cast<int64_t>(t.nbytes()), DType::u8, device_of(t, ""),
                    keep(t));
}

// A contiguous tensor to run on: `user` itself when contiguous, else a copy
// whose result copy_back() writes into `user`.
struct Staged {
  at::Tensor user, data;
  explicit Staged(const at::Tensor& t) : user(t), data(t.is_contiguous() ? t : t.contiguous()) {}
  void copy_back() const {
    if (!data.is_same(user)) user.copy_(data);
  }
};

// Copies each of `parts` from consecutive elements of the flat `flat`.
void unflatten_into(const at::Tensor& flat, const Tensors& parts) {
  int64_t offset = 0;
  for (const auto& p : parts) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}
at::Tensor flatten(const Tensors& parts) {
  Tensors flat;
  flat.reserve(parts.size());
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}

const at::Tensor& single(const Tensors& tensors, const char* op) {
  RELAXCC_ENFORCE_EQ(tensors.size(), size_t{1}, InvalidArgument, "relaxcc backend: ", op,
                     ": one tensor per process");
  check_host(tensors[0], op);
  return tensors[0];
}

// Every tensor of `list` like `like` (dtype and element count); `list` has
// `n` of them.
void check_list(const Tensors& list, size_t n, const at::Tensor& like, const char* op) {
  RELAXCC_ENFORCE_EQ(list.size(), n, InvalidArgument, "relaxcc backend: ", op,
                     ": one tensor per rank");
  for (const auto& t : list) {
    check_host(t, op);
    RELAXCC_ENFORCE(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(),
                    InvalidArgument, "relaxcc backend: ", op, ": a tensor of ",
                    c10::toString(t.scalar_type()), " x ", t.numel(), " where the input is ",
                    c10::toString(like.scalar_type()), " x ", like.numel());
  }
}

WorkPtr completed(const char* what) {
  auto w = std::make_shared<Work>(what);
  w->complete(nullptr);
  return w;
}

}  // namespace

CommunicatorFactory mpi_communicator_factory() {
  return [](const c10::intrusive_ptr<::c10d::Store>&, std::chrono::milliseconds timeout) {
    MpiCommunicatorOptions options;
    options.tunables.timeout_ms = timeout.count();
    options.timeout = timeout;
    return create_mpi_communicator(options);
  };
}

CommunicatorFactory ucx_communicator_factory(int rank, int size, std::string address) {
  return [rank, size, address = std::move(address)](const c10::intrusive_ptr<::c10d::Store>& store,
                                                    std::chrono::milliseconds timeout) {
    UcxCommunicatorOptions options;
    options.tunables.timeout_ms = timeout.count();
    options.timeout = timeout;
    options.rendezvous.rank = rank;
    options.rendezvous.size = size;
    options.store = std::make_shared<C10dStore>(store, address);
    // This rank's count of worlds made on this store: the same on every rank.
    options.rendezvous.generation =
        static_cast<uint64_t>(options.store->add(detail::concat("relaxcc/worlds/", rank), 1));
    return create_ucx_communicator(options);
  };
}

// ---- C10dStore -------------------------------------------------------------

namespace {

// Runs a c10d store call, turning its errors into CommunicationError.
template <typename F>
auto c10d_call(const std::string& address, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    RELAXCC_THROW(CommunicationError, "c10d store ", address, ": ", what, " failed: ", e.what());
  }
}

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

}  // namespace

C10dStore::C10dStore(c10::intrusive_ptr<::c10d::Store> store, std::string address)
    : Store(store->getTimeout()), store_(std::move(store)), address_(std::move(address)) {}

void C10dStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  c10d_call(address_, "set '" + key + "'", [&] { store_->set(key, value); });
}

std::vector<uint8_t> C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  // c10d's get waits for the store's own timeout: wait with ours first.
  wait({key}, timeout);
  return c10d_call(address_, "get '" + key + "'", [&] { return store_->get(key); });
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return c10d_call(address_, "add '" + key + "'", [&] { return store_->add(key, delta); });
}

std::vector<uint8_t> C10dStore::compare_set(const std::string& key,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  auto got = c10d_call(address_, "compare_set '" + key + "'",
                       [&] { return store_->compareSet(key, expected, desired); });
  // c10d returns `expected` for a missing key that was not set; relaxcc's
  // contract returns the value found there (none).
  if (got == expected && got != desired && !check({key})) got.clear();
  return got;
}

void C10dStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  // Polls check(): torch 1.13's TCPStore does not wake a wait when
  // compareSet stores a key, and a wait that times out leaves the server's
  // late answer on the connection for the next call to read.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (!check(keys)) {
    RELAXCC_ENFORCE(std::chrono::steady_clock::now() < deadline, Timeout, "c10d store ", address_,
                    ": ", joined(keys), " not set within ", timeout.count(), " ms");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return c10d_call(address_, "check " + joined(keys), [&] { return store_->check(keys); });
}

int64_t C10dStore::num_keys() {
  return c10d_call(address_, "num_keys", [&] { return store_->getNumKeys(); });
}

bool C10dStore::delete_key(const std::string& key) {
  return c10d_call(address_, "delete_key '" + key + "'", [&] { return store_->deleteKey(key); });
}

// ---- RelaxccWork ---------------------------------------------------------

RelaxccWork::RelaxccWork(int rank, OpType type, const WorkPtr& op, Tensors outputs,
                         std::function<void()> finish, std::chrono::milliseconds timeout)
    : ::c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      timeout_(timeout) {
  done_ = op->then(
      [future = future_, outputs = outputs_, finish = std::move(finish)](const relaxcc::Work& w) {
        std::exception_ptr error = w.exception();
        if (!error && finish) {
          try {
            // The callback's thread is not the caller's: no autograd here.
            at::NoGradGuard no_grad;
            finish();
          } catch (...) {
            error = std::current_exception();
          }
        }
        if (error) {
          future->setError(error);
          if (!w.exception()) std::rethrow_exception(error);
        } else {
          future->markCompleted(c10::IValue(outputs));
        }
      });
}

bool RelaxccWork::isCompleted() {
  return done_->is_completed();
}
bool RelaxccWork::isSuccess() const {
  return done_->is_completed() && !done_->exception();
}
std::exception_ptr RelaxccWork::exception() const {
  return done_->exception();
}
bool RelaxccWork::wait(std::chrono::milliseconds timeout) {
  // c10d's kNoTimeout (0): the group's timeout.
  done_->wait(timeout.count() == 0 ? timeout_ : timeout);
  return true;
}
Tensors RelaxccWork::result() {
  return outputs_;
}
c10::intrusive_ptr<c10::ivalue::Future> RelaxccWork::getFuture() {
  return future_;
}

// ---- ProcessGroupRelaxcc -------------------------------------------------

ProcessGroupRelaxcc::ProcessGroupRelaxcc(int rank, int size, std::shared_ptr<Family> family,
                                         CommunicatorPtr comm, std::vector<int> members,
                                         std::chrono::milliseconds timeout)
    : BackendBase(rank, size),
      family_(std::move(family)),
      comm_(std::move(comm)),
      members_(std::move(members)),
      timeout_(timeout) {}

c10::intrusive_ptr<ProcessGroupRelaxcc> ProcessGroupRelaxcc::create(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const c10::intrusive_ptr<ProcessGroupRelaxcc>& parent,
    const CommunicatorFactory& factory) {
  RELAXCC_ENFORCE(size > 0 && rank >= 0 && rank < size, InvalidArgument, "relaxcc backend: rank ",
                  rank, " of a group of ", size);
  std::shared_ptr<Family> family;
  if (parent) {
    family = parent->family_;
  } else {
    family = std::make_shared<Family>();
    family->world = factory(store, timeout);
  }
  const CommunicatorPtr& world = family->world;
  RELAXCC_ENFORCE(size <= world->size(), InvalidArgument, "relaxcc backend: a group of ", size,
                  " ranks, but the world communicator has ", world->size(),
                  " (under mpirun, the world is the processes mpirun started)");
  // The members meet in the group's store: each publishes its world rank.
  const std::string me = std::to_string(world->rank());
  store->set("relaxcc/member/" + std::to_string(rank), std::vector<uint8_t>(me.begin(), me.end()));
  std::vector<int> members(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) {
    const auto bytes = store->get("relaxcc/member/" + std::to_string(i));
    const int r = std::stoi(std::string(bytes.begin(), bytes.end()));
    RELAXCC_ENFORCE(r >= 0 && r < world->size(), InvalidArgument, "relaxcc backend: rank ", i,
                    " of a group of ", size, " is process ", r, " but the ",
                    "world communicator has ", world->size(), " ranks");
    members[static_cast<size_t>(i)] = r;
  }
  std::vector<int> identity(static_cast<size_t>(world->size()));
  std::iota(identity.begin(), identity.end(), 0);
  CommunicatorPtr comm;
  if (members == identity && !parent) {
    comm = world;
  } else {
    GroupOptions options;
    options.key = family->groups_made[members]++;
    comm = world->group(members, options);
  }
  return c10::make_intrusive<ProcessGroupRelaxcc>(rank, size, family, comm, std::move(members),
                                                  timeout);
}

Communicator& ProcessGroupRelaxcc::on(const at::Tensor& t) {
  const Device d = device_of(t, "");
  if (d.is_host()) return *comm_;
  std::lock_guard<std::mutex> lock(device_mutex_);
  CommunicatorPtr& c = device_comms_[d.index];
  if (!c) {
    NcclCommunicatorOptions o;
    o.device = d.index;
    o.bootstrap = comm_;
    o.timeout = timeout_;
    c = create_nccl_communicator(o);
  }
  return *c;
}

c10::intrusive_ptr<RelaxccWork> ProcessGroupRelaxcc::wrap(OpType type, const WorkPtr& op,
                                                          Tensors outputs,
                                                          std::function<void()> finish) const {
  return c10::make_intrusive<RelaxccWork>(rank_, type, op, std::move(outputs), std::move(finish),
                                          timeout_);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::broadcast(
    Tensors& tensors, const ::c10d::BroadcastOptions& opts) {
  const Staged t(single(tensors, "broadcast"));
  BroadcastOptions o;
  o.root = static_cast<int>(opts.rootRank);
  auto op = on(t.data).broadcast(byte_view(t.data), context(t.data), o);
  return wrap(OpType::BROADCAST, op, tensors, [t] { t.copy_back(); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::allreduce(
    Tensors& tensors, const ::c10d::AllreduceOptions& opts) {
  const Staged t(single(tensors, "allreduce"));
  AllreduceOptions o;
  o.op = reduce_op(opts.reduceOp, "allreduce");
  auto op = on(t.data).allreduce(typed_view(t.data, reduce_dtype(t.data, "allreduce")),
                                 context(t.data), o);
  return wrap(OpType::ALLREDUCE, op, tensors, [t] { t.copy_back(); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::allreduce_coalesced(
    Tensors& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  RELAXCC_ENFORCE(!tensors.empty(), InvalidArgument,
                  "relaxcc backend: allreduce_coalesced: no tensors");
  for (const auto& t : tensors) {
    check_host(t, "allreduce_coalesced");
    RELAXCC_ENFORCE(t.scalar_type() == tensors[0].scalar_type(), InvalidArgument,
                    "relaxcc backend: allreduce_coalesced: tensors of ",
                    c10::toString(t.scalar_type()), " and ",
                    c10::toString(tensors[0].scalar_type()), "; one dtype per call");
  }
  AllreduceOptions o;
  o.op = reduce_op(opts.reduceOp, "allreduce_coalesced");
  const at::Tensor flat = flatten(tensors);
  auto op = on(flat).allreduce(typed_view(flat, reduce_dtype(flat, "allreduce_coalesced")),
                               context(flat), o);
  return wrap(OpType::ALLREDUCE_COALESCED, op, tensors,
              [flat, tensors] { unflatten_into(flat, tensors); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::reduce(Tensors& tensors,
                                                             const ::c10d::ReduceOptions& opts) {
  const Staged t(single(tensors, "reduce"));
  AllreduceOptions o;
  o.op = reduce_op(opts.reduceOp, "reduce");
  const DType dtype = reduce_dtype(t.data, "reduce");
  if (opts.rootRank == rank_) {
    auto op = on(t.data).allreduce(typed_view(t.data, dtype), context(t.data), o);
    return wrap(OpType::REDUCE, op, tensors, [t] { t.copy_back(); });
  }
  // Non-root ranks keep their input: the sum goes to a scratch tensor.
  const at::Tensor scratch = at::empty_like(t.data);
  auto op = on(t.data).allreduce(typed_view(t.data, dtype), typed_view(scratch, dtype),
                                 context(t.data), o);
  return wrap(OpType::REDUCE, op, tensors);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::allgather(std::vector<Tensors>& outputs,
                                                                Tensors& inputs,
                                                                const ::c10d::AllgatherOptions&) {
  const Staged in(single(inputs, "allgather"));
  RELAXCC_ENFORCE_EQ(outputs.size(), size_t{1}, InvalidArgument,
                     "relaxcc backend: allgather: one output list per process");
  check_list(outputs[0], static_cast<size_t>(size_), in.data, "allgather");
  const at::Tensor flat = at::empty({size_ * in.data.numel()}, in.data.options());
  auto op = on(in.data).allgather(byte_view(in.data), byte_view(flat), context(in.data));
  const Tensors& out = outputs[0];
  return wrap(OpType::ALLGATHER, op, out, [flat, out] { unflatten_into(flat, out); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::_allgather_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions&) {
  check_host(input, "_allgather_base");
  check_host(output, "_allgather_base");
  RELAXCC_ENFORCE(
      output.scalar_type() == input.scalar_type() && output.numel() == size_ * input.numel(),
      InvalidArgument, "relaxcc backend: _allgather_base: output of ",
      c10::toString(output.scalar_type()), " x ", output.numel(), " for ", size_, " inputs of ",
      c10::toString(input.scalar_type()), " x ", input.numel());
  const Staged in(input), out(output);
  auto op = on(in.data).allgather(byte_view(in.data), byte_view(out.data), context(in.data));
  return wrap(OpType::_ALLGATHER_BASE, op, {output}, [out] { out.copy_back(); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::gather(std::vector<Tensors>& outputs,
                                                             Tensors& inputs,
                                                             const ::c10d::GatherOptions& opts) {
  const Staged in(single(inputs, "gather"));
  const int root = static_cast<int>(opts.rootRank);
  // gather and scatter take the top tag, which send and recv leave free.
  const int tag = on(in.data).max_p2p_tag();
  std::vector<P2POp> ops;
  if (rank_ != root) {
    RELAXCC_ENFORCE(outputs.empty() || outputs[0].empty(), InvalidArgument,
                    "relaxcc backend: gather: output tensors on rank ", rank_,
                    ", which is not the root ", root);
    ops.push_back(P2POp::send(root, byte_view(in.data), tag));
    return wrap(OpType::GATHER, on(in.data).point_to_point(ops, context(in.data)), {});
  }
  RELAXCC_ENFORCE_EQ(outputs.size(), size_t{1}, InvalidArgument,
                     "relaxcc backend: gather: one output list on the root");
  check_list(outputs[0], static_cast<size_t>(size_), in.data, "gather");
  std::vector<Staged> out;
  for (const auto& t : outputs[0]) out.emplace_back(t);
  for (int p = 0; p < size_; ++p)
    if (p != root) ops.push_back(P2POp::recv(p, byte_view(out[static_cast<size_t>(p)].data), tag));
  auto op = ops.empty() ? completed("gather") : on(in.data).point_to_point(ops, context(in.data));
  return wrap(OpType::GATHER, op, outputs[0], [in, out, root] {
    out[static_cast<size_t>(root)].user.copy_(in.data);
    for (const auto& o : out) o.copy_back();
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::scatter(Tensors& outputs,
                                                              std::vector<Tensors>& inputs,
                                                              const ::c10d::ScatterOptions& opts) {
  const Staged out(single(outputs, "scatter"));
  const int root = static_cast<int>(opts.rootRank);
  const int tag = on(out.data).max_p2p_tag();
  std::vector<P2POp> ops;
  if (rank_ != root) {
    RELAXCC_ENFORCE(inputs.empty() || inputs[0].empty(), InvalidArgument,
                    "relaxcc backend: scatter: input tensors on rank ", rank_,
                    ", which is not the root ", root);
    ops.push_back(P2POp::recv(root, byte_view(out.data), tag));
    return wrap(OpType::SCATTER, on(out.data).point_to_point(ops, context(out.data)), outputs,
                [out] { out.copy_back(); });
  }
  RELAXCC_ENFORCE_EQ(inputs.size(), size_t{1}, InvalidArgument,
                     "relaxcc backend: scatter: one input list on the root");
  check_list(inputs[0], static_cast<size_t>(size_), out.data, "scatter");
  Tensors in;
  for (const auto& t : inputs[0]) in.push_back(t.contiguous());
  for (int p = 0; p < size_; ++p)
    if (p != root) ops.push_back(P2POp::send(p, byte_view(in[static_cast<size_t>(p)]), tag));
  auto op =
      ops.empty() ? completed("scatter") : on(out.data).point_to_point(ops, context(out.data));
  const at::Tensor mine = in[static_cast<size_t>(root)];
  return wrap(OpType::SCATTER, op, outputs, [out, mine] { out.user.copy_(mine); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::reduce_scatter(
    Tensors& outputs, std::vector<Tensors>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  const Staged out(single(outputs, "reduce_scatter"));
  RELAXCC_ENFORCE_EQ(inputs.size(), size_t{1}, InvalidArgument,
                     "relaxcc backend: reduce_scatter: one input list per process");
  check_list(inputs[0], static_cast<size_t>(size_), out.data, "reduce_scatter");
  ReduceScatterOptions o;
  o.op = reduce_op(opts.reduceOp, "reduce_scatter");
  const DType dtype = reduce_dtype(out.data, "reduce_scatter");
  const at::Tensor flat = flatten(inputs[0]);
  auto op = on(out.data).reduce_scatter(typed_view(flat, dtype), typed_view(out.data, dtype),
                                        context(out.data), o);
  return wrap(OpType::REDUCE_SCATTER, op, outputs, [out] { out.copy_back(); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) {
  check_host(input, "_reduce_scatter_base");
  check_host(output, "_reduce_scatter_base");
  RELAXCC_ENFORCE(
      output.scalar_type() == input.scalar_type() && input.numel() == size_ * output.numel(),
      InvalidArgument, "relaxcc backend: _reduce_scatter_base: input of ",
      c10::toString(input.scalar_type()), " x ", input.numel(), " for ", size_, " outputs of ",
      c10::toString(output.scalar_type()), " x ", output.numel());
  ReduceScatterOptions o;
  o.op = reduce_op(opts.reduceOp, "_reduce_scatter_base");
  const DType dtype = reduce_dtype(output, "_reduce_scatter_base");
  const Staged in(input), out(output);
  auto op = on(in.data).reduce_scatter(typed_view(in.data, dtype), typed_view(out.data, dtype),
                                       context(in.data), o);
  return wrap(OpType::_REDUCE_SCATTER_BASE, op, {output}, [out] { out.copy_back(); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const ::c10d::AllToAllOptions&) {
  check_host(input, "alltoall_base");
  check_host(output, "alltoall_base");
  RELAXCC_ENFORCE(output.scalar_type() == input.scalar_type(), InvalidArgument,
                  "relaxcc backend: alltoall_base: input of ", c10::toString(input.scalar_type()),
                  ", output of ", c10::toString(output.scalar_type()));
  const Staged in(input), out(output);
  if (input_splits.empty() && output_splits.empty()) {
    RELAXCC_ENFORCE(input.numel() == output.numel() && input.numel() % size_ == 0, InvalidArgument,
                    "relaxcc backend: alltoall_base: ", input.numel(), " input and ",
                    output.numel(), " output elements for ", size_, " ranks");
    auto op = on(in.data).alltoall(byte_view(in.data), byte_view(out.data), context(in.data));
    return wrap(OpType::ALLTOALL_BASE, op, {output}, [out] { out.copy_back(); });
  }
  // Splits count rows (the first dimension); relaxcc's alltoallv counts bytes here.
  auto byte_counts = [this](const at::Tensor& t, std::vector<int64_t> splits, const char* what) {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    const int64_t row_bytes = rows > 0 ? static_cast<int64_t>(t.nbytes()) / rows : 0;
    if (splits.empty()) splits.assign(static_cast<size_t>(size_), rows / size_);
    RELAXCC_ENFORCE_EQ(splits.size(), static_cast<size_t>(size_), InvalidArgument,
                       "relaxcc backend: alltoall_base: ", what, " splits");
    RELAXCC_ENFORCE_EQ(std::accumulate(splits.begin(), splits.end(), int64_t{0}), rows,
                       InvalidArgument, "relaxcc backend: alltoall_base: ", what,
                       " splits against the tensor's rows");
    for (auto& s : splits) s *= row_bytes;
    return splits;
  };
  auto op = on(in.data).alltoallv(byte_view(in.data), byte_counts(input, input_splits, "input"),
                                  byte_view(out.data), byte_counts(output, output_splits, "output"),
                                  context(in.data));
  return wrap(OpType::ALLTOALL_BASE, op, {output}, [out] { out.copy_back(); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::alltoall(Tensors& outputs, Tensors& inputs,
                                                               const ::c10d::AllToAllOptions&) {
  RELAXCC_ENFORCE(
      inputs.size() == static_cast<size_t>(size_) && outputs.size() == static_cast<size_t>(size_),
      InvalidArgument, "relaxcc backend: alltoall: ", inputs.size(), " inputs and ", outputs.size(),
      " outputs for ", size_, " ranks");
  std::vector<int64_t> send, recv;
  Tensors in_bytes, out_parts;
  for (int p = 0; p < size_; ++p) {
    const auto& i = inputs[static_cast<size_t>(p)];
    const auto& o = outputs[static_cast<size_t>(p)];
    check_host(i, "alltoall");
    check_host(o, "alltoall");
    RELAXCC_ENFORCE(i.scalar_type() == o.scalar_type(), InvalidArgument,
                    "relaxcc backend: alltoall: input ", p, " of ", c10::toString(i.scalar_type()),
                    ", output of ", c10::toString(o.scalar_type()));
    send.push_back(static_cast<int64_t>(i.nbytes()));
    recv.push_back(static_cast<int64_t>(o.nbytes()));
    in_bytes.push_back(i.contiguous().view({-1}).view(at::kByte));
  }
  const at::Tensor flat_in = at::cat(in_bytes);
  const at::Tensor flat_out =
      at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, flat_in.options());
  auto op =
      on(flat_in).alltoallv(byte_view(flat_in), send, byte_view(flat_out), recv, context(flat_in));
  return wrap(OpType::ALLTOALL, op, outputs, [flat_out, outputs, recv] {
    int64_t offset = 0;
    for (size_t p = 0; p < outputs.size(); ++p) {
      const at::Tensor& o = outputs[p];
      o.copy_(flat_out.narrow(0, offset, recv[p]).view(o.scalar_type()).view(o.sizes()));
      offset += recv[p];
    }
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::send(Tensors& tensors, int dst, int tag) {
  const at::Tensor t = single(tensors, "send").contiguous();
  RELAXCC_ENFORCE(tag >= 0 && tag < on(t).max_p2p_tag(), InvalidArgument,
                  "relaxcc backend: send: tag ", tag, " outside [0, ", on(t).max_p2p_tag(), ")");
  auto op = on(t).point_to_point({P2POp::send(dst, byte_view(t), tag)}, context(t));
  return wrap(OpType::SEND, op, tensors);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::recv(Tensors& tensors, int src, int tag) {
  const Staged t(single(tensors, "recv"));
  RELAXCC_ENFORCE(tag >= 0 && tag < on(t.data).max_p2p_tag(), InvalidArgument,
                  "relaxcc backend: recv: tag ", tag, " outside [0, ", on(t.data).max_p2p_tag(),
                  ")");
  auto op = on(t.data).point_to_point({P2POp::recv(src, byte_view(t.data), tag)}, context(t.data));
  return wrap(OpType::RECV, op, tensors, [t] { t.copy_back(); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::recvAnysource(Tensors&, int) {
  RELAXCC_THROW(Unsupported,
                "relaxcc backend: recv from any source: relaxcc receives from a named peer only "
                "(pass src to recv)");
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupRelaxcc::barrier(const ::c10d::BarrierOptions&) {
  return wrap(OpType::BARRIER, comm_->barrier(), {});
}

}  // namespace relaxcc::python
