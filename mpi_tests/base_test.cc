// Core types: dtypes, devices, tensor views, f16/bf16 conversions, errors,
// tunables, logging levels, the thread pool and Work.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include <gtest/gtest.h>

#include "relaxcc/dtype.h"
#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "relaxcc/reduce_op.h"
#include "relaxcc/tensor.h"
#include "relaxcc/thread_pool.h"
#include "relaxcc/tunables.h"
#include "relaxcc/work.h"
#include "test_util.h"

namespace relaxcc {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("float"), DType::f32);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_THROW(parse_dtype("f8"), InvalidArgument);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i64));
}

TEST(Device, ParseAndFormat) {
  EXPECT_EQ(parse_device("host"), Device::host());
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(to_string(Device::cuda(2)), "cuda:2");
  EXPECT_EQ(to_string(Device::host()), "host");
  EXPECT_THROW(parse_device("cuda:x"), InvalidArgument);
  EXPECT_THROW(parse_device("tpu"), InvalidArgument);
}

TEST(ReduceOpNames, RoundTrip) {
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(parse_reduce_op(reduce_op_name(op)), op);
  EXPECT_THROW(parse_reduce_op("prod"), Unsupported);
  EXPECT_THROW(parse_reduce_op("xor"), InvalidArgument);
}

TEST(TensorView, SliceAndValidity) {
  std::vector<int32_t> data(10);
  auto owner = std::make_shared<int>(7);
  TensorView v = TensorView::host(data.data(), 10, owner);
  EXPECT_EQ(v.dtype, DType::i32);
  EXPECT_EQ(v.nbytes(), 40u);
  TensorView s = v.slice(3, 4);
  EXPECT_EQ(s.as<int32_t>(), data.data() + 3);
  EXPECT_EQ(s.numel, 4);
  EXPECT_EQ(s.owner.get(), owner.get());
  EXPECT_THROW(v.slice(8, 3), InvalidArgument);
  EXPECT_THROW(v.slice(-1, 1), InvalidArgument);
  TensorView null_view{nullptr, 5, DType::f32};
  EXPECT_THROW(null_view.check_valid("x"), InvalidArgument);
  TensorView empty{nullptr, 0, DType::f32};
  EXPECT_NO_THROW(empty.check_valid("x"));
}

// ---- f16 -----------------------------------------------------------------

float from_bits(uint32_t b) {
  return std::bit_cast<float>(b);
}

TEST(Half, KnownBitPatterns) {
  EXPECT_EQ(f32_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16_bits(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bff);    // max normal
  EXPECT_EQ(f32_to_f16_bits(65519.996f), 0x7bff);  // just below the rounding edge
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00);    // ties to even -> inf
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);     // min normal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);     // min subnormal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);     // tie -> even (0)
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);     // above the tie
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 ulp: tie -> even (2)
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1023.0f, -24)), 0x03ff);  // max subnormal
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 and 1+2^-9: ties to even (odd mantissa rounds up).
  EXPECT_EQ(f32_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16_bits(from_bits(0x3f800001)), 0x3c00);  // a hair above 1 rounds down
  // NaN keeps its sign and top payload bits and becomes quiet.
  EXPECT_EQ(f32_to_f16_bits(from_bits(0x7fc00000)), 0x7e00);
  EXPECT_EQ(f32_to_f16_bits(from_bits(0xffc00000)), 0xfe00);
  EXPECT_EQ(f32_to_f16_bits(from_bits(0x7f802000)), 0x7e01);  // signaling -> quiet

  EXPECT_EQ(f16_bits_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_bits_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_bits_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_bits_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_bits_to_f32(0x7c00)), 0x7f800000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_bits_to_f32(0x7e00)), 0x7fc00000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_bits_to_f32(0x7c01)), 0x7fc02000u);  // quietened
}

TEST(Half, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_EQ(f32_to_f16_bits(f), h | 0x200) << h;  // quiet bit set
    } else {
      EXPECT_EQ(f32_to_f16_bits(f), h) << h;
    }
  }
}

TEST(Half, RoundsToNearestEvenAgainstDoubleReference) {
  // For every f16 pair (a, next(a)), probe the midpoint and just around it.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double a = f16_bits_to_f32(static_cast<uint16_t>(h));
    const double b = f16_bits_to_f32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact in f32
    const uint32_t even = (h & 1) ? h + 1 : h;
    ASSERT_EQ(f32_to_f16_bits(mid), even) << h;
    ASSERT_EQ(f32_to_f16_bits(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(f32_to_f16_bits(std::nextafter(mid, 1e9f)), h + 1) << h;
  }
}

// ---- bf16 ----------------------------------------------------------------

TEST(BFloat16, KnownBitPatterns) {
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3f808001)), 0x3f81);  // above tie
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7f7fffff)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x00008000)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7f800000)), 0x7f80);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7f800001)), 0x7fc0);  // sNaN -> qNaN
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0xffc00000)), 0xffc0);
  EXPECT_EQ(std::bit_cast<uint32_t>(bf16_bits_to_f32(0x3f80)), 0x3f800000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(bf16_bits_to_f32(0x0001)), 0x00010000u);  // subnormal
  EXPECT_EQ(std::bit_cast<uint32_t>(bf16_bits_to_f32(0x7f81)), 0x7fc10000u);  // quietened
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_bits_to_f32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16_bits(f), b);
    }
  }
}

