#include "relaxcc/torch/distributed_data_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/collective_setup.h"
#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "relaxcc/mpi_communicator.h"

namespace relaxcc::torch {

namespace {

// Every rank's `mine` (the same length on every rank), in rank order: a
// small allgather on `comm`, waited for with `timeout`.
std::vector<int64_t> allgather_ints(Communicator& comm, std::vector<int64_t> mine,
                                    const char* label, std::chrono::milliseconds timeout) {
  const auto k = static_cast<int64_t>(mine.size());
  auto in = std::make_shared<std::vector<int64_t>>(std::move(mine));
  auto out = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(k * comm.size()));
  AllgatherOptions o;
  o.label = label;
  comm.allgather(TensorView::host(in->data(), k, in),
                 TensorView::host(out->data(), k * comm.size(), out), ExecContext::host(), o)
      ->wait(timeout);
  return *out;
}

using ::torch::Tensor;

// A view of a contiguous host tensor's bytes that keeps the tensor alive.
TensorView byte_view(const Tensor& t) {
  auto keep = std::make_shared<Tensor>(t);
  return TensorView(t.data_ptr(), static_cast<int64_t>(t.nbytes()), DType::u8, Device::host(),
                    std::move(keep));
}

TensorView float_view(const Tensor& t) {
  auto keep = std::make_shared<Tensor>(t);
  return TensorView(t.data_ptr(), t.numel(), DType::f32, Device::host(), std::move(keep));
}

void check_host_contiguous(const Tensor& t, const std::string& name, const char* what) {
  RELAXCC_ENFORCE(t.device().is_cpu(), Unsupported, "DistributedDataParallel: ", what, " '", name,
                  "' is on ", t.device().str(), "; only host (CPU) tensors are supported");
  RELAXCC_ENFORCE(t.is_contiguous(), Unsupported, "DistributedDataParallel: ", what, " '", name,
                  "' is not contiguous");
}

void wait_each(const std::vector<WorkPtr>& works, std::chrono::milliseconds timeout) {
  for (const WorkPtr& w : works)
    if (w) w->wait(timeout);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += detail::concat(i ? ", " : "", ranks[i]);
  return out + "]";
}

// Each tensor of `items` once, under its first name: a tensor registered
// under several names (tied or shared weights) is one parameter, as PyTorch
// DDP counts parameters by identity.
std::vector<std::pair<std::string, Tensor>> unique_named(
    const ::torch::OrderedDict<std::string, Tensor>& items) {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : items)
    if (seen.insert(item.value().unsafeGetTensorImpl()).second)
      out.emplace_back(item.key(), item.value());
  return out;
}

// The relaxcc dtype that averages `t` across ranks: f32, f64, f16 and bf16;
// none for integer and bool tensors, which cannot be averaged.
std::optional<DType> average_dtype(const Tensor& t) {
  switch (t.scalar_type()) {
    case ::torch::kFloat32:
      return DType::f32;
    case ::torch::kFloat64:
      return DType::f64;
    case ::torch::kFloat16:
      return DType::f16;
    case ::torch::kBFloat16:
      return DType::bf16;
    default:
      return std::nullopt;
  }
}

Tensor scalar(int64_t v) {
  return ::torch::tensor({v}, ::torch::kInt64);
}

int64_t read_int(::torch::serialize::InputArchive& archive, const std::string& key) {
  Tensor t;
  archive.read(key, t);
  return t.item<int64_t>();
}

}  // namespace

