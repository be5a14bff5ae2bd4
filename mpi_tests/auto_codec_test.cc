// Auto codec (relaxcc/relaxed/auto_codec.h): the cost model's decisions on
// synthetic numbers, the same choice on every rank when their measurements
// differ, forced choices, typed errors for options that are out of range or
// differ across ranks, and correct results whatever is chosen.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/relaxed/auto_codec.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;
using test::world;

// Per byte: 1 Gbit/s is 8e-9 s/B; a codec at 5 GB/s is 2e-10 s/B.
AutoCodecMeasurements synthetic(double link_bytes_per_s, double codec_bytes_per_s, size_t codecs,
                                double call_seconds = 50e-6) {
  AutoCodecMeasurements m;
  m.call_seconds = call_seconds;
  m.ring_seconds_per_byte = 1.0 / link_bytes_per_s;
  m.encode_seconds_per_byte.assign(codecs, 1.0 / codec_bytes_per_s);
  m.decode_seconds_per_byte.assign(codecs, 1.0 / codec_bytes_per_s);
  m.overhead_seconds_per_byte.assign(codecs, 0.0);
  return m;
}

// Whether every rank of `comm` holds the same `values` (an allreduce of
// max(v) and max(-v)).
bool same_on_every_rank(Communicator& comm, std::vector<double> values) {
  const size_t k = values.size();
  std::vector<double> both(values);
  for (double v : values) both.push_back(-v);
  AllreduceOptions a;
  a.op = ReduceOp::max;
  comm.allreduce(TensorView::host(both.data(), static_cast<int64_t>(both.size())),
                 ExecContext::host(), a)
      ->wait();
  for (size_t i = 0; i < k; ++i)
    if (both[i] != values[i] || both[k + i] != -values[i]) return false;
  return true;
}

TEST(AutoCodec, CodecNames) {
  for (const char* name : {"f16", "bf16", "sign", "minmax8", "minmax4", "minmax2", "minmax1"})
    EXPECT_EQ(codec_name(codec_by_name(name)), name);
  CompressorConfig c = codec_by_name("minmax4");
  c.chunk = 256;
  c.rounding = kernels::Rounding::stochastic;
  EXPECT_EQ(codec_name(c), "minmax4/chunk256/stochastic");
  EXPECT_THROW(codec_by_name("int8"), InvalidArgument);
  const std::vector<CompressorConfig> d = default_auto_codecs();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(codec_name(d[0]), "bf16");
  EXPECT_EQ(codec_name(d[1]), "minmax8");
}

