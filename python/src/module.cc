// relaxcc._C: the backend's process group, the comm hooks' state, and
// relaxcc's error types as Python exceptions.
//
// Hook state. A hook keeps, per DDP bucket (its index and element count), the
// error-feedback residuals of its relaxed primitive and its RNG position
// (stochastic rounding's counter, random-k's step). A bucket rebuild that
// changes a bucket's size starts that bucket afresh; state_dict() holds every
// bucket's state, so a checkpoint taken after the rebuild resumes bit for bit.
// Calls for one bucket run one after the other (DDP waits for a step's
// buckets before the next step starts), as the primitives require.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <bit>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "python/src/process_group.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/error_feedback.h"
#include "relaxcc/launch.h"
#include "relaxcc/relaxed/auto_codec.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "relaxcc/relaxed/sparse_allreduce.h"
#include "relaxcc/state_dict.h"

namespace py = pybind11;

namespace relaxcc::python {
namespace {

using PgPtr = c10::intrusive_ptr<ProcessGroupRelaxcc>;
using BucketKey = std::pair<int64_t, int64_t>;  // DDP bucket index, elements

TensorView gradient_view(const at::Tensor& t, const char* hook) {
  RELAXCC_ENFORCE(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
                  InvalidArgument, "relaxcc hook ", hook,
                  ": a bucket of contiguous float32 CPU gradients, got ",
                  c10::toString(t.scalar_type()), " on ", t.device().str(),
                  t.is_contiguous() ? "" : " (not contiguous)");
  return TensorView(t.data_ptr(), t.numel(), DType::f32, Device::host(),
                    std::make_shared<at::Tensor>(t));
}

std::string bucket_prefix(const BucketKey& key) {
  return "bucket." + std::to_string(key.first) + "." + std::to_string(key.second) + ".";
}

py::bytes serialize(const StateDict& dict) {
  const auto bytes = dict.serialize();
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}
StateDict deserialize(const py::bytes& data) {
  const std::string s = data;
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return StateDict::deserialize(std::vector<std::byte>(p, p + s.size()));
}

// The buckets a state dict holds: "buckets" lists index, elements pairs.
std::vector<BucketKey> saved_buckets(const StateDict& dict) {
  const auto flat = dict.get_ints("buckets");
  RELAXCC_ENFORCE(flat.size() % 2 == 0, InvalidArgument, "relaxcc hook state: 'buckets' holds ",
                  flat.size(), " integers, not pairs");
  std::vector<BucketKey> keys;
  for (size_t i = 0; i < flat.size(); i += 2) keys.emplace_back(flat[i], flat[i + 1]);
  return keys;
}
// The buckets a state dict holds, each filled by load(bucket, key, prefix)
// (prefix: the bucket's keys in the dict). All are loaded before any is
// used, so that a bad state dict leaves the hook as it was.
template <class Bucket, class Load>
std::map<BucketKey, Bucket> load_buckets(const StateDict& dict, Load&& load) {
  std::map<BucketKey, Bucket> loaded;
  for (const auto& key : saved_buckets(dict)) load(loaded[key], key, bucket_prefix(key));
  return loaded;
}
template <typename Map>
void put_buckets(StateDict& dict, const Map& states) {
  std::vector<int64_t> flat;
  for (const auto& [key, state] : states) {
    flat.push_back(key.first);
    flat.push_back(key.second);
  }
  dict.put_ints("buckets", flat);
}

// Compressed allreduce (a fixed dense codec, or the auto codec's choice)
// with worker- and server-side error feedback.
class CompressedHook {
 public:
  CompressedHook(PgPtr pg, std::optional<kernels::CompressorConfig> codec,
                 std::shared_ptr<AutoCodec> auto_codec, int64_t segment_bytes, uint64_t seed)
      : pg_(std::move(pg)),
        codec_(std::move(codec)),
        auto_codec_(std::move(auto_codec)),
        segment_bytes_(segment_bytes),
        seed_(seed) {
    if (codec_) codec_->validate();
  }

