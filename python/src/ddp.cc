// relaxcc._C's algorithm modules: relaxcc::torch::DistributedDataParallel
// over a Python model and optimizer, and every algorithm's options as a
// Python dict.
//
// Options. Each options struct lists its fields once (fields() below); one
// generic reader fills a struct from a dict (unknown keys: InvalidArgument
// naming the valid ones; a value of the wrong Python type: InvalidType, a
// TypeError) and one generic writer turns a struct into a dict, which gives
// Python every default. Nested structs are dicts, optional ones None or a
// dict (the missing keys at their defaults), enums their names, durations
// datetime.timedelta (or seconds).
//
// The model. DistributedDataParallel takes a torch::nn::Module; Python's
// module is mirrored by one whose parameters and buffers are the Python
// module's tensors (the same TensorImpl: the accumulator hooks and the
// in-place restores of load() reach the Python model), named as Python
// names them. The torch optimizer is a proxy whose step() runs the Python
// optimizer's step() (taking the GIL); its save()/load() carry the Python
// optimizer's state_dict (torch.save bytes), and a reset that the algorithm
// asks for (DistributedDataParallel clears state()) clears the Python
// optimizer's state before its next step.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/optim/sgd.h>

#include <concepts>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "python/src/process_group.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/torch/ddp.h"

namespace py = pybind11;