// The cost model on synthetic numbers, 2 and 8 ranks: a link faster than the
// codecs keeps f32; a 1 Gbit/s link takes the smallest codec; tiny buckets
// (two calls' fixed cost against one) stay f32; a gain below the margin
// stays f32.
TEST(AutoCodec, CostModelDecisions) {
  const AutoCodecOptions options;            // bf16, minmax8; margin 0.8
  const int64_t bucket = int64_t{16} << 20;  // 64 MiB of f32
  for (int ranks : {2, 8}) {
    // A link of 20 GB/s, codecs at 5 GB/s: compression only adds time.
    const AutoCodec fast(ranks, synthetic(20e9, 5e9, 2), options);
    AutoChoice c = fast.choose(bucket);
    EXPECT_FALSE(c.codec) << ranks << " ranks: " << codec_name(*c.codec);
    EXPECT_EQ(c.index, -1);
    EXPECT_GT(fast.predict(bucket, 1), fast.predict(bucket, -1));
    // 1 Gbit/s: minmax 8-bit, about 4x less on the wire.
    const AutoCodec slow(ranks, synthetic(125e6, 5e9, 2), options);
    c = slow.choose(bucket);
    ASSERT_TRUE(c.codec) << ranks << " ranks";
    EXPECT_EQ(c.index, 1);
    EXPECT_EQ(codec_name(*c.codec), "minmax8");
    EXPECT_LT(c.predicted_seconds, 0.4 * c.uncompressed_seconds);
    EXPECT_DOUBLE_EQ(c.uncompressed_seconds, slow.predict(bucket, -1));
    // A schedule overhead of 1 ns per byte on top (measured end to end):
    // not worth it any more on the slow link.
    AutoCodecMeasurements heavy = synthetic(125e6, 5e9, 2);
    heavy.overhead_seconds_per_byte.assign(2, 8e-9);
    EXPECT_FALSE(AutoCodec(ranks, heavy, options).choose(bucket).codec) << ranks << " ranks";
    // A 1 KiB bucket on the slow link: the fixed costs decide.
    EXPECT_FALSE(slow.choose(256).codec);
    // Only bf16 allowed: it is chosen on the slow link.
    AutoCodecOptions bf16_only;
    bf16_only.codecs = {codec_by_name("bf16")};
    const AutoCodec slow_bf16(ranks, synthetic(125e6, 5e9, 1), bf16_only);
    c = slow_bf16.choose(bucket);
    ASSERT_TRUE(c.codec);
    EXPECT_EQ(c.codec->kind, CompressorKind::bf16);
    // No codec allowed: always f32.
    AutoCodecOptions none;
    none.codecs.clear();
    EXPECT_FALSE(AutoCodec(ranks, synthetic(125e6, 5e9, 0), none).choose(bucket).codec);
  }
  // A link where bf16 would save 10% (predicted): below the margin, f32.
  AutoCodecOptions bf16_only;
  bf16_only.codecs = {codec_by_name("bf16")};
  // ring: B r; bf16: ~B r / 2 + 3.5 B e (2 ranks), so e = r / 7 * 0.8 saves 10%.
  const double r = 1e-9;
  AutoCodecMeasurements m = synthetic(1 / r, 7 / (0.8 * r), 1, 0.0);
  const AutoCodec marginal(2, m, bf16_only);
  const AutoChoice c = marginal.choose(int64_t{1} << 22);
  EXPECT_LT(marginal.predict(int64_t{1} << 22, 0), marginal.predict(int64_t{1} << 22, -1));
  EXPECT_FALSE(c.codec) << "predicted " << marginal.predict(int64_t{1} << 22, 0) << " against "
                        << marginal.predict(int64_t{1} << 22, -1);
  bf16_only.margin = 1.0;
  EXPECT_TRUE(AutoCodec(2, m, bf16_only).choose(int64_t{1} << 22).codec);
  // One rank: nothing moves, f32.
  EXPECT_FALSE(AutoCodec(1, synthetic(125e6, 5e9, 2), options).choose(bucket).codec);
}

// Each rank injects measurements that alone would make it choose otherwise
// (rank 0 a slow link, the others a fast one, codec speeds by rank): after
// calibration every rank holds the largest figures and makes the same
// choice for every bucket size.
TEST(AutoCodec, SameChoiceOnEveryRankWhenMeasurementsDiffer) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  AutoCodecOptions o;
  o.codecs = {codec_by_name("bf16"), codec_by_name("minmax8"), codec_by_name("minmax4")};
  o.measured = synthetic(me == 0 ? 125e6 : 20e9, 5e9 / (1 + me), 3, 20e-6 * (n - me));
  const AutoCodec local(n, *o.measured, o);
  const AutoCodec agreed = AutoCodec::calibrate(*comm, ExecContext::host(), o);
  const AutoCodecMeasurements& m = agreed.measurements();
  EXPECT_DOUBLE_EQ(m.call_seconds, 20e-6 * n);
  EXPECT_DOUBLE_EQ(m.ring_seconds_per_byte, 1 / 125e6);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(m.encode_seconds_per_byte[i], n / 5e9);
    EXPECT_DOUBLE_EQ(m.decode_seconds_per_byte[i], n / 5e9);
  }
  EXPECT_FALSE(agreed.options().measured);
  std::vector<double> choices;
  bool differs_locally = false;
  for (int64_t numel = 1; numel <= (int64_t{1} << 26); numel *= 4) {
    const AutoChoice c = agreed.choose(numel);
    choices.push_back(c.index);
    choices.push_back(c.predicted_seconds);
    differs_locally |= local.choose(numel).index != c.index;
  }
  EXPECT_TRUE(same_on_every_rank(*comm, choices)) << "rank " << me;
  // The injected numbers do make some rank choose otherwise on its own.
  if (n > 1) {
    double any = differs_locally ? 1 : 0;
    AllreduceOptions a;
    a.op = ReduceOp::max;
    comm->allreduce(TensorView::host(&any, 1), ExecContext::host(), a)->wait();
    EXPECT_EQ(any, 1.0);
  }
}