  c10::intrusive_ptr<::c10d::Work> allreduce(int64_t bucket, const at::Tensor& grad) {
    const TensorView x = gradient_view(grad, "compressed_allreduce");
    Communicator& comm = *pg_->communicator();
    Bucket& b = buckets_[{bucket, x.numel}];
    if (!b.state)
      b.state = std::make_unique<CompressedAllreduceState>(x.numel, comm.rank(), comm.size());
    CompressedAllreduceOptions o;
    o.codec = codec_;
    o.auto_codec = auto_codec_.get();
    o.state = b.state.get();
    o.segment_bytes = segment_bytes_;
    o.label = "ddp bucket " + std::to_string(bucket);
    ExecContext ctx = ExecContext::host();
    ctx.rng = {seed_, b.rng_offset};
    b.rng_offset += static_cast<uint64_t>(x.numel);
    auto op = compressed_allreduce(comm, x, ctx, o);
    return pg_->wrap(::c10d::OpType::ALLREDUCE, op, {grad});
  }

  py::bytes state_dict() const {
    StateDict dict;
    put_buckets(dict, buckets_);
    for (const auto& [key, b] : buckets_) {
      b.state->save(dict, bucket_prefix(key));
      dict.put_int(bucket_prefix(key) + "rng_offset", static_cast<int64_t>(b.rng_offset));
    }
    if (auto_codec_) {
      // The agreed calibration: a resumed run makes the same choices.
      const AutoCodecMeasurements& m = auto_codec_->measurements();
      std::vector<double> all{m.call_seconds, m.ring_seconds_per_byte};
      for (const auto* v :
           {&m.encode_seconds_per_byte, &m.decode_seconds_per_byte, &m.overhead_seconds_per_byte})
        all.insert(all.end(), v->begin(), v->end());
      std::vector<int64_t> bits;
      for (double d : all) bits.push_back(std::bit_cast<int64_t>(d));
      dict.put_ints("auto_codec.measurements", bits);
    }
    return serialize(dict);
  }
  void load_state_dict(const py::bytes& data) {
    const StateDict dict = deserialize(data);
    const Communicator& comm = *pg_->communicator();
    auto loaded =
        load_buckets<Bucket>(dict, [&](Bucket& b, const BucketKey& key, const std::string& prefix) {
          b.state =
              std::make_unique<CompressedAllreduceState>(key.second, comm.rank(), comm.size());
          b.state->load(dict, prefix);
          b.rng_offset = static_cast<uint64_t>(dict.get_int(prefix + "rng_offset"));
        });
    if (auto_codec_) {
      const auto bits = dict.get_ints("auto_codec.measurements");
      const size_t codecs = auto_codec_->options().codecs.size();
      RELAXCC_ENFORCE_EQ(bits.size(), 2 + 3 * codecs, InvalidArgument,
                         "relaxcc hook state: auto codec measurements");
      std::vector<double> all;
      for (int64_t b : bits) all.push_back(std::bit_cast<double>(b));
      AutoCodecMeasurements m;
      m.call_seconds = all[0];
      m.ring_seconds_per_byte = all[1];
      const auto part = [&](size_t i) {
        return std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(2 + i * codecs),
                                   all.begin() + static_cast<std::ptrdiff_t>(2 + (i + 1) * codecs));
      };
      m.encode_seconds_per_byte = part(0);
      m.decode_seconds_per_byte = part(1);
      m.overhead_seconds_per_byte = part(2);
      auto_codec_ = std::make_shared<AutoCodec>(auto_codec_->ranks(), m, auto_codec_->options());
    }
    buckets_ = std::move(loaded);
  }