// The Reducer's optimizer. The Reducer calls update() once per parameter
// whose gradient some rank produced in the step (a parameter that no rank
// used is left out); update() only records the parameter. run() is the torch
// optimizer's step over the recorded parameters: every other parameter's
// param.grad is undefined during it, so torch optimizers skip it (no
// momentum, no weight decay), as in PyTorch DDP; afterwards every param.grad
// is the Reducer's memory again (bucket views stay in place).
class DistributedDataParallel::TorchStep final : public Optimizer {
 public:
  explicit TorchStep(DistributedDataParallel& ddp) : ddp_(ddp), used_(ddp.params_.size(), 0) {
    for (size_t i = 0; i < ddp_.params_.size(); ++i)
      index_[ddp_.params_[i].data_ptr()].push_back(static_cast<int>(i));
  }
  void update(const TensorView& params, const TensorView&, int64_t) override {
    const auto it = index_.find(params.data);
    RELAXCC_ENFORCE(it != index_.end(), InternalError, "DistributedDataParallel: rank ",
                    ddp_.comm_->rank(),
                    ": the Reducer updated a parameter this wrapper did not register");
    for (int i : it->second) used_[static_cast<size_t>(i)] = 1;
  }
  void run() {
    ::torch::NoGradGuard no_grad;
    struct Repoint {
      DistributedDataParallel& ddp;
      std::vector<char>& used;
      ~Repoint() {
        for (size_t i = 0; i < ddp.params_.size(); ++i)
          ddp.params_[i].mutable_grad() = ddp.grads_[i];
        std::fill(used.begin(), used.end(), 0);
      }
    } repoint{ddp_, used_};
    for (size_t i = 0; i < ddp_.params_.size(); ++i)
      ddp_.params_[i].mutable_grad() = used_[i] ? ddp_.grads_[i] : Tensor();
    ddp_.optimizer_.step();
  }

 private:
  DistributedDataParallel& ddp_;
  std::unordered_map<const void*, std::vector<int>> index_;  // data pointer -> parameters
  std::vector<char> used_;                                   // updated in this step
};

// The algorithm as the Reducer sees it: the user's (with its step offset),
// with the torch optimizer's step run at the start of after_optimizer_step,
// once the Reducer's update() calls told which parameters some rank used and
// before the algorithm moves weights (local_sgd, cocktail_sgd). Algorithms
// that own the step (qadam) get no torch step.
class DistributedDataParallel::WithTorchStep final : public Algorithm {
 public:
  WithTorchStep(std::shared_ptr<algorithms::StepOffset> inner, TorchStep& step)
      : inner_(std::move(inner)), step_(step) {}
  std::string name() const override { return inner_->name(); }
  AlgorithmCapabilities capabilities() const override { return inner_->capabilities(); }
  void init(const AlgorithmContext& ctx) override { inner_->init(ctx); }
  WorkPtr on_step_begin(const StepInfo& s) override { return inner_->on_step_begin(s); }
  WorkPtr on_bucket_ready(const StepInfo& s, int bucket, const TensorView& data) override {
    return inner_->on_bucket_ready(s, bucket, data);
  }
  bool reduces_gradients(const StepInfo& s) const override { return inner_->reduces_gradients(s); }
  WorkPtr on_backward_end(const StepInfo& s) override { return inner_->on_backward_end(s); }
  void before_optimizer_step(const StepInfo& s) override { inner_->before_optimizer_step(s); }
  void optimizer_step(const StepInfo& s, Optimizer& o) override { inner_->optimizer_step(s, o); }
  WorkPtr after_optimizer_step(const StepInfo& s) override {
    if (!inner_->capabilities().owns_optimizer_step) step_.run();
    return inner_->after_optimizer_step(s);
  }
  bool need_reset(const StepInfo& s) const override { return inner_->need_reset(s); }
  void drain(std::chrono::milliseconds t) override { inner_->drain(t); }
  void shutdown(std::chrono::milliseconds t) override { inner_->shutdown(t); }
  StateDict state_dict() const override { return inner_->state_dict(); }
  void load_state_dict(const StateDict& s) override { inner_->load_state_dict(s); }
  StateDict replicated_state_dict() const override { return inner_->replicated_state_dict(); }
  void load_replicated_state_dict(const StateDict& s) override {
    inner_->load_replicated_state_dict(s);
  }

 private:
  std::shared_ptr<algorithms::StepOffset> inner_;
  TorchStep& step_;
};

// Post hook of one parameter's gradient accumulator: runs after the
// gradient was accumulated into param.grad.
class DistributedDataParallel::ReadyHook final : public ::torch::autograd::FunctionPostHook {
 public:
  ReadyHook(DistributedDataParallel* owner, int param) : owner_(owner), param_(param) {}
  ::torch::autograd::variable_list operator()(
      const ::torch::autograd::variable_list& outputs,
      const ::torch::autograd::variable_list& /*inputs*/) override {
    owner_->on_gradient_ready(param_);
    return outputs;
  }
  const DistributedDataParallel* owner() const { return owner_; }