namespace relaxcc::python {
namespace {

using namespace relaxcc::algorithms;
using kernels::ChunkTopkConfig;
using kernels::CompressorConfig;
using kernels::CompressorKind;
using kernels::RandomKMode;
using kernels::Rounding;

// ---- The fields of every options struct, in declaration order.

template <class V>
void fields(V& v, AdaptiveDeadlineOptions& o) {
  v("k", o.k), v("quorum", o.quorum), v("floor_fraction", o.floor_fraction);
  v("min_floor", o.min_floor), v("cap", o.cap), v("window", o.window);
  v("straggler_misses", o.straggler_misses), v("probe_interval", o.probe_interval);
}
template <class V>
void fields(V& v, RoundDeadlineOptions& o) {
  v("fixed", o.fixed), v("adaptive", o.adaptive), v("adaptive_options", o.adaptive_options);
}
template <class V>
void fields(V& v, CompressorConfig& o) {
  v("kind", o.kind), v("bits", o.bits), v("chunk", o.chunk), v("rounding", o.rounding);
  v("ratio", o.ratio), v("keep", o.keep), v("topk_ratio", o.topk_ratio);
  v("approximate", o.approximate), v("random_mode", o.random_mode), v("seed", o.seed);
}
template <class V>
void fields(V& v, ChunkTopkConfig& o) {
  v("chunk", o.chunk), v("ratio", o.ratio), v("bits", o.bits), v("group", o.group);
}
template <class V>
void fields(V& v, AdamOptions& o) {
  v("lr", o.lr), v("beta1", o.beta1), v("beta2", o.beta2), v("eps", o.eps);
  v("weight_decay", o.weight_decay), v("decoupled_weight_decay", o.decoupled_weight_decay);
}
template <class V>
void fields(V& v, GradientAllreduceOptions& o) {
  v("average", o.average), v("hierarchical", o.hierarchical);
}
template <class V>
void fields(V& v, ByteGradOptions& o) {
  v("bits", o.bits), v("rounding", o.rounding), v("hierarchical", o.hierarchical);
  v("error_feedback", o.error_feedback), v("average", o.average);
}
template <class V>
void fields(V& v, QAdamOptions& o) {
  v("adam", o.adam), v("warmup_steps", o.warmup_steps), v("codec", o.codec), v("bits", o.bits);
  v("chunk", o.chunk);
}
template <class V>
void fields(V& v, CocktailSgdOptions& o) {
  v("random_ratio", o.random_ratio), v("topk_ratio", o.topk_ratio), v("bits", o.bits);
  v("chunk", o.chunk), v("rounding", o.rounding), v("random_mode", o.random_mode);
  v("warmup_steps", o.warmup_steps), v("seed", o.seed), v("pack_payloads", o.pack_payloads);
}
template <class V>
void fields(V& v, LocalSgdOptions& o) {
  v("period", o.period), v("warmup_steps", o.warmup_steps);
}
template <class V>
void fields(V& v, DecentralizedSgdOptions& o) {
  v("mode", o.mode), v("communication_interval", o.communication_interval);
  v("consensus_step", o.consensus_step), v("deadline", o.deadline), v("tag", o.tag);
}
template <class V>
void fields(V& v, LowPrecisionDecentralizedSgdOptions& o) {
  v("codec", o.codec), v("gamma", o.gamma), v("communication_interval", o.communication_interval);
  v("tag", o.tag), v("deadline", o.deadline);
}
template <class V>
void fields(V& v, AsyncModelAverageOptions& o) {
  v("interval_steps", o.interval_steps), v("warmup_steps", o.warmup_steps);
  v("max_staleness_steps", o.max_staleness_steps), v("mode", o.mode), v("deadline", o.deadline);
  v("stop_timeout", o.stop_timeout), v("tag", o.tag);
}
template <class V>
void fields(V& v, MoshpitSgdOptions& o) {
  v("local_steps", o.local_steps), v("grid", o.grid), v("random_groups", o.random_groups);
  v("seed", o.seed), v("deadline", o.deadline), v("codec", o.codec), v("tag", o.tag);
}
template <class V>
void fields(V& v, DilocoOptions& o) {
  v("inner_steps", o.inner_steps), v("outer_lr", o.outer_lr);
  v("outer_momentum", o.outer_momentum), v("nesterov", o.nesterov), v("codec", o.codec);
  v("chunk_topk", o.chunk_topk), v("error_feedback", o.error_feedback);
  v("feedback_decay", o.feedback_decay), v("fragments", o.fragments);
  v("overlap_steps", o.overlap_steps), v("eager", o.eager), v("hierarchical", o.hierarchical);
}
template <class V>
void fields(V& v, BucketPlanOptions& o) {
  v("cap_bytes", o.cap_bytes), v("first_cap_bytes", o.first_cap_bytes);
}
template <class V>
void fields(V& v, ReducerOptions& o) {
  v("plan", o.plan), v("auto_tune_buckets", o.auto_tune_buckets);
  v("gradient_as_bucket_view", o.gradient_as_bucket_view);
  v("rebuild_after_first_step", o.rebuild_after_first_step), v("timeout", o.timeout);
}
template <class V>
void fields(V& v, torch::DdpOptions& o) {
  v("reducer", o.reducer), v("broadcast_buffers", o.broadcast_buffers);
  v("check_uneven_inputs", o.check_uneven_inputs);
}

// ---- Enums by name.

template <class E>
std::vector<std::pair<const char*, E>> enum_names();
template <>
std::vector<std::pair<const char*, Rounding>> enum_names() {
  return {{"nearest", Rounding::nearest}, {"stochastic", Rounding::stochastic}};
}
template <>
std::vector<std::pair<const char*, RandomKMode>> enum_names() {
  return {{"stratified", RandomKMode::stratified}, {"rolling", RandomKMode::rolling}};
}
template <>
std::vector<std::pair<const char*, GossipMode>> enum_names() {
  return {{"all", GossipMode::all},
          {"ring", GossipMode::ring},
          {"shift_one", GossipMode::shift_one},
          {"exponential", GossipMode::exponential}};
}
template <>
std::vector<std::pair<const char*, CompressorKind>> enum_names() {
  return {{"f16", CompressorKind::f16},          {"bf16", CompressorKind::bf16},
          {"minmax", CompressorKind::minmax},    {"sign", CompressorKind::sign},
          {"topk", CompressorKind::topk},        {"randomk", CompressorKind::randomk},
          {"cocktail", CompressorKind::cocktail}};
}

template <class T>
concept Struct = requires(T& t, int& v) {
  fields(v, t);
};
template <class T>
concept Enum = std::is_enum_v<T>;
template <class T>
concept Duration = requires {
  typename T::rep;
  typename T::period;
};

[[noreturn]] void type_error(const std::string& path, const char* expected, py::handle got) {
  const std::string message = detail::concat(path, ": expected ", expected, ", got ",
                                             py::str(py::type::of(got).attr("__name__")));
  PyErr_SetString(py::module_::import("relaxcc._C").attr("InvalidType").ptr(), message.c_str());
  throw py::error_already_set();
}

// Reads a dict into a struct: read(path, value, field).
struct Reader {
  template <Struct T>
  static void read(const std::string& path, py::handle value, T& out) {
    if (!py::isinstance<py::dict>(value)) type_error(path, "a dict of options", value);
    const auto dict = py::reinterpret_borrow<py::dict>(value);
    std::set<std::string> known;
    std::string names;
    auto visit = [&](const char* name, auto& field) {
      known.insert(name);
      names += names.empty() ? name : detail::concat(", ", name);
      if (dict.contains(name)) read(path + "." + name, dict[name], field);
    };
    fields(visit, out);
    for (const auto& [key, _] : dict) {
      const std::string k = py::str(key);
      if (!known.count(k))
        RELAXCC_THROW(InvalidArgument, path, ": unknown option '", k, "'; the options are ", names);
    }
  }
  template <Struct T>
  static void read(const std::string& path, py::handle value, std::optional<T>& out) {
    if (value.is_none()) return out.reset();
    read(path, value, out.emplace());
  }
  static void read(const std::string& path, py::handle value, bool& out) {
    if (!py::isinstance<py::bool_>(value)) type_error(path, "a bool", value);
    out = value.cast<bool>();
  }
  template <std::integral T>
  static void read(const std::string& path, py::handle value, T& out) {
    if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value))
      type_error(path, "an int", value);
    const auto wide = value.cast<py::int_>();
    try {
      out = wide.cast<T>();
    } catch (const py::cast_error&) {
      RELAXCC_THROW(InvalidArgument, path, ": ", py::repr(wide).cast<std::string>(),
                    " is out of the range of its type");
    }
  }
  template <std::floating_point T>
  static void read(const std::string& path, py::handle value, T& out) {
    if ((!py::isinstance<py::float_>(value) && !py::isinstance<py::int_>(value)) ||
        py::isinstance<py::bool_>(value))
      type_error(path, "a number", value);
    out = static_cast<T>(value.cast<double>());
  }
  template <Enum T>
  static void read(const std::string& path, py::handle value, T& out) {
    if (!py::isinstance<py::str>(value)) type_error(path, "a str", value);
    const std::string name = value.cast<std::string>();
    std::string names;
    for (const auto& [n, e] : enum_names<T>()) {
      if (name == n) return void(out = e);
      names += detail::concat(names.empty() ? "'" : ", '", n, "'");
    }
    RELAXCC_THROW(InvalidArgument, path, ": '", name, "' is none of ", names);
  }
  template <Duration T>
  static void read(const std::string& path, py::handle value, T& out) {
    const py::object timedelta = py::module_::import("datetime").attr("timedelta");
    if (!py::isinstance(value, timedelta) &&
        ((!py::isinstance<py::float_>(value) && !py::isinstance<py::int_>(value)) ||
         py::isinstance<py::bool_>(value)))
      type_error(path, "a datetime.timedelta or seconds", value);
    out = std::chrono::duration_cast<T>(value.cast<std::chrono::duration<double>>());
  }
  static void read(const std::string& path, py::handle value, std::vector<int>& out) {
    if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value))
      type_error(path, "a list of ints", value);
    out.clear();
    int i = 0;
    for (const auto& item : value)
      read(detail::concat(path, "[", i++, "]"), item, out.emplace_back());
  }
};