// force: "f32" is the communicator's allreduce (bitwise its result, the
// ring's traffic in the stats), a codec name is that codec (exact on data
// the codec holds exactly), whatever the measurements say.
TEST(AutoCodec, ForcedChoices) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 100003;
  const ExecContext& host = ExecContext::host();
  AutoCodecOptions o;
  o.measured = synthetic(125e6, 5e9, 2);  // would pick minmax8
  o.force = "f32";
  const AutoCodec f32 = AutoCodec::calibrate(*comm, host, o);
  EXPECT_FALSE(f32.choose(count).codec);
  std::mt19937 rng(static_cast<unsigned>(me + 1));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(count));
  for (float& v : x) v = normal(rng);
  std::vector<float> want = x;
  AllreduceOptions a;
  a.op = ReduceOp::avg;
  comm->allreduce(TensorView::host(want.data(), count), host, a)->wait();
  RelaxedStats stats;
  CompressedAllreduceOptions co;
  co.auto_codec = &f32;
  co.op = ReduceOp::avg;
  co.stats = &stats;
  compressed_allreduce(*comm, TensorView::host(x.data(), count), host, co)->wait();
  EXPECT_EQ(std::memcmp(x.data(), want.data(), x.size() * sizeof(float)), 0) << "rank " << me;
  if (n > 1) {
    const RelaxedCounts c = stats.counts();
    EXPECT_EQ(c.rounds, 1u);
    // 2 (n-1)/n of the tensor, give or take a chunk's rounding.
    const double ring = 2.0 * (n - 1) / n * count * 4;
    EXPECT_NEAR(static_cast<double>(c.bytes_sent), ring, 8.0) << "rank " << me;
  }

  o.force = "bf16";
  const AutoCodec bf16 = AutoCodec::calibrate(*comm, host, o);
  ASSERT_TRUE(bf16.choose(count).codec);
  EXPECT_EQ(bf16.choose(count).codec->kind, CompressorKind::bf16);
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
  co.auto_codec = &bf16;
  co.op = ReduceOp::sum;
  compressed_allreduce(*comm, TensorView::host(x.data(), count), host, co)->wait();
  for (int64_t i = 0; i < count; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < n; ++r) sum += test::encode(r, i);
    ASSERT_EQ(x[i], static_cast<float>(sum)) << "index " << i;
  }

  // A forced codec need not be among the candidates.
  o.force = "minmax4";
  const AutoCodec four = AutoCodec::calibrate(*comm, host, o);
  ASSERT_TRUE(four.choose(count).codec);
  EXPECT_EQ(codec_name(*four.choose(count).codec), "minmax4");
}

// A real calibration (small sizes, to keep the test short), then auto on
// buckets of several sizes: every rank holds the same bits, within the bound
// of what was chosen (exact for f32: integers).
TEST(AutoCodec, ResultsAreCorrectWhateverIsChosen) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  const ExecContext& host = ExecContext::host();
  AutoCodecOptions o;
  o.link_bytes = 256 << 10;
  o.codec_bytes = 1 << 20;
  const AutoCodec chooser = AutoCodec::calibrate(*comm, host, o);
  const AutoCodecMeasurements& m = chooser.measurements();
  EXPECT_GT(m.call_seconds, 0.0);
  EXPECT_GT(m.encode_seconds_per_byte[0], 0.0);
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{300001}}) {
    std::vector<float> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
    CompressedAllreduceOptions co;
    co.auto_codec = &chooser;
    compressed_allreduce(*comm, TensorView::host(x.data(), count), host, co)->wait();
    const AutoChoice c = chooser.choose(count);
    std::vector<double> got(x.begin(), x.end());
    EXPECT_TRUE(same_on_every_rank(*comm, got)) << "rank " << me << ", " << count;
    for (int64_t i = 0; i < count; ++i) {
      int64_t sum = 0;
      for (int r = 0; r < n; ++r) sum += test::encode(r, i);
      // Sums below 69: bf16 exact; minmax 8-bit within 2 n / 255 of the sum's range.
      const double bound =
          c.codec && c.codec->kind == CompressorKind::minmax ? 2.0 * n * 17 / 255 * 1.001 : 0.0;
      ASSERT_LE(std::abs(x[i] - static_cast<double>(sum)), bound)
          << "index " << i << " of " << count << ", codec "
          << (c.codec ? codec_name(*c.codec) : std::string("f32"));
    }
  }
}