// ---- errors --------------------------------------------------------------

TEST(Errors, HierarchyLocationAndRank) {
  try {
    RELAXCC_ENFORCE_EQ(3, 4, PeerMismatch, "allreduce of 'grad'");
    FAIL() << "no throw";
  } catch (const CommunicationError& e) {
    EXPECT_NE(dynamic_cast<const PeerMismatch*>(&e), nullptr);
    EXPECT_EQ(e.rank(), test::world_rank());
    EXPECT_NE(std::string(e.file()).find("base_test.cc"), std::string::npos);
    EXPECT_GT(e.line(), 0);
    const std::string what = e.what();
    EXPECT_NE(what.find("[rank " + std::to_string(test::world_rank()) + "]"), std::string::npos);
    EXPECT_NE(what.find("PeerMismatch"), std::string::npos);
    EXPECT_NE(what.find("allreduce of 'grad'"), std::string::npos);
    EXPECT_NE(what.find("got 3 vs 4"), std::string::npos);
  }
  EXPECT_THROW(RELAXCC_THROW(Timeout, "x"), CommunicationError);
  EXPECT_THROW(RELAXCC_THROW(CommunicatorPoisoned, "x"), CommunicationError);
  EXPECT_THROW(RELAXCC_THROW(Unsupported, "x"), Error);
  EXPECT_THROW(RELAXCC_ENFORCE(1 > 2, InvalidArgument, "cmp"), InvalidArgument);
  EXPECT_NO_THROW(RELAXCC_ENFORCE_LE(1, 2, InvalidArgument, "cmp"));
}

TEST(Errors, PeerLostNamesTheRank) {
  try {
    throw PeerLost(3, "allreduce #7: transport error with rank 3: connection closed", __FILE__,
                   __LINE__);
  } catch (const CommunicationError& e) {
    const auto* lost = dynamic_cast<const PeerLost*>(&e);
    ASSERT_NE(lost, nullptr);
    EXPECT_EQ(lost->peer(), 3);
    const std::string what = e.what();
    EXPECT_NE(what.find("PeerLost: allreduce #7: transport error with rank 3"), std::string::npos)
        << what;
  }
}

// ---- tunables and logging -------------------------------------------------

TEST(Tunables, DefaultsEnvironmentAndHash) {
  const Tunables defaults;
  EXPECT_EQ(defaults.segment_bytes, 1 << 20);
  EXPECT_EQ(defaults.stall_warning_ms, 60000);
  const auto infos = defaults.describe();
  ASSERT_FALSE(infos.empty());
  for (const auto& info : infos) {
    EXPECT_EQ(info.env_name.rfind("RELAXCC_", 0), 0u) << info.env_name;
    EXPECT_FALSE(info.doc.empty()) << info.env_name;
    EXPECT_EQ(info.value, info.default_value) << info.env_name;
  }

  ::setenv("RELAXCC_SEGMENT_BYTES", "256K", 1);
  ::setenv("RELAXCC_TIMEOUT_MS", "1500", 1);
  const Tunables t = Tunables::from_env();
  EXPECT_EQ(t.segment_bytes, 256 << 10);
  EXPECT_EQ(t.timeout_ms, 1500);
  // Agree-scoped values enter the hash; Local ones do not.
  EXPECT_NE(t.agreement_hash(), defaults.agreement_hash());
  Tunables local_only = defaults;
  local_only.timeout_ms = 1;
  EXPECT_EQ(local_only.agreement_hash(), defaults.agreement_hash());

  ::setenv("RELAXCC_SEGMENT_BYTES", "lots", 1);
  try {
    Tunables::from_env();
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RELAXCC_SEGMENT_BYTES='lots'"), std::string::npos);
  }
  ::unsetenv("RELAXCC_SEGMENT_BYTES");
  ::unsetenv("RELAXCC_TIMEOUT_MS");
  EXPECT_EQ(parse_size("64K"), 65536);
  EXPECT_EQ(parse_size("2G"), int64_t{2} << 30);
  EXPECT_THROW(parse_size("3X"), InvalidArgument);
}