 private:
  DistributedDataParallel* owner_;
  int param_;
};

DistributedDataParallel::DistributedDataParallel(CommunicatorPtr comm, ::torch::nn::Module& module,
                                                 ::torch::optim::Optimizer& optimizer,
                                                 AlgorithmPtr algorithm, DdpOptions options)
    : comm_(std::move(comm)), module_(module), optimizer_(optimizer), options_(options) {
  RELAXCC_ENFORCE(comm_ != nullptr, InvalidArgument, "DistributedDataParallel: null communicator");
  if (algorithm == nullptr) algorithm = std::make_shared<algorithms::GradientAllreduce>();
  // This rank's checks come before the first collective, and every rank
  // learns every rank's outcome (agree_on_checks): a model that fails a
  // check on one rank alone (an f64 parameter there) fails every rank at
  // once, naming it. The Reducer fails together on its own; an error after
  // it on one rank alone poisons the communicator, so the others fail at
  // once too (collective_setup.h).
  const CommunicatorPtr host = comm_->host_communicator();
  // An elastic newcomer's members are past their construction: its checks
  // are its own, and the admission gives it the members' parameters.
  const bool newcomer = options_.reducer.elastic && options_.reducer.elastic->newcomer;
  const auto checks = [&] {
    for (const auto& [name, p] : unique_named(module_.named_parameters(/*recurse=*/true))) {
      check_host_contiguous(p, name, "parameter");
      all_params_.push_back(p);
      if (!p.requires_grad()) continue;
      RELAXCC_ENFORCE(p.scalar_type() == ::torch::kFloat32, Unsupported,
                      "DistributedDataParallel: parameter '", name, "' is ",
                      c10::toString(p.scalar_type()), "; only float32 parameters are supported");
      std::shared_ptr<::torch::autograd::Node> acc = ::torch::autograd::impl::grad_accumulator(p);
      RELAXCC_ENFORCE(acc != nullptr, InvalidArgument, "DistributedDataParallel: parameter '", name,
                      "' is not a leaf tensor");
      for (const auto& hook : acc->post_hooks())
        RELAXCC_ENFORCE(dynamic_cast<const ReadyHook*>(hook.get()) == nullptr, InvalidArgument,
                        "DistributedDataParallel: the module is wrapped already: parameter '", name,
                        "' carries the readiness hook of another live DistributedDataParallel");
      names_.push_back(name);
      params_.push_back(p);
      accumulators_.push_back(std::move(acc));
    }
    for (const auto& [name, b] : unique_named(module_.named_buffers(/*recurse=*/true))) {
      check_host_contiguous(b, name, "buffer");
      buffers_.push_back(b);
    }
  };
  if (newcomer)
    checks();
  else
    agree_on_checks(*(host ? host : comm_), "DistributedDataParallel construction", checks,
                    timeout());
  {
    ::torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& g = params_[i].mutable_grad();
      grads_.push_back(g.defined() && g.is_contiguous() ? g : ::torch::zeros_like(params_[i]));
      if (g.defined() && !g.is_same(grads_[i])) grads_[i].copy_(g);
      g = grads_[i];
    }
  }

  // Registration: each gradient, then its parameter (the gradient's partner).
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < params_.size(); ++i) {
    specs.push_back({names_[i] + ".grad", float_view(grads_[i]), TensorRole::gradient,
                     static_cast<int>(2 * i + 1)});
    specs.push_back({names_[i], float_view(params_[i]), TensorRole::parameter, -1});
  }
  algorithm_ = std::make_shared<algorithms::StepOffset>(std::move(algorithm));
  pass_learning_rate();
  torch_step_ = std::make_unique<TorchStep>(*this);
  // Verifies names, shapes and dtypes across ranks (PeerMismatch); fails
  // together on its own.
  reducer_ = std::make_unique<Reducer>(comm_, std::move(specs),
                                       std::make_shared<WithTorchStep>(algorithm_, *torch_step_),
                                       ExecContext::host(), options_.reducer);
  poison_on_error({comm_.get()}, [&] {
    if (!newcomer) {
      check_comm_ = comm_->split(0, comm_->rank());
      std::vector<Tensor> everything = all_params_;
      everything.insert(everything.end(), buffers_.begin(), buffers_.end());
      broadcast(everything, "parameters and buffers from rank 0 at construction");
    }

    if (options_.reducer.gradient_as_bucket_view) {
      point_gradients();
      reducer_->on_plan_changed([this] { point_gradients(); });
    }
    for (size_t i = 0; i < accumulators_.size(); ++i)
      accumulators_[i]->add_post_hook(std::make_unique<ReadyHook>(this, static_cast<int>(i)));
  });
}