// Writes a struct as a dict.
struct Writer {
  template <Struct T>
  static py::object write(T& value) {
    py::dict dict;
    auto visit = [&](const char* name, auto& field) { dict[name] = write(field); };
    fields(visit, value);
    return dict;
  }
  template <Struct T>
  static py::object write(std::optional<T>& value) {
    return value ? write(*value) : py::none();
  }
  template <Enum T>
  static py::object write(T& value) {
    for (const auto& [n, e] : enum_names<T>())
      if (e == value) return py::str(n);
    RELAXCC_THROW(InternalError, "an enum value without a name: ", static_cast<int>(value));
  }
  template <class T>
  static py::object write(T& value) {
    return py::cast(value);
  }
};

template <Struct T>
T read_options(const std::string& path, const py::dict& dict) {
  T options;
  Reader::read(path, dict, options);
  return options;
}

// ---- The algorithm modules.

struct AlgorithmModule {
  std::function<py::object()> defaults;
  std::function<py::object(const py::dict&)> normalize;  // every field, defaults filled in
  std::function<AlgorithmPtr(const py::dict&)> make;
};

template <class Options, class Module>
AlgorithmModule algorithm_module(const std::string& name) {
  return {[] {
            Options o;
            return Writer::write(o);
          },
          [name](const py::dict& d) {
            Options o = read_options<Options>(name, d);
            return Writer::write(o);
          },
          [name](const py::dict& d) -> AlgorithmPtr {
            return std::make_shared<Module>(read_options<Options>(name, d));
          }};
}