 private:
  struct Bucket {
    std::unique_ptr<CompressedAllreduceState> state;
    uint64_t rng_offset = 0;
  };
  PgPtr pg_;
  std::optional<kernels::CompressorConfig> codec_;
  std::shared_ptr<AutoCodec> auto_codec_;
  int64_t segment_bytes_;
  uint64_t seed_;
  std::map<BucketKey, Bucket> buckets_;
};

// Top-k or random-k sparse allreduce with error feedback (top-k: worker and
// server side; random-k: worker side), the step rolling per bucket; or
// CocktailSGD's composite codec (kind cocktail): every rank encodes its
// bucket plus its residual with relaxcc/kernels/compressor.h's cocktail
// codec (random-k with the rolling stride, from the shared seed and the
// bucket's step, so every rank keeps the same random selection; top-k among
// those; min-max quantization of the kept values; worker-side error
// feedback), the payloads are all-gathered, and each rank decodes and sums
// them in rank order on the communicator's compute thread, so every rank
// ends with the same bits. Its bytes received grow with the ranks (n - 1
// payloads). Unlike the sparse allreduce, its residual is updated when the
// bucket is encoded, before the exchange succeeds.
class SparseHook {
 public:
  SparseHook(PgPtr pg, kernels::CompressorConfig codec) : pg_(std::move(pg)), codec_(codec) {
    codec_.validate();
  }

  c10::intrusive_ptr<::c10d::Work> allreduce(int64_t bucket, const at::Tensor& grad) {
    const TensorView x = gradient_view(grad, "sparse_allreduce");
    Communicator& comm = *pg_->communicator();
    Bucket& b = buckets_[{bucket, x.numel}];
    if (!b.worker) make(b, x.numel, comm);
    if (codec_.kind == kernels::CompressorKind::cocktail) return cocktail(bucket, grad, x, b);
    SparseAllreduceOptions o;
    o.codec = codec_;
    o.codec.step = b.step++;
    o.feedback = b.worker.get();
    o.server_feedback = b.server.get();
    o.label = "ddp bucket " + std::to_string(bucket);
    auto op = sparse_allreduce(comm, x, ExecContext::host(), o);
    return pg_->wrap(::c10d::OpType::ALLREDUCE, op, {grad});
  }

  py::bytes state_dict() const {
    StateDict dict;
    put_buckets(dict, buckets_);
    for (const auto& [key, b] : buckets_) {
      const std::string prefix = bucket_prefix(key);
      dict.put_floats(prefix + "worker", b.worker->residual());
      if (b.server) dict.put_floats(prefix + "server", b.server->residual());
      dict.put_int(prefix + "step", static_cast<int64_t>(b.step));
    }
    return serialize(dict);
  }
  void load_state_dict(const py::bytes& data) {
    const StateDict dict = deserialize(data);
    const Communicator& comm = *pg_->communicator();
    buckets_ =
        load_buckets<Bucket>(dict, [&](Bucket& b, const BucketKey& key, const std::string& prefix) {
          make(b, key.second, comm);
          load_residual(*b.worker, dict.get_floats(prefix + "worker"), prefix + "worker");
          if (b.server)
            load_residual(*b.server, dict.get_floats(prefix + "server"), prefix + "server");
          b.step = static_cast<uint64_t>(dict.get_int(prefix + "step"));
        });
  }

 private:
  struct Bucket {
    std::unique_ptr<kernels::ErrorFeedback> worker, server;
    uint64_t step = 0;
  };
  c10::intrusive_ptr<::c10d::Work> cocktail(int64_t bucket, const at::Tensor& grad,
                                            const TensorView& x, Bucket& b) {
    Communicator& comm = *pg_->communicator();
    kernels::CompressorConfig c = codec_;
    c.step = b.step++;
    const auto bytes = static_cast<int64_t>(kernels::encoded_size(x.numel, c));
    auto mine = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(bytes));
    auto all = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(bytes * comm.size()));
    b.worker->compress(x, *mine, c, ExecContext::host());
    AllgatherOptions o;
    o.label = "ddp bucket " + std::to_string(bucket);
    OpOptions after;
    after.after =
        comm.allgather(TensorView(mine->data(), bytes, DType::u8, Device::host(), mine),
                       TensorView(all->data(), bytes * comm.size(), DType::u8, Device::host(), all),
                       ExecContext::host(), o);
    const int ranks = comm.size();
    auto sum = comm.compute(
        [x, all, bytes, ranks] {
          std::fill_n(x.as<float>(), x.numel, 0.0f);
          for (int r = 0; r < ranks; ++r)
            kernels::decode_accumulate(
                std::span<const std::byte>(all->data() + r * bytes, static_cast<size_t>(bytes)), x,
                ExecContext::host());
        },
        after);
    return pg_->wrap(::c10d::OpType::ALLREDUCE, sum, {grad});
  }
  void make(Bucket& b, int64_t numel, const Communicator& comm) const {
    b.worker = std::make_unique<kernels::ErrorFeedback>(numel);
    if (codec_.kind == kernels::CompressorKind::topk)
      b.server = std::make_unique<kernels::ErrorFeedback>(
          sparse_allreduce_owned(numel, comm.rank(), comm.size()));
  }
  static void load_residual(kernels::ErrorFeedback& f, std::vector<float> values,
                            const std::string& key) {
    RELAXCC_ENFORCE_EQ(values.size(), f.residual().size(), InvalidArgument, "relaxcc hook state: '",
                       key, "' elements");
    f.residual() = std::move(values);
  }
  PgPtr pg_;
  kernels::CompressorConfig codec_;
  std::map<BucketKey, Bucket> buckets_;
};