TEST(Logging, Levels) {
  EXPECT_EQ(parse_log_level("info"), LogLevel::info);
  EXPECT_EQ(parse_log_level("WARNING"), LogLevel::warn);
  EXPECT_THROW(parse_log_level("loud"), InvalidArgument);
  const LogLevel before = log_level();
  set_log_level(LogLevel::error);
  EXPECT_TRUE(log_enabled(LogLevel::error));
  EXPECT_FALSE(log_enabled(LogLevel::warn));
  set_log_level(before);
}

// ---- thread pool -----------------------------------------------------------

TEST(ThreadPool, CoversEveryIndexOnceAndPropagatesErrors) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.num_threads(), 3);
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 10, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t) {
                                   if (b > 0) RELAXCC_THROW(InternalError, "boom");
                                 }),
               InternalError);
}

// Counts expired waits instead of poisoning a communicator, and says what it
// waited for.
class CountingWork final : public Work {
 public:
  using Work::Work;
  std::atomic<int> timeouts{0};

 protected:
  std::string on_timeout(const std::string&) override {
    ++timeouts;
    return "waiting for: rank 9 (header)";
  }
};

TEST(Work, ThenRunsOnCompletionOrAtOnce) {
  using namespace std::chrono_literals;
  auto work = std::make_shared<Work>("first");
  std::thread::id ran_on;
  int runs = 0;
  WorkPtr next = work->then([&](const Work& w) {
    ++runs;
    ran_on = std::this_thread::get_id();
    EXPECT_EQ(&w, work.get());
  });
  EXPECT_EQ(runs, 0);
  EXPECT_FALSE(next->is_completed());
  std::thread completer([&] { work->complete(nullptr); });
  const auto completer_id = completer.get_id();
  completer.join();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ran_on, completer_id);  // the completing thread runs callbacks
  EXPECT_TRUE(next->wait_for(0ms));
  work->complete(std::make_exception_ptr(std::runtime_error("ignored")));  // first call wins
  EXPECT_EQ(work->exception(), nullptr);
  // Registered after completion: runs at once on the caller's thread.
  WorkPtr late = work->then([&](const Work&) {
    ++runs;
    ran_on = std::this_thread::get_id();
  });
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(late->is_completed());
  EXPECT_NE(late->description().find("first"), std::string::npos);
}

TEST(Work, ThenCarriesTheErrorOfTheWorkOrOfTheCallback) {
  using namespace std::chrono_literals;
  auto failed = std::make_shared<Work>("failed");
  WorkPtr after_failure = failed->then([](const Work& w) { EXPECT_NE(w.exception(), nullptr); });
  failed->complete(std::make_exception_ptr(InvalidArgument("bad", __FILE__, __LINE__)));
  EXPECT_THROW(after_failure->wait(0ms), InvalidArgument);

  auto ok = std::make_shared<Work>("ok");
  WorkPtr throwing = ok->then([](const Work&) { RELAXCC_THROW(CorruptPayload, "callback"); });
  ok->complete(nullptr);
  EXPECT_THROW(throwing->wait(), CorruptPayload);
  EXPECT_THROW(throwing->wait_for(0ms), CorruptPayload);
}

TEST(Work, BlockStreamOfAHostOperationOnceCompleted) {
  int fake_stream = 0;
  auto work = std::make_shared<Work>("host op");
  work->block_stream(nullptr);
  EXPECT_THROW(work->block_stream(&fake_stream), Unsupported);  // in flight
  work->complete(nullptr);
  work->block_stream(&fake_stream);  // nothing left to order
  auto failed = std::make_shared<Work>("failed op");
  failed->complete(std::make_exception_ptr(CorruptPayload("bad", __FILE__, __LINE__)));
  EXPECT_THROW(failed->block_stream(&fake_stream), CorruptPayload);
}

TEST(Work, WaitForLooksWaitPoisons) {
  using namespace std::chrono_literals;
  auto work = std::make_shared<CountingWork>("slow");
  WorkPtr next = work->then([](const Work&) {});
  // wait_for: no effect while pending.
  EXPECT_FALSE(work->wait_for(0ms));
  EXPECT_FALSE(work->wait_for(5ms));
  EXPECT_FALSE(next->wait_for(5ms));
  EXPECT_EQ(work->timeouts.load(), 0);
  // wait: Timeout, and the hook that poisons a communicator ran, also when the
  // wait was on a Work derived with then().
  try {
    work->wait(5ms);
    ADD_FAILURE() << "no Timeout";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "; waiting for: rank 9 (header); the communicator is now poisoned"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(work->timeouts.load(), 1);
  EXPECT_THROW(next->wait(5ms), Timeout);
  EXPECT_EQ(work->timeouts.load(), 2);
  std::thread completer([&] {
    std::this_thread::sleep_for(20ms);
    work->complete(nullptr);
  });
  EXPECT_TRUE(next->wait_for(10s));
  completer.join();
  EXPECT_TRUE(work->wait_for(0ms));
  EXPECT_NO_THROW(work->wait(0ms));
}

}  // namespace
}  // namespace relaxcc
