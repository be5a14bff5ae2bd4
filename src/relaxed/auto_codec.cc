#include "relaxcc/relaxed/auto_codec.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <span>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "src/relaxed/compressed_shards.h"
#include "src/relaxed/tensor_backend.h"

namespace relaxcc {

namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;

constexpr int64_t kDefaultChunk = 2048;

CompressorConfig make_codec(CompressorKind kind, int bits = 8) {
  CompressorConfig c;
  c.kind = kind;
  c.bits = bits;
  c.chunk = kDefaultChunk;
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds of `run` over `reps` runs, after one untimed run (page
// faults, connections); each timed run starts at a barrier when `comm` is set.
template <typename F>
double timed(int reps, Communicator* comm, F&& run) {
  run();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    if (comm) comm->barrier()->wait();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    t.push_back(seconds_since(t0));
  }
  return median(std::move(t));
}

void check(const AutoCodecOptions& o, int ranks) {
  RELAXCC_ENFORCE(ranks >= 1, InvalidArgument, "AutoCodec: ", ranks, " ranks, expected >= 1");
  for (const CompressorConfig& c : o.codecs) {
    c.validate();
    RELAXCC_ENFORCE(relaxed::dense(c.kind), InvalidArgument, "AutoCodec: codec ",
                    kernels::compressor_name(c.kind),
                    " is sparse (expected f16, bf16, minmax or sign)");
  }
  RELAXCC_ENFORCE(o.margin > 0 && o.margin <= 1, InvalidArgument, "AutoCodec: margin ", o.margin,
                  ", expected in (0, 1]");
  RELAXCC_ENFORCE(o.link_bytes >= 4 && o.codec_bytes >= 4 && o.repetitions >= 1, InvalidArgument,
                  "AutoCodec: link_bytes ", o.link_bytes, ", codec_bytes ", o.codec_bytes,
                  ", repetitions ", o.repetitions, " (expected >= 4, >= 4 and >= 1)");
  if (o.force != "auto" && o.force != "f32") codec_by_name(o.force);  // throws for a bad name
  if (!o.measured) return;
  const AutoCodecMeasurements& m = *o.measured;
  RELAXCC_ENFORCE(m.encode_seconds_per_byte.size() == o.codecs.size() &&
                      m.decode_seconds_per_byte.size() == o.codecs.size() &&
                      m.overhead_seconds_per_byte.size() == o.codecs.size(),
                  InvalidArgument, "AutoCodec: measured ", m.encode_seconds_per_byte.size(),
                  " encode, ", m.decode_seconds_per_byte.size(), " decode and ",
                  m.overhead_seconds_per_byte.size(), " overhead figures for ", o.codecs.size(),
                  " codecs");
  std::vector<double> all{m.call_seconds, m.ring_seconds_per_byte};
  all.insert(all.end(), m.encode_seconds_per_byte.begin(), m.encode_seconds_per_byte.end());
  all.insert(all.end(), m.decode_seconds_per_byte.begin(), m.decode_seconds_per_byte.end());
  all.insert(all.end(), m.overhead_seconds_per_byte.begin(), m.overhead_seconds_per_byte.end());
  for (double v : all)
    RELAXCC_ENFORCE(std::isfinite(v) && v >= 0, InvalidArgument, "AutoCodec: measured figure ", v,
                    ", expected finite and >= 0");
}

// What every rank must pass alike: the codecs, the margin and `force`.
uint64_t options_hash(const AutoCodecOptions& o) {
  Fnv1a h;
  for (const CompressorConfig& c : o.codecs) h.bytes(codec_name(c)).byte(0);
  h.u64(std::bit_cast<uint64_t>(o.margin)).bytes(o.force);
  return h.value();
}

// This rank's measurements.
AutoCodecMeasurements measure(Communicator& comm, const ExecContext& ctx,
                              const AutoCodecOptions& o) {
  AutoCodecMeasurements m;
  // The link: the communicator's own allreduce, large and one element.
  const int64_t link_numel = o.link_bytes / 4;
  auto big = std::make_shared<std::vector<float>>(static_cast<size_t>(link_numel), 1.0f);
  auto one = std::make_shared<std::vector<float>>(1, 1.0f);
  const auto allreduce = [&](std::shared_ptr<std::vector<float>>& v) {
    AllreduceOptions a;
    a.label = "AutoCodec calibration";
    comm.allreduce(TensorView::host(v->data(), static_cast<int64_t>(v->size()), v), ctx, a)->wait();
  };
  m.call_seconds = timed(o.repetitions, &comm, [&] { allreduce(one); });
  // The codecs, on this CPU, with the caller's pool.
  const int64_t numel = o.codec_bytes / 4;
  std::vector<float> x(static_cast<size_t>(numel)), y(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) x[i] = std::sin(0.001f * static_cast<float>(i));
  for (const CompressorConfig& c : o.codecs) {
    std::vector<std::byte> payload(kernels::encoded_size(numel, c));
    const TensorView in = TensorView::host(x.data(), numel);
    const TensorView out = TensorView::host(y.data(), numel);
    m.encode_seconds_per_byte.push_back(
        timed(o.repetitions, nullptr, [&] { kernels::encode(in, payload, c, ctx); }) /
        static_cast<double>(numel * 4));
    m.decode_seconds_per_byte.push_back(
        timed(o.repetitions, nullptr, [&] { kernels::decode(payload, out, ctx); }) /
        static_cast<double>(numel * 4));
  }
  // The ring and each codec's schedule at link_bytes, one after the other in
  // each repetition, so that both see the same load on the machine. The
  // ring counts its fastest run, each schedule its median (a bias towards
  // the uncompressed allreduce); what a schedule costs beyond the model's
  // terms (on this rank's own figures) is its overhead.
  const size_t k = o.codecs.size();
  std::vector<std::function<void()>> runs{[&] { allreduce(big); }};
  for (size_t i = 0; i < k; ++i) {
    CompressedAllreduceOptions c;
    c.codec = o.codecs[i];
    c.op = ReduceOp::avg;  // the values stay where they are, for every codec's range
    c.label = "AutoCodec calibration";
    runs.push_back([&, c] {
      compressed_allreduce(comm, TensorView::host(big->data(), link_numel, big), ctx, c)->wait();
    });
  }
  std::vector<std::vector<double>> t(runs.size());
  for (int rep = -1; rep < o.repetitions; ++rep) {  // rep -1: untimed
    for (size_t j = 0; j < runs.size(); ++j) {
      comm.barrier()->wait();
      const auto t0 = std::chrono::steady_clock::now();
      runs[j]();
      if (rep >= 0) t[j].push_back(seconds_since(t0));
    }
  }
  const auto bytes = static_cast<double>(link_numel * 4);
  m.ring_seconds_per_byte =
      std::max(0.0, *std::min_element(t[0].begin(), t[0].end()) - m.call_seconds) / bytes;
  m.overhead_seconds_per_byte.assign(k, 0.0);
  AutoCodecOptions own = o;
  own.force = "auto";
  own.measured = m;
  const AutoCodec model(comm.size(), m, own);
  for (size_t i = 0; i < k; ++i)
    m.overhead_seconds_per_byte[i] =
        std::max(0.0, median(t[i + 1]) - model.predict(link_numel, static_cast<int>(i))) / bytes;
  return m;
}

}  // namespace

std::vector<CompressorConfig> default_auto_codecs() {
  return {make_codec(CompressorKind::bf16), make_codec(CompressorKind::minmax, 8)};
}

CompressorConfig codec_by_name(const std::string& name) {
  if (name == "f16") return make_codec(CompressorKind::f16);
  if (name == "bf16") return make_codec(CompressorKind::bf16);
  if (name == "sign") return make_codec(CompressorKind::sign);
  for (int bits : {8, 4, 2, 1})
    if (name == "minmax" + std::to_string(bits)) return make_codec(CompressorKind::minmax, bits);
  RELAXCC_THROW(InvalidArgument, "codec '", name,
                "': expected f16, bf16, sign, minmax8, minmax4, minmax2 or minmax1");
}

std::string codec_name(const CompressorConfig& codec) {
  std::string name = kernels::compressor_name(codec.kind);
  if (codec.kind == CompressorKind::minmax) name += std::to_string(codec.bits);
  const bool chunked = codec.kind == CompressorKind::minmax || codec.kind == CompressorKind::sign;
  if (chunked && codec.chunk != kDefaultChunk) name += "/chunk" + std::to_string(codec.chunk);
  if (codec.kind == CompressorKind::minmax && codec.rounding == kernels::Rounding::stochastic)
    name += "/stochastic";
  return name;
}

AutoCodec::AutoCodec(int ranks, AutoCodecMeasurements agreed, AutoCodecOptions options)
    : ranks_(ranks), agreed_(std::move(agreed)), options_(std::move(options)) {
  AutoCodecOptions checked = options_;
  checked.measured = agreed_;
  check(checked, ranks_);
  if (options_.force == "f32")
    forced_f32_ = true;
  else if (options_.force != "auto")
    forced_ = codec_by_name(options_.force);
}

AutoCodec AutoCodec::calibrate(Communicator& comm, const ExecContext& ctx,
                               AutoCodecOptions options) {
  relaxed::require_host("AutoCodec::calibrate", comm.rank(), TensorView(), ctx);
  check(options, comm.size());
  const AutoCodecMeasurements mine =
      options.measured ? *options.measured : measure(comm, ctx, options);
  // One allreduce (max) agrees on the options (hash h: max(h) == h and
  // max(-h) == -h on every rank iff every rank has h) and the measurements.
  const uint64_t h = options_hash(options);
  const auto lo = static_cast<double>(h & 0xffffffffu), hi = static_cast<double>(h >> 32);
  std::vector<double> v{lo, hi, -lo, -hi, mine.call_seconds, mine.ring_seconds_per_byte};
  v.insert(v.end(), mine.encode_seconds_per_byte.begin(), mine.encode_seconds_per_byte.end());
  v.insert(v.end(), mine.decode_seconds_per_byte.begin(), mine.decode_seconds_per_byte.end());
  v.insert(v.end(), mine.overhead_seconds_per_byte.begin(), mine.overhead_seconds_per_byte.end());
  AllreduceOptions a;
  a.op = ReduceOp::max;
  a.label = "AutoCodec agreement";
  comm.allreduce(TensorView::host(v.data(), static_cast<int64_t>(v.size())), ctx, a)->wait();
  RELAXCC_ENFORCE(
      v[0] == lo && v[1] == hi && v[2] == -lo && v[3] == -hi, PeerMismatch,
      "AutoCodec::calibrate: rank ", comm.rank(),
      "'s codecs, margin or force differ from another rank's (this rank: codecs ",
      [&] {
        std::string s;
        for (const CompressorConfig& c : options.codecs)
          s += (s.empty() ? "" : ",") + codec_name(c);
        return s;
      }(),
      ", margin ", options.margin, ", force ", options.force, ")");
  const size_t k = options.codecs.size();
  AutoCodecMeasurements agreed;
  agreed.call_seconds = v[4];
  agreed.ring_seconds_per_byte = v[5];
  agreed.encode_seconds_per_byte.assign(v.begin() + 6, v.begin() + 6 + static_cast<long>(k));
  agreed.decode_seconds_per_byte.assign(v.begin() + 6 + static_cast<long>(k),
                                        v.begin() + 6 + 2 * static_cast<long>(k));
  agreed.overhead_seconds_per_byte.assign(v.begin() + 6 + 2 * static_cast<long>(k), v.end());
  options.measured.reset();
  return AutoCodec(comm.size(), std::move(agreed), std::move(options));
}

double AutoCodec::predict(int64_t numel, int index) const {
  RELAXCC_ENFORCE(numel >= 0 && index >= -1 && index < static_cast<int>(options_.codecs.size()),
                  InvalidArgument, "AutoCodec::predict: ", numel, " elements, codec index ", index,
                  " (expected >= 0 elements, index in [-1, ", options_.codecs.size(), "))");
  if (ranks_ == 1) return 0.0;  // nothing moves either way
  const AutoCodecMeasurements& m = agreed_;
  const double bytes = 4.0 * static_cast<double>(numel);
  if (index < 0) return m.call_seconds + bytes * m.ring_seconds_per_byte;
  const CompressorConfig& c = options_.codecs[static_cast<size_t>(index)];
  double wire = 0;
  for (int64_t count : relaxed::Shards(numel, ranks_).count)
    wire += static_cast<double>(kernels::encoded_size(count, c));
  const double n = ranks_;
  const auto i = static_cast<size_t>(index);
  return 2 * m.call_seconds + wire * m.ring_seconds_per_byte +
         (n + 1) / n * bytes * m.encode_seconds_per_byte[i] +
         2 * bytes * m.decode_seconds_per_byte[i] + bytes * m.overhead_seconds_per_byte[i];
}

AutoChoice AutoCodec::choose(int64_t numel) const {
  AutoChoice choice;
  if (forced_f32_) return choice;
  if (forced_) {
    choice.codec = forced_;
    return choice;
  }
  choice.uncompressed_seconds = predict(numel, -1);
  choice.predicted_seconds = choice.uncompressed_seconds;
  if (ranks_ == 1) return choice;
  int best = -1;
  double best_seconds = 0;
  for (int i = 0; i < static_cast<int>(options_.codecs.size()); ++i) {
    const double t = predict(numel, i);
    if (best < 0 || t < best_seconds) {
      best = i;
      best_seconds = t;
    }
  }
  if (best >= 0 && best_seconds <= options_.margin * choice.uncompressed_seconds) {
    choice.codec = options_.codecs[static_cast<size_t>(best)];
    choice.index = best;
    choice.predicted_seconds = best_seconds;
  }
  return choice;
}

}  // namespace relaxcc