PgPtr relaxcc_group(const py::object& pg) {
  RELAXCC_ENFORCE(py::isinstance<ProcessGroupRelaxcc>(pg), InvalidArgument,
                  "relaxcc hooks run on a process group whose backend is 'relaxcc'; this one is ",
                  py::str(py::type::of(pg).attr("__name__")).cast<std::string>());
  return pg.cast<PgPtr>();
}

kernels::Rounding parse_rounding(const std::string& name) {
  if (name == "nearest") return kernels::Rounding::nearest;
  if (name == "stochastic") return kernels::Rounding::stochastic;
  RELAXCC_THROW(InvalidArgument, "relaxcc hook: rounding '", name,
                "' (expected 'nearest' or 'stochastic')");
}

// relaxcc's error types as Python classes: relaxcc.Error derives from
// RuntimeError; InvalidArgument also from ValueError, Unsupported from
// NotImplementedError, Timeout from TimeoutError.
PyObject* new_error(py::module_& m, const char* name, std::initializer_list<PyObject*> bases) {
  py::tuple b(bases.size());
  size_t i = 0;
  for (PyObject* base : bases) b[i++] = py::reinterpret_borrow<py::object>(base);
  const std::string qualified = std::string("relaxcc.") + name;
  PyObject* cls = PyErr_NewException(qualified.c_str(), b.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

// Whether `p` holds an E.
template <class E>
bool holds(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

// A relaxcc error type and its Python class. The table lists each type after
// its base, so that the last entry that holds an error is its own type.
struct ErrorClass {
  bool (*holds)(const std::exception_ptr&);
  PyObject* cls;
};
std::vector<ErrorClass>* error_classes = nullptr;  // set once at import, never freed

void register_errors(py::module_& m) {
  auto* table = new std::vector<ErrorClass>;
  auto add = [&]<class E>(const char* name, std::initializer_list<PyObject*> bases) {
    PyObject* cls = new_error(m, name, bases);
    table->push_back({&holds<E>, cls});
    return cls;
  };
  PyObject* error = add.operator()<Error>("Error", {PyExc_RuntimeError});
  PyObject* invalid = add.operator()<InvalidArgument>("InvalidArgument", {error, PyExc_ValueError});
  // An option of the wrong Python type (relaxcc.algorithms, DistributedDataParallel).
  new_error(m, "InvalidType", {invalid, PyExc_TypeError});
  add.operator()<Unsupported>("Unsupported", {error, PyExc_NotImplementedError});
  add.operator()<CorruptPayload>("CorruptPayload", {error});
  add.operator()<InternalError>("InternalError", {error});
  PyObject* communication = add.operator()<CommunicationError>("CommunicationError", {error});
  add.operator()<Timeout>("Timeout", {communication, PyExc_TimeoutError});
  add.operator()<PeerMismatch>("PeerMismatch", {communication});
  add.operator()<DeviceError>("DeviceError", {communication});
  add.operator()<CommunicatorPoisoned>("CommunicatorPoisoned", {communication});
  error_classes = table;
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      for (auto it = error_classes->rbegin(); it != error_classes->rend(); ++it) {
        if (it->holds(p)) {
          PyErr_SetString(it->cls, e.what());
          return;
        }
      }
    }
  });
}

}  // namespace