DistributedDataParallel::DistributedDataParallel(::torch::nn::Module& module,
                                                 ::torch::optim::Optimizer& optimizer,
                                                 AlgorithmPtr algorithm, DdpOptions options)
    : DistributedDataParallel(create_mpi_communicator(), module, optimizer, std::move(algorithm),
                              options) {}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& acc : accumulators_) {
    auto& hooks = acc->post_hooks();
    hooks.erase(
        std::remove_if(hooks.begin(), hooks.end(),
                       [this](const std::unique_ptr<::torch::autograd::FunctionPostHook>& h) {
                         const auto* mine = dynamic_cast<const ReadyHook*>(h.get());
                         return mine != nullptr && mine->owner() == this;
                       }),
        hooks.end());
  }
  // param.grad keeps its values but no longer aliases bucket memory.
  if (options_.reducer.gradient_as_bucket_view) {
    ::torch::NoGradGuard no_grad;
    for (Tensor& p : params_) p.mutable_grad() = p.grad().clone();
  }
}

std::chrono::milliseconds DistributedDataParallel::timeout() const {
  return options_.reducer.timeout.count() >= 0
             ? options_.reducer.timeout
             : std::chrono::milliseconds(Tunables::from_env().timeout_ms);
}

void DistributedDataParallel::point_gradients() {
  ::torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const TensorView v = reducer_->gradient_view(static_cast<int>(2 * i));
    std::shared_ptr<const void> owner = v.owner;
    grads_[i] = ::torch::from_blob(
        v.data, params_[i].sizes(), [owner](void*) {}, params_[i].options());
    params_[i].mutable_grad() = grads_[i];
  }
}

void DistributedDataParallel::broadcast(const std::vector<Tensor>& tensors,
                                        const std::string& what) {
  std::vector<WorkPtr> works;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    BroadcastOptions o;
    o.root = 0;
    o.label = "DistributedDataParallel: " + what;
    works.push_back(comm_->broadcast(byte_view(t), ExecContext::host(), o));
  }
  wait_each(works, timeout());
}

void DistributedDataParallel::check_even(bool has_data) {
  const int n = comm_->size();
  const std::vector<int64_t> all = allgather_ints(
      check_comm(), {steps(), has_data}, "DistributedDataParallel: uneven-input check", timeout());
  std::vector<int> finished, going;
  std::string steps;
  for (int r = 0; r < n; ++r) {
    (all[2 * r + 1] ? going : finished).push_back(r);
    steps += detail::concat(r ? ", " : "", "rank ", r, ": ", all[2 * r]);
  }
  if (finished.empty() || going.empty()) return;
  RELAXCC_THROW(InvalidArgument, "DistributedDataParallel: uneven inputs: ranks ",
                rank_list(finished), " ran out of data while ranks ", rank_list(going),
                " went on (optimizer steps taken: ", steps,
                "); give every rank the same number of batches");
}

void DistributedDataParallel::on_gradient_ready(int param) {
  if (!in_backward_) {
    if (!no_sync_ && checks_uneven_inputs()) check_even(true);
    in_backward_ = true;
    backward_since_step_ = true;
    ::torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
  }
  Tensor& g = params_[param].mutable_grad();
  if (!g.is_same(grads_[param])) {
    // param.grad was replaced (or reset to undefined and re-created by this
    // accumulation): move it back into the memory the Reducer reads.
    ::torch::NoGradGuard no_grad;
    if (g.defined())
      grads_[param].copy_(g);
    else
      grads_[param].zero_();
    g = grads_[param];
  }
  reducer_->mark_ready(2 * param);
}