// With robust aggregation the uncompressed choice is the compressed schedule
// with f32 payloads: a trimmed mean of integers stays exact.
TEST(AutoCodec, RobustAggregationKeepsTheSchedule) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 3) GTEST_SKIP() << "trims one rank at each end";
  AutoCodecOptions o;
  o.force = "f32";
  o.measured = synthetic(20e9, 5e9, 2);
  const AutoCodec f32 = AutoCodec::calibrate(*comm, ExecContext::host(), o);
  const int64_t count = 999;
  std::vector<float> x(static_cast<size_t>(count), static_cast<float>(me == 0 ? 1000 : 3));
  CompressedAllreduceOptions co;
  co.auto_codec = &f32;
  co.op = ReduceOp::avg;
  co.robust.kind = RobustAggregation::Kind::trimmed_mean;
  co.robust.trim = 1;
  compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), co)->wait();
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(x[i], 3.0f) << "index " << i;
}

TEST(AutoCodec, BadOptionsAreRejected) {
  auto comm = world();
  const int n = comm->size();
  const ExecContext& host = ExecContext::host();
  const auto rejected = [&](const AutoCodecOptions& o) {
    EXPECT_THROW(AutoCodec::calibrate(*comm, host, o), InvalidArgument);
    EXPECT_THROW(AutoCodec(n, synthetic(1e9, 1e9, o.codecs.size()), o), InvalidArgument);
  };
  AutoCodecOptions o;
  o.margin = 0;
  rejected(o);
  o = {};
  o.margin = 1.5;
  rejected(o);
  o = {};
  o.force = "int8";
  rejected(o);
  o = {};
  CompressorConfig topk;
  topk.kind = CompressorKind::topk;
  o.codecs = {topk};
  rejected(o);
  o = {};
  o.repetitions = 0;
  rejected(o);
  o = {};
  o.measured = synthetic(1e9, 1e9, 1);  // one figure for two codecs
  EXPECT_THROW(AutoCodec::calibrate(*comm, host, o), InvalidArgument);
  o.measured = synthetic(-1.0, 1e9, 2);
  EXPECT_THROW(AutoCodec::calibrate(*comm, host, o), InvalidArgument);
  // Calibrated for another rank count.
  const AutoCodec other(n + 1, synthetic(1e9, 1e9, 2));
  std::vector<float> x(64, 1.0f);
  CompressedAllreduceOptions co;
  co.auto_codec = &other;
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, co),
               InvalidArgument);
}

// Ranks whose options differ (the margin here) get PeerMismatch on every
// rank, at calibration.
TEST(AutoCodec, OptionsThatDifferFailEveryRank) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  AutoCodecOptions o;
  o.measured = synthetic(1e9, 1e9, 2);
  o.margin = me == n - 1 ? 0.7 : 0.8;
  EXPECT_THROW(AutoCodec::calibrate(*comm, ExecContext::host(), o), PeerMismatch);
  o.margin = 0.8;
  o.force = me == 0 ? "minmax8" : "auto";
  EXPECT_THROW(AutoCodec::calibrate(*comm, ExecContext::host(), o), PeerMismatch);
}

}  // namespace
}  // namespace relaxcc