// python/src/ddp.cc: relaxcc.DistributedDataParallel and the algorithm modules.
void register_algorithms(py::module_& m);

}  // namespace relaxcc::python

PYBIND11_MODULE(_C, m) {
  using namespace relaxcc;
  using namespace relaxcc::python;
  py::module_::import("torch.distributed");  // registers c10d's base classes
  m.doc() = "relaxcc's torch.distributed backend and comm hooks (C++ extension)";
  register_errors(m);
  register_algorithms(m);

  py::class_<ProcessGroupRelaxcc, BackendBase, PgPtr>(m, "ProcessGroupRelaxcc")
      .def_static(
          "create",
          [](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
             std::chrono::milliseconds timeout, const py::object& parent, const std::string& wing,
             const std::string& store_address) {
            PgPtr p;
            if (!parent.is_none()) p = parent.cast<PgPtr>();
            RELAXCC_ENFORCE(wing == "mpi" || wing == "ucx", InvalidArgument,
                            "ProcessGroupRelaxcc.create: wing '", wing, "' (\"mpi\" or \"ucx\")");
            py::gil_scoped_release release;
            return ProcessGroupRelaxcc::create(
                store, rank, size, timeout, p,
                wing == "mpi" ? mpi_communicator_factory()
                              : ucx_communicator_factory(rank, size, store_address));
          },
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
          py::arg("parent") = py::none(), py::arg("wing") = "mpi",
          py::arg("store_address") = "(torch's store)",
          "c10d's creation callback: collective over the group's members; the default "
          "group's world communicator comes from `wing` (\"mpi\": MPI_COMM_WORLD, \"ucx\": "
          "UCX, meeting on `store`, named `store_address` in messages)")
      .def_property_readonly("members", &ProcessGroupRelaxcc::members,
                             "the world ranks of the members, in group rank order")
      .def_property_readonly("timeout", &ProcessGroupRelaxcc::timeout);

  m.def(
      "launch_environment",
      [] {
        const LaunchEnvironment l = LaunchEnvironment::from_env();
        py::dict d;
        d["launcher"] = launcher_name(l.launcher);
        d["rank"] = l.rank;
        d["size"] = l.size;
        d["local_rank"] = l.local_rank;
        d["rank_variable"] = l.rank_variable;
        d["size_variable"] = l.size_variable;
        return d;
      },
      "how this process was started (LaunchEnvironment::from_env, relaxcc/launch.h): "
      "launcher ('none', 'mpi', 'torchrun' or 'srun'), rank, size and local_rank (-1: not "
      "given) and the variables rank and size came from");
  m.def(
      "wing",
      [] {
        const std::string chosen = Tunables::from_env().python_wing;
        if (chosen.empty())
          return std::string(LaunchEnvironment::from_env().launcher == Launcher::mpi ? "mpi"
                                                                                     : "ucx");
        RELAXCC_ENFORCE(chosen == "mpi" || chosen == "ucx", InvalidArgument,
                        "RELAXCC_PYTHON_WING='", chosen, "': expected 'mpi' or 'ucx'");
        return chosen;
      },
      "the wing of the next world communicator: RELAXCC_PYTHON_WING, else 'mpi' when an MPI "
      "launcher started the process and 'ucx' otherwise");
  m.def(
      "allreduce_seconds",
      [](const py::object& pg, int64_t numel, int iterations) {
        // relaxcc's own allreduce on the group's communicator, timed in C++
        // (bench/peers/python_backend.py: the Python overhead's baseline).
        const PgPtr p = relaxcc_group(pg);
        RELAXCC_ENFORCE(numel > 0 && iterations > 0, InvalidArgument,
                        "allreduce_seconds: numel and iterations must be > 0");
        at::Tensor t = at::ones({numel}, at::kFloat);
        const TensorView v(t.data_ptr(), numel, DType::f32, Device::host(),
                           std::make_shared<at::Tensor>(t));
        py::gil_scoped_release release;
        Communicator& comm = *p->communicator();
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i)
          comm.allreduce(v, ExecContext::host(), AllreduceOptions{})->wait(p->timeout());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
               iterations;
      },
      py::arg("process_group"), py::arg("numel"), py::arg("iterations"),
      "seconds per allreduce of `numel` float32 on the group's communicator, waited one by one");

  py::class_<CompressedHook>(m, "CompressedHook")
      .def(py::init([](const py::object& pg, const std::string& codec, int64_t chunk,
                       const std::string& rounding, int64_t segment_bytes, uint64_t seed) {
             kernels::CompressorConfig c = codec_by_name(codec);
             c.chunk = chunk;
             c.rounding = parse_rounding(rounding);
             return std::make_unique<CompressedHook>(relaxcc_group(pg), c, nullptr, segment_bytes,
                                                     seed);
           }),
           py::arg("process_group"), py::arg("codec"), py::arg("chunk"), py::arg("rounding"),
           py::arg("segment_bytes"), py::arg("seed"))
      .def_static(
          "auto",
          [](const py::object& pg, const std::string& force, double margin, int64_t link_bytes,
             int64_t codec_bytes, int repetitions, int64_t segment_bytes) {
            const PgPtr p = relaxcc_group(pg);
            AutoCodecOptions o;
            o.force = force;
            o.margin = margin;
            o.link_bytes = link_bytes;
            o.codec_bytes = codec_bytes;
            o.repetitions = repetitions;
            py::gil_scoped_release release;
            auto codec = std::make_shared<AutoCodec>(
                AutoCodec::calibrate(*p->communicator(), ExecContext::host(), o));
            return std::make_unique<CompressedHook>(p, std::nullopt, std::move(codec),
                                                    segment_bytes, 0);
          },
          py::arg("process_group"), py::arg("force"), py::arg("margin"), py::arg("link_bytes"),
          py::arg("codec_bytes"), py::arg("repetitions"), py::arg("segment_bytes"),
          "calibrates the auto codec: collective over the group")
      .def("allreduce", &CompressedHook::allreduce, py::arg("bucket"), py::arg("grad"),
           py::call_guard<py::gil_scoped_release>())
      .def("state_dict", &CompressedHook::state_dict)
      .def("load_state_dict", &CompressedHook::load_state_dict);

  py::class_<SparseHook>(m, "SparseHook")
      .def(
          py::init([](const py::object& pg, const std::string& kind, double ratio, int64_t keep,
                      bool approximate, uint64_t seed, double topk_ratio, int bits, int64_t chunk) {
            kernels::CompressorConfig c;
            if (kind == "topk") {
              c.kind = kernels::CompressorKind::topk;
            } else if (kind == "randomk") {
              c.kind = kernels::CompressorKind::randomk;
            } else if (kind == "cocktail") {
              c.kind = kernels::CompressorKind::cocktail;
              c.random_mode = kernels::RandomKMode::rolling;
              c.topk_ratio = topk_ratio;
              c.bits = bits;
              c.chunk = chunk;
            } else {
              RELAXCC_THROW(InvalidArgument, "relaxcc sparse hook: kind '", kind,
                            "' (expected 'topk', 'randomk' or 'cocktail')");
            }
            c.ratio = ratio;
            c.keep = keep;
            c.approximate = approximate;
            c.seed = seed;
            return std::make_unique<SparseHook>(relaxcc_group(pg), c);
          }),
          py::arg("process_group"), py::arg("kind"), py::arg("ratio"), py::arg("keep"),
          py::arg("approximate"), py::arg("seed"), py::arg("topk_ratio") = 1.0, py::arg("bits") = 8,
          py::arg("chunk") = 2048)
      .def("allreduce", &SparseHook::allreduce, py::arg("bucket"), py::arg("grad"),
           py::call_guard<py::gil_scoped_release>())
      .def("state_dict", &SparseHook::state_dict)
      .def("load_state_dict", &SparseHook::load_state_dict);
}