const std::map<std::string, AlgorithmModule>& algorithm_modules() {
  static const std::map<std::string, AlgorithmModule> modules = {
      {"gradient_allreduce",
       algorithm_module<GradientAllreduceOptions, GradientAllreduce>("gradient_allreduce")},
      {"bytegrad", algorithm_module<ByteGradOptions, ByteGrad>("bytegrad")},
      {"qadam", algorithm_module<QAdamOptions, QAdam>("qadam")},
      {"cocktail_sgd", algorithm_module<CocktailSgdOptions, CocktailSgd>("cocktail_sgd")},
      {"local_sgd", algorithm_module<LocalSgdOptions, LocalSgd>("local_sgd")},
      {"decentralized_sgd",
       algorithm_module<DecentralizedSgdOptions, DecentralizedSgd>("decentralized_sgd")},
      {"low_precision_decentralized_sgd",
       algorithm_module<LowPrecisionDecentralizedSgdOptions, LowPrecisionDecentralizedSgd>(
           "low_precision_decentralized_sgd")},
      {"async_model_average",
       algorithm_module<AsyncModelAverageOptions, AsyncModelAverage>("async_model_average")},
      {"moshpit_sgd", algorithm_module<MoshpitSgdOptions, MoshpitSgd>("moshpit_sgd")},
      {"diloco", algorithm_module<DilocoOptions, Diloco>("diloco")},
  };
  return modules;
}

const AlgorithmModule& algorithm_module(const std::string& name) {
  const auto& modules = algorithm_modules();
  const auto it = modules.find(name);
  if (it != modules.end()) return it->second;
  std::string names;
  for (const auto& [n, _] : modules) names += detail::concat(names.empty() ? "" : ", ", n);
  RELAXCC_THROW(InvalidArgument, "relaxcc: no algorithm module '", name, "'; the modules are ",
                names);
}

// The presets of the modules' headers, as option dicts.
py::object algorithm_preset(const std::string& name, int inner_steps) {
  if (name == "diloco_paper") {
    DilocoOptions o = diloco_paper_options(inner_steps);
    return Writer::write(o);
  }
  if (name == "sparseloco") {
    DilocoOptions o = sparseloco_options(inner_steps);
    return Writer::write(o);
  }
  if (name == "cocktail_sparse") {
    CocktailSgdOptions o = CocktailSgdOptions::sparse();
    return Writer::write(o);
  }
  RELAXCC_THROW(InvalidArgument, "relaxcc: no preset '", name,
                "'; the presets are diloco_paper, sparseloco, cocktail_sparse");
}

// ---- The model and the optimizer that DistributedDataParallel sees.

// A module with the given (dotted) names' parameters and buffers, the child
// modules made from the dots.
class Mirror final : public ::torch::nn::Module {
 public:
  void add(const std::string& name, const at::Tensor& t, bool parameter) {
    const size_t dot = name.find('.');
    if (dot == std::string::npos) {
      if (parameter)
        register_parameter(name, t, t.requires_grad());
      else
        register_buffer(name, t);
      return;
    }
    const std::string head = name.substr(0, dot);
    auto& child = children_[head];
    if (!child) child = register_module(head, std::make_shared<Mirror>());
    child->add(name.substr(dot + 1), t, parameter);
  }

 private:
  std::map<std::string, std::shared_ptr<Mirror>> children_;
};

