// Encodes and decodes one gradient-like tensor with several codecs, prints
// each payload's size and error, and checks every error against the bound
// the codec guarantees (compressor.h); then shows error feedback: what a
// codec drops in one step is carried into the next, so the average of the
// decoded steps converges to the true gradient.
//
// Runs on one process, no MPI. Exits 1 when a bound does not hold.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/error_feedback.h"

namespace {

using relaxcc::ExecContext;
using relaxcc::TensorView;
using namespace relaxcc::kernels;

constexpr int64_t kN = int64_t{1} << 16;
int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("  FAILED: %s\n", what.c_str());
    ++failures;
  }
}

std::vector<std::byte> encode_vec(const std::vector<float>& x, const CompressorConfig& c) {
  std::vector<std::byte> payload(encoded_size(static_cast<int64_t>(x.size()), c));
  const size_t written =
      encode(TensorView::host(const_cast<float*>(x.data()), static_cast<int64_t>(x.size())),
             payload, c, ExecContext::host());
  check(written == payload.size(), "encode writes encoded_size() bytes");
  return payload;
}

std::vector<float> decode_vec(const std::vector<std::byte>& payload, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  decode(payload, TensorView::host(y.data(), n), ExecContext::host());
  return y;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// Encodes and decodes x; `bound(i, x, y)` says whether element i's decoded
// value y is within the codec's guarantee.
template <typename Bound>
void round_trip(const char* label, const std::vector<float>& x, const CompressorConfig& c,
                Bound bound) {
  const std::vector<std::byte> payload = encode_vec(x, c);
  const std::vector<float> y = decode_vec(payload, kN);
  double max_err = 0;
  std::vector<float> diff(x.size());
  int64_t outside = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff[i] = y[i] - x[i];
    max_err = std::max(max_err, std::fabs(static_cast<double>(diff[i])));
    if (!std::isfinite(y[i]) || !bound(i, x[i], y[i])) ++outside;
  }
  std::printf("%-18s %8zu bytes  %6.1fx  max |error| %.3g  relative L2 error %.3g\n", label,
              payload.size(), compression_ratio(kN, c), max_err, norm(diff) / norm(x));
  check(outside == 0,
        std::string(label) + ": " + std::to_string(outside) + " elements outside the bound");
}

// Per chunk of `chunk` elements: the largest |error| that min-max
// quantization with `bits` and nearest rounding allows, half a step.
std::vector<double> minmax_bounds(const std::vector<float>& x, int64_t chunk, int bits) {
  std::vector<double> half_step;
  for (size_t lo = 0; lo < x.size(); lo += chunk) {
    const auto [mn, mx] =
        std::minmax_element(x.begin() + lo, x.begin() + std::min(x.size(), lo + chunk));
    half_step.push_back((*mx - *mn) / ((1 << bits) - 1) / 2.0);
  }
  return half_step;
}

}  // namespace