void DistributedDataParallel::end_backward() {
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{in_backward_};
  reducer_->synchronize();
  if (!no_sync_) synced_since_step_ = true;
  follow_view();
}

bool DistributedDataParallel::checks_uneven_inputs() const {
  return options_.check_uneven_inputs && !options_.reducer.elastic;
}

void DistributedDataParallel::follow_view() {
  if (reducer_->communicator() == comm_) return;
  comm_ = reducer_->communicator();
  check_comm_ = nullptr;  // split again when next needed (collective)
}

Communicator& DistributedDataParallel::check_comm() {
  if (!check_comm_) check_comm_ = comm_->split(0, comm_->rank());
  return *check_comm_;
}

void DistributedDataParallel::step() {
  RELAXCC_ENFORCE(!no_sync_, InvalidArgument,
                  "DistributedDataParallel: step() inside no_sync(): its gradients were not "
                  "communicated; run the last backward of the step outside no_sync()");
  if (!synced_since_step_) {
    RELAXCC_ENFORCE(!backward_since_step_, InvalidArgument, "DistributedDataParallel: step() ",
                    steps(),
                    " follows backward passes under no_sync() only; run the last backward of "
                    "the step outside no_sync()");
    // No gradient reached this rank in this step's backward: join the
    // others' end of backward.
    if (checks_uneven_inputs()) check_even(true);
    reducer_->synchronize();
    follow_view();
  }
  if (algorithm_->need_reset(StepInfo{reducer_->step()})) optimizer_.state().clear();
  pass_learning_rate();
  reducer_->optimizer_step(*torch_step_);
  follow_view();  // newcomers admitted at the step's end
  synced_since_step_ = false;
  backward_since_step_ = false;
  if (options_.broadcast_buffers && !options_.reducer.elastic && !buffers_.empty())
    broadcast(buffers_, "buffers from rank 0 after a step");
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp) {
  ddp_.reducer_->set_no_sync(true);
  ddp_.no_sync_ = true;
}

DistributedDataParallel::NoSync::~NoSync() {
  ddp_.no_sync_ = false;
  try {
    ddp_.reducer_->set_no_sync(false);
  } catch (const std::exception& e) {
    RELAXCC_LOG(warn, "DistributedDataParallel: leaving no_sync(): ", e.what());
  }
}

void DistributedDataParallel::finish() {
  if (checks_uneven_inputs()) check_even(false);
}

void DistributedDataParallel::with_averaged_model(const std::function<void()>& fn) {
  ::torch::NoGradGuard no_grad;
  // Parameters (trainable and frozen) of a floating dtype, and floating
  // buffers; integer and bool tensors (batch counters) keep this rank's own
  // values. Every check runs before the first allreduce, alike on every rank.
  std::vector<Tensor> live, own;
  std::vector<DType> dtypes;
  auto add = [&](const std::string& name, const Tensor& t, const char* what) {
    const std::optional<DType> d = average_dtype(t);
    RELAXCC_ENFORCE(d.has_value() || c10::isIntegralType(t.scalar_type(), /*includeBool=*/true),
                    Unsupported, "DistributedDataParallel::with_averaged_model: rank ",
                    comm_->rank(), ": ", what, " '", name, "' is ", c10::toString(t.scalar_type()),
                    "; expected float32, float64, float16 or bfloat16 (averaged) or an integer or "
                    "bool dtype (left as it is)");
    if (!d) return;
    live.push_back(t);
    dtypes.push_back(*d);
  };
  for (const auto& [name, p] : unique_named(module_.named_parameters(true)))
    add(name, p, "parameter");
  for (const auto& [name, b] : unique_named(module_.named_buffers(true))) add(name, b, "buffer");
  // Every rank's own values are copied before the first allreduce writes
  // (tensors may share storage).
  for (const Tensor& t : live) own.push_back(t.clone());
  std::vector<WorkPtr> works;
  for (size_t i = 0; i < live.size(); ++i) {
    const Tensor& t = live[i];
    if (t.numel() == 0) continue;
    AllreduceOptions o;
    o.op = ReduceOp::avg;
    o.label = "DistributedDataParallel: exact model average";
    auto keep = std::make_shared<Tensor>(t);
    works.push_back(comm_->allreduce(
        TensorView(t.data_ptr(), t.numel(), dtypes[i], Device::host(), std::move(keep)),
        ExecContext::host(), o));
  }
  wait_each(works, timeout());
  struct Restore {
    std::vector<Tensor>& live;
    std::vector<Tensor>& own;
    ~Restore() {
      ::torch::NoGradGuard guard;
      for (size_t i = 0; i < live.size(); ++i) live[i].copy_(own[i]);
    }
  } restore{live, own};
  fn();
}