// The Python optimizer as a torch::optim::Optimizer.
class PythonOptimizer final : public ::torch::optim::Optimizer {
 public:
  explicit PythonOptimizer(py::object optimizer)
      : Optimizer(groups(optimizer), std::make_unique<::torch::optim::SGDOptions>(0.0)),
        optimizer_(std::move(optimizer)) {
    mark();
  }
  ~PythonOptimizer() override {
    py::gil_scoped_acquire gil;
    optimizer_ = py::object();
  }
  // The Python groups' learning rates into these groups' (the GIL held).
  void pass_learning_rates() {
    const py::list groups = optimizer_.attr("param_groups");
    RELAXCC_ENFORCE(groups.size() == param_groups().size(), InvalidArgument,
                    "relaxcc.DistributedDataParallel: the optimizer has ", groups.size(),
                    " parameter groups now and had ", param_groups().size(),
                    " when it was wrapped");
    for (size_t g = 0; g < groups.size(); ++g)
      param_groups()[g].options().set_lr(groups[g]["lr"].cast<double>());
  }
  at::Tensor step(LossClosure) override {
    py::gil_scoped_acquire gil;
    if (!state().count(kMarker)) {  // DistributedDataParallel reset the state
      optimizer_.attr("state").attr("clear")();
      mark();
    }
    optimizer_.attr("step")();
    return {};
  }
  void save(::torch::serialize::OutputArchive& archive) const override {
    py::gil_scoped_acquire gil;
    const py::object io = py::module_::import("io").attr("BytesIO")();
    py::module_::import("torch").attr("save")(optimizer_.attr("state_dict")(), io);
    const std::string bytes = io.attr("getvalue")().cast<py::bytes>();
    at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    archive.write("python_optimizer", t);
  }
  void load(::torch::serialize::InputArchive& archive) override {
    at::Tensor t;
    archive.read("python_optimizer", t);
    py::gil_scoped_acquire gil;
    const py::bytes bytes(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
    const py::object io = py::module_::import("io").attr("BytesIO")(bytes);
    optimizer_.attr("load_state_dict")(py::module_::import("torch").attr("load")(io));
  }

 private:
  static constexpr const char* kMarker = "relaxcc.python_optimizer";
  static std::vector<::torch::optim::OptimizerParamGroup> groups(const py::object& optimizer) {
    std::vector<::torch::optim::OptimizerParamGroup> out;
    for (const py::handle group : optimizer.attr("param_groups")) {
      std::vector<at::Tensor> params;
      for (const py::handle p : group["params"]) params.push_back(p.cast<at::Tensor>());
      out.emplace_back(std::move(params),
                       std::make_unique<::torch::optim::SGDOptions>(group["lr"].cast<double>()));
    }
    return out;
  }
  void mark() { state()[kMarker] = std::make_unique<::torch::optim::OptimizerParamState>(); }

  py::object optimizer_;
};

// What the Python DistributedDataParallel holds: the mirror, the optimizer
// proxy and the C++ wrapper over them (destroyed first, without the GIL).
class PythonDdp {
 public:
  PythonDdp(CommunicatorPtr comm, const std::vector<std::pair<std::string, at::Tensor>>& params,
            const std::vector<std::pair<std::string, at::Tensor>>& buffers, py::object optimizer,
            AlgorithmPtr algorithm, const torch::DdpOptions& options)
      : mirror_(std::make_shared<Mirror>()),
        optimizer_(std::make_unique<PythonOptimizer>(std::move(optimizer))) {
    for (const auto& [name, t] : params) mirror_->add(name, t, true);
    for (const auto& [name, t] : buffers) mirror_->add(name, t, false);
    py::gil_scoped_release release;
    ddp_ = std::make_unique<torch::DistributedDataParallel>(std::move(comm), *mirror_, *optimizer_,
                                                            std::move(algorithm), options);
  }
  ~PythonDdp() {
    py::gil_scoped_release release;
    no_sync_.reset();
    ddp_.reset();
  }
  void step() {
    optimizer_->pass_learning_rates();
    py::gil_scoped_release release;
    ddp_->step();
  }
  void enter_no_sync() {
    RELAXCC_ENFORCE(!no_sync_, InvalidArgument,
                    "relaxcc.DistributedDataParallel: no_sync() is entered already");
    py::gil_scoped_release release;
    no_sync_ = std::make_unique<torch::DistributedDataParallel::NoSync>(*ddp_);
  }
  void exit_no_sync() {
    py::gil_scoped_release release;
    no_sync_.reset();
  }
  void with_averaged_model(const py::function& fn) {
    py::gil_scoped_release release;
    ddp_->with_averaged_model([&] {
      py::gil_scoped_acquire gil;
      fn();
    });
  }
  torch::DistributedDataParallel& ddp() { return *ddp_; }