int main() {
  try {
    // A gradient-like tensor: mostly small values, a few large ones.
    std::vector<float> grad(kN);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    for (int64_t i = 0; i < kN; ++i) grad[i] = normal(rng) * (i % 97 == 0 ? 50.0f : 1.0f);

    std::printf("%lld f32 elements, %lld bytes uncompressed\n", static_cast<long long>(kN),
                static_cast<long long>(kN * 4));
    std::printf("%-18s %14s  %6s\n", "codec", "payload", "ratio");

    // f16 and bf16 round to nearest: relative error at most 2^-11 and 2^-8
    // (plus the smallest subnormal step for tiny values).
    CompressorConfig c;
    c.kind = CompressorKind::f16;
    round_trip("f16", grad, c, [](size_t, float x, float y) {
      return std::fabs(y - x) <= std::ldexp(std::fabs(x), -11) + std::ldexp(1.0f, -25);
    });
    c.kind = CompressorKind::bf16;
    round_trip("bf16", grad, c, [](size_t, float x, float y) {
      return std::fabs(y - x) <= std::ldexp(std::fabs(x), -8);
    });

    // min-max quantization: within half a quantization step of each chunk.
    for (int bits : {8, 4}) {
      c = CompressorConfig{};
      c.kind = CompressorKind::minmax;
      c.bits = bits;
      c.chunk = 2048;
      const std::vector<double> half_step = minmax_bounds(grad, c.chunk, bits);
      const std::string label = "minmax " + std::to_string(bits) + "-bit";
      round_trip(label.c_str(), grad, c, [&](size_t i, float x, float y) {
        return std::fabs(y - x) <= half_step[i / c.chunk] * 1.001 + 1e-9;
      });
    }

    // sign (1-bit): every element decodes to +-scale with its own sign.
    c = CompressorConfig{};
    c.kind = CompressorKind::sign;
    c.chunk = 2048;
    round_trip("sign", grad, c,
               [](size_t, float x, float y) { return x == 0 || (x < 0) == (y < 0); });

    // top-k (1%, exact selection): the kept elements are exact, the others
    // decode to 0, and nothing dropped is larger than what was kept.
    c = CompressorConfig{};
    c.kind = CompressorKind::topk;
    c.ratio = 0.01;
    c.approximate = false;
    std::vector<float> magnitudes(kN);
    for (int64_t i = 0; i < kN; ++i) magnitudes[i] = std::fabs(grad[i]);
    const int64_t k = kept_elements(kN, c);
    std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(),
                     std::greater<>());
    const float kth = magnitudes[k - 1];
    round_trip("topk 1%", grad, c,
               [&](size_t, float x, float y) { return y == x || (y == 0 && std::fabs(x) <= kth); });

    // Corrupted payloads are rejected (CorruptPayload), never decoded into
    // garbage: a min-max chunk scale made tiny (as one flipped exponent bit
    // can make it), whose decoded range would overflow f32, and a payload
    // cut short.
    c = CompressorConfig{};
    const std::vector<std::byte> good = encode_vec(grad, c);
    std::vector<std::byte> tiny_scale = good;
    const float tiny = 1e-37f;
    std::memcpy(tiny_scale.data() + sizeof(PayloadHeader) + sizeof(float), &tiny, sizeof(float));
    const std::vector<std::byte> cut(good.begin(), good.end() - 1);
    struct Corrupted {
      const char* label;
      const std::vector<std::byte>* payload;
    };
    for (const auto& [label, payload] :
         {Corrupted{"tiny chunk scale", &tiny_scale}, Corrupted{"cut short", &cut}}) {
      bool rejected = false;
      try {
        decode_vec(*payload, kN);
      } catch (const relaxcc::CorruptPayload& e) {
        rejected = true;
        std::printf("corrupt payload (%s) rejected: %s\n", label, e.message().c_str());
      }
      check(rejected, std::string("corrupt payload (") + label + ") rejected");
    }

    // Error feedback: compress the same gradient for `steps` steps with
    // sign compression. Without feedback every step makes the same error;
    // with it, the decoded steps plus the final residual add up to steps x
    // grad exactly (up to rounding), so their average converges to grad.
    const int steps = 400;
    c = CompressorConfig{};
    c.kind = CompressorKind::sign;
    c.chunk = 2048;
    ErrorFeedback feedback(kN);
    std::vector<std::byte> buffer(encoded_size(kN, c));
    std::vector<double> sum(kN, 0.0);
    for (int s = 0; s < steps; ++s) {
      feedback.compress(TensorView::host(grad.data(), kN), buffer, c, ExecContext::host());
      const std::vector<float> y = decode_vec(buffer, kN);
      for (int64_t i = 0; i < kN; ++i) sum[i] += y[i];
    }
    std::vector<float> mean_error(kN), identity_error(kN);
    for (int64_t i = 0; i < kN; ++i) {
      mean_error[i] = static_cast<float>(sum[i] / steps - grad[i]);
      identity_error[i] =
          static_cast<float>(sum[i] + feedback.residual()[i] - double{grad[i]} * steps);
    }
    const std::vector<float> once = decode_vec(encode_vec(grad, c), kN);
    std::vector<float> once_error(kN);
    for (int64_t i = 0; i < kN; ++i) once_error[i] = once[i] - grad[i];
    const double without = norm(once_error) / norm(grad), with = norm(mean_error) / norm(grad);
    std::printf(
        "error feedback, sign, %d steps: relative error of the mean %.3g (without feedback %.3g), "
        "residual norm %.3g\n",
        steps, with, without, norm(feedback.residual()));
    check(norm(identity_error) <= 1e-3 * steps * norm(grad),
          "decoded steps + residual == steps x gradient");
    check(with < 0.1 * without, "error feedback shrinks the error of the mean tenfold");
  } catch (const relaxcc::Error& e) {
    std::printf("compressors: %s\n", e.what());
    return 1;
  }
  std::printf("compressors: %s\n", failures == 0 ? "every bound holds" : "BOUNDS VIOLATED");
  return failures == 0 ? 0 : 1;
}