void DistributedDataParallel::pass_learning_rate() {
  Algorithm& algorithm = algorithm_->inner();
  if (!algorithm.capabilities().takes_learning_rate) return;
  const auto& groups = optimizer_.param_groups();
  RELAXCC_ENFORCE(!groups.empty(), InvalidArgument, "DistributedDataParallel: ", algorithm.name(),
                  " takes the torch optimizer's learning rate, and the optimizer has no parameter "
                  "group");
  const double lr = groups[0].options().get_lr();
  for (size_t g = 1; g < groups.size(); ++g)
    RELAXCC_ENFORCE(groups[g].options().get_lr() == lr, InvalidArgument,
                    "DistributedDataParallel: ", algorithm.name(),
                    " takes one learning rate, the torch optimizer's, but its parameter group ", g,
                    " has lr ", groups[g].options().get_lr(), " and group 0 has ", lr,
                    "; give every group the same lr");
  algorithm.set_learning_rate(static_cast<float>(lr));
}

Algorithm& DistributedDataParallel::algorithm() {
  return algorithm_->inner();
}

int64_t DistributedDataParallel::steps() const {
  return reducer_->step() + algorithm_->offset();
}

void DistributedDataParallel::save(const std::string& prefix) {
  algorithm_->drain(timeout());
  ::torch::serialize::OutputArchive archive;
  archive.write("relaxcc.world_size", scalar(comm_->size()));
  archive.write("relaxcc.rank", scalar(comm_->rank()));
  archive.write("relaxcc.steps", scalar(steps()));
  for (const auto& item : module_.named_parameters(true))
    archive.write("param." + item.key(), item.value().detach());
  for (const auto& item : module_.named_buffers(true))
    archive.write("buffer." + item.key(), item.value(), /*is_buffer=*/true);
  ::torch::serialize::OutputArchive optimizer;
  optimizer_.save(optimizer);
  archive.write("optimizer", optimizer);
  const std::vector<std::byte> state = algorithm_->state_dict().serialize();
  Tensor bytes = ::torch::empty({static_cast<int64_t>(state.size())}, ::torch::kUInt8);
  if (!state.empty()) std::memcpy(bytes.data_ptr(), state.data(), state.size());
  archive.write("algorithm." + algorithm_->name(), bytes);
  const std::vector<std::byte> plan = reducer_->state_dict().serialize();
  Tensor plan_bytes = ::torch::empty({static_cast<int64_t>(plan.size())}, ::torch::kUInt8);
  std::memcpy(plan_bytes.data_ptr(), plan.data(), plan.size());
  archive.write("reducer", plan_bytes);
  archive.save_to(detail::concat(prefix, ".rank", comm_->rank()));
}