 private:
  std::shared_ptr<Mirror> mirror_;
  std::unique_ptr<PythonOptimizer> optimizer_;
  std::unique_ptr<torch::DistributedDataParallel> ddp_;
  std::unique_ptr<torch::DistributedDataParallel::NoSync> no_sync_;
};

CommunicatorPtr communicator_of(const py::object& group) {
  if (group.is_none()) {
    py::gil_scoped_release release;
    return create_mpi_communicator();
  }
  RELAXCC_ENFORCE(py::isinstance<ProcessGroupRelaxcc>(group), InvalidArgument,
                  "relaxcc.DistributedDataParallel: process_group must be a relaxcc group, got ",
                  py::str(py::type::of(group).attr("__name__")).cast<std::string>());
  return group.cast<c10::intrusive_ptr<ProcessGroupRelaxcc>>()->communicator();
}

}  // namespace

void register_algorithms(py::module_& m) {
  m.def(
      "algorithm_defaults",
      [] {
        py::dict out;
        for (const auto& [name, module] : algorithm_modules())
          out[name.c_str()] = module.defaults();
        return out;
      },
      "every algorithm module's options at their C++ defaults");
  m.def(
      "algorithm_options",
      [](const std::string& name, const py::dict& options) {
        // Construction checks the values (the modules throw InvalidArgument).
        const AlgorithmModule& module = algorithm_module(name);
        module.make(options);
        return module.normalize(options);
      },
      py::arg("name"), py::arg("options"),
      "checks `options` of module `name` and returns them with every default filled in");
  m.def(
      "ddp_defaults",
      [] {
        torch::DdpOptions o;
        return Writer::write(o);
      },
      "relaxcc::torch::DdpOptions at its defaults");
  m.def("algorithm_preset", &algorithm_preset, py::arg("name"), py::arg("inner_steps") = 500,
        "the options of a preset: diloco_paper, sparseloco, cocktail_sparse");

  py::class_<PythonDdp>(m, "DistributedDataParallel")
      .def(py::init([](const py::object& group,
                       const std::vector<std::pair<std::string, at::Tensor>>& params,
                       const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                       const py::object& optimizer, const std::string& algorithm,
                       const py::dict& algorithm_options, const py::dict& options) {
             AlgorithmPtr a = algorithm_module(algorithm).make(algorithm_options);
             const auto o = read_options<torch::DdpOptions>("DistributedDataParallel", options);
             return std::make_unique<PythonDdp>(communicator_of(group), params, buffers, optimizer,
                                                std::move(a), o);
           }),
           py::arg("process_group"), py::arg("parameters"), py::arg("buffers"),
           py::arg("optimizer"), py::arg("algorithm"), py::arg("algorithm_options"),
           py::arg("options"))
      .def("step", &PythonDdp::step)
      .def("enter_no_sync", &PythonDdp::enter_no_sync)
      .def("exit_no_sync", &PythonDdp::exit_no_sync)
      .def(
          "finish", [](PythonDdp& d) { d.ddp().finish(); },
          py::call_guard<py::gil_scoped_release>())
      .def("with_averaged_model", &PythonDdp::with_averaged_model)
      .def(
          "save", [](PythonDdp& d, const std::string& p) { d.ddp().save(p); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "load", [](PythonDdp& d, const std::string& p) { d.ddp().load(p); },
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("steps", [](PythonDdp& d) { return d.ddp().steps(); })
      .def_property_readonly("rank", [](PythonDdp& d) { return d.ddp().communicator()->rank(); })
      .def_property_readonly("world_size",
                             [](PythonDdp& d) { return d.ddp().communicator()->size(); })
      .def_property_readonly("algorithm", [](PythonDdp& d) { return d.ddp().algorithm().name(); });
}

}  // namespace relaxcc::python