void DistributedDataParallel::load(const std::string& prefix) {
  const int rank = comm_->rank(), ranks = comm_->size();
  const std::string path = detail::concat(prefix, ".rank", rank);
  // Phase 1, local: read and check this rank's file; nothing changes yet.
  int64_t saved_world = -1;      // -1: this rank's file could not be read
  std::string error;             // why this rank cannot load its file
  std::exception_ptr own_error;  // the relaxcc error that says so, when one did
  int64_t saved_steps = 0;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, value)
  ::torch::serialize::InputArchive optimizer;
  std::optional<StateDict> state;
  // The Reducer's bucket plan (absent from checkpoints of older builds,
  // which load into the plan in use).
  std::optional<StateDict> plan;
  try {
    // Nothing of the algorithm is in flight while its state and the weights
    // are replaced (a rank whose drain fails counts as one that cannot load).
    algorithm_->drain(timeout());
    ::torch::serialize::InputArchive archive;
    archive.load_from(path);
    saved_world = read_int(archive, "relaxcc.world_size");
    if (saved_world == ranks) {
      RELAXCC_ENFORCE_EQ(read_int(archive, "relaxcc.rank"), static_cast<int64_t>(rank),
                         InvalidArgument, "DistributedDataParallel: rank ", rank, ": checkpoint '",
                         path, "' belongs to another rank (saved, this rank)");
      saved_steps = read_int(archive, "relaxcc.steps");
      auto collect = [&](const std::string& key, const Tensor& dst) {
        Tensor value;
        archive.read(key, value);
        RELAXCC_ENFORCE(value.sizes() == dst.sizes() && value.scalar_type() == dst.scalar_type(),
                        InvalidArgument, "DistributedDataParallel: rank ", rank, ": checkpoint '",
                        path, "': '", key, "' is ", value.sizes(), " ",
                        c10::toString(value.scalar_type()), ", the model has ", dst.sizes(), " ",
                        c10::toString(dst.scalar_type()));
        copies.emplace_back(dst, value);
      };
      for (const auto& item : module_.named_parameters(true))
        collect("param." + item.key(), item.value());
      for (const auto& item : module_.named_buffers(true))
        collect("buffer." + item.key(), item.value());
      archive.read("optimizer", optimizer);
      Tensor bytes;
      archive.read("algorithm." + algorithm_->name(), bytes);
      const auto* first = static_cast<const std::byte*>(bytes.data_ptr());
      state = StateDict::deserialize(std::vector<std::byte>(first, first + bytes.numel()));
      Tensor plan_bytes;
      if (archive.try_read("reducer", plan_bytes)) {
        const auto* p = static_cast<const std::byte*>(plan_bytes.data_ptr());
        plan = StateDict::deserialize(std::vector<std::byte>(p, p + plan_bytes.numel()));
      }
    }
  } catch (const c10::Error& e) {
    error = detail::concat("DistributedDataParallel: rank ", rank, ": cannot read checkpoint '",
                           path, "' for this model and algorithm '", algorithm_->name(),
                           "': ", e.what_without_backtrace());
  } catch (const Error& e) {
    error = e.message();
    own_error = std::current_exception();
  } catch (const std::exception& e) {
    error = detail::concat("DistributedDataParallel: rank ", rank, ": cannot load checkpoint '",
                           path, "': ", e.what());
  }

  // Phase 2, collective: every rank learns what every rank's file says, so
  // all ranks throw the same kind of error or all load (a checkpoint of
  // fewer ranks has no file for the extra ranks: they, too, report the rank
  // count).
  // What is not agreed on (a collective that fails here, a copy that
  // throws) is this rank's alone: it poisons the communicators, so the other
  // ranks fail at once (collective_setup.h). The errors thrown after an
  // agreement are raised by every rank together.
  auto alone = [&](auto&& fn) -> decltype(auto) {
    return poison_on_error({comm_.get(), &check_comm()}, fn);
  };
  const std::vector<int64_t> all = alone([&] {
    return allgather_ints(check_comm(), {saved_world, error.empty() ? 1 : 0, plan ? 1 : 0},
                          "DistributedDataParallel: checkpoint agreement", timeout());
  });
  std::string other_count;
  std::vector<int> failed, with_plan, without_plan;
  for (int r = 0; r < ranks; ++r) {
    const int64_t world = all[3 * r];
    if (world >= 0 && world != ranks)
      other_count += detail::concat(other_count.empty() ? "" : ", ", "rank ", r, "'s file '",
                                    prefix, ".rank", r, "' says ", world);
    else if (!all[3 * r + 1])
      failed.push_back(r);
    (all[3 * r + 2] ? with_plan : without_plan).push_back(r);
  }
  if (!other_count.empty()) {
    const std::string own = error.empty() ? "" : "; this rank's own file: " + error;
    RELAXCC_THROW(InvalidArgument, "DistributedDataParallel: rank ", rank, ": checkpoint '", prefix,
                  "' was written by another rank count: expected ", ranks,
                  " ranks (this job), got ", other_count, own);
  }
  if (own_error) std::rethrow_exception(own_error);
  if (!error.empty()) RELAXCC_THROW(InvalidArgument, error);
  if (!failed.empty())
    RELAXCC_THROW(InvalidArgument, "DistributedDataParallel: rank ", rank, ": checkpoint '", prefix,
                  "' not loaded: ranks ", rank_list(failed),
                  " cannot load their files (their own errors say why)");
  if (!with_plan.empty() && !without_plan.empty())
    RELAXCC_THROW(InvalidArgument, "DistributedDataParallel: rank ", rank, ": checkpoint '", prefix,
                  "' not loaded: the files of ranks ", rank_list(with_plan),
                  " carry the bucket plan, those of ranks ", rank_list(without_plan),
                  " do not (files of different builds)");

  // Phase 3, local: every rank's file is good; load it, keeping what it
  // replaces. Phase 4, collective: if the optimizer or the algorithm refused
  // its state on any rank, every rank puts its own back and throws.
  std::vector<Tensor> before;
  before.reserve(copies.size());
  std::stringstream optimizer_before;
  {
    ::torch::serialize::OutputArchive archive;
    optimizer_.save(archive);
    archive.save_to(optimizer_before);
  }
  const StateDict algorithm_before = algorithm_->state_dict();
  const StateDict plan_before = reducer_->state_dict();
  // Collective, and alike on every rank: the Reducer adopts the saved plan
  // (the one the algorithm's state belongs to) or every rank throws, with
  // nothing changed.
  if (plan) {
    try {
      reducer_->load_state_dict(*plan);
    } catch (const InvalidArgument& e) {
      RELAXCC_THROW(InvalidArgument, "DistributedDataParallel: rank ", rank, ": checkpoint '",
                    prefix, "' not loaded: ", e.message());
    }
  }
  std::string load_error;
  std::exception_ptr own_load_error;
  alone([&] {
    ::torch::NoGradGuard no_grad;
    for (auto& [dst, value] : copies) {
      before.push_back(dst.clone());
      dst.copy_(value);
    }
  });
  try {
    try {
      optimizer_.load(optimizer);
    } catch (const c10::Error& e) {
      RELAXCC_THROW(InvalidArgument, "DistributedDataParallel: rank ", rank,
                    ": the torch optimizer's state in checkpoint '", path,
                    "' does not fit this optimizer: ", e.what_without_backtrace());
    }
    algorithm_->load_state_dict(*state);
  } catch (const Error& e) {
    load_error = e.message();
    own_load_error = std::current_exception();
  } catch (const std::exception& e) {
    load_error =
        detail::concat("DistributedDataParallel: rank ", rank,
                       ": cannot restore the state in checkpoint '", path, "': ", e.what());
  }
  const std::vector<int64_t> loaded = alone([&] {
    return allgather_ints(check_comm(), {load_error.empty() ? 1 : 0},
                          "DistributedDataParallel: checkpoint restored", timeout());
  });
  std::vector<int> refused;
  for (int r = 0; r < ranks; ++r)
    if (!loaded[static_cast<size_t>(r)]) refused.push_back(r);
  if (refused.empty()) {
    algorithm_->set_offset(saved_steps - reducer_->step());
    return;
  }
  alone([&] {
    ::torch::NoGradGuard no_grad;
    for (size_t i = 0; i < copies.size(); ++i) copies[i].first.copy_(before[i]);
    ::torch::serialize::InputArchive archive;
    archive.load_from(optimizer_before);
    optimizer_.load(archive);
  });
  if (plan) reducer_->load_state_dict(plan_before);  // collective, as above
  alone([&] { algorithm_->load_state_dict(algorithm_before); });
  if (own_load_error) std::rethrow_exception(own_load_error);
  if (!load_error.empty()) RELAXCC_THROW(InvalidArgument, load_error);
  RELAXCC_THROW(InvalidArgument, "DistributedDataParallel: rank ", rank, ": checkpoint '", prefix,
                "' not loaded: ranks ", rank_list(refused),
                " could not restore the optimizer's or the algorithm's state (their own errors "
                "say why); every rank kept its own state");
}

}  // namespace relaxcc::torch
