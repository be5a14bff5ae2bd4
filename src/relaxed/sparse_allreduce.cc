#include "relaxcc/relaxed/sparse_allreduce.h"

#include <bit>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"

namespace relaxcc {

WorkPtr sparse_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                         const SparseAllreduceOptions& options) {
  x.check_valid("sparse_allreduce tensor");
  RELAXCC_ENFORCE(x.dtype == DType::f32 && x.device.is_host() && ctx.device.is_host(),
                  InvalidArgument, "sparse_allreduce: f32 host tensors, got ", dtype_name(x.dtype),
                  " on ", x.device);
  const kernels::CompressorConfig& codec = options.codec;
  codec.validate();
  RELAXCC_ENFORCE(codec.kind == kernels::CompressorKind::randomk, InvalidArgument,
                  "sparse_allreduce: codec ", kernels::compressor_name(codec.kind),
                  ", expected randomk");
  RELAXCC_ENFORCE(options.op == ReduceOp::sum || options.op == ReduceOp::avg, InvalidArgument,
                  "sparse_allreduce: op ", options.op, ", expected sum or avg");
  RELAXCC_ENFORCE(
      !options.feedback || static_cast<int64_t>(options.feedback->residual().size()) == x.numel,
      InvalidArgument, "sparse_allreduce: error feedback for ",
      options.feedback ? options.feedback->residual().size() : 0, " elements, tensor of ", x.numel);

  // The payload: a header, then the k kept values (no indices). Its size,
  // k and everything the ranks must agree on follow from the configuration.
  auto payload =
      std::make_shared<std::vector<unsigned char>>(kernels::encoded_size(x.numel, codec));
  const int64_t k = kernels::kept_elements(x.numel, codec);
  const auto h = static_cast<int64_t>(Fnv1a()
                                          .u64(static_cast<uint64_t>(x.numel))
                                          .u64(static_cast<uint64_t>(k))
                                          .u64(codec.seed)
                                          .u64(codec.step)
                                          .u64(std::bit_cast<uint64_t>(codec.ratio))
                                          .u64(static_cast<uint64_t>(codec.keep))
                                          .u64(static_cast<uint64_t>(codec.random_mode))
                                          .value() >>
                                      2);

  // Encoding runs inside a Work, after options.after (if any): an input the
  // codec refuses fails this rank's allreduces, and so every rank.
  kernels::ErrorFeedback* feedback = options.feedback;
  const WorkPtr start = options.after ? options.after : when_all({}, nullptr, "now");
  const WorkPtr encoded = start->then(
      [payload, feedback, x, codec, ctx](const Work& done) {
        if (done.exception()) return;
        const auto out = std::as_writable_bytes(std::span(payload->data(), payload->size()));
        if (feedback)
          feedback->compress(x, out, codec, ctx);
        else
          kernels::encode(x, out, codec, ctx);
      },
      "sparse_allreduce: encoding");

  // What every rank must agree on, as [h, -h]: its max is [h, -h] on every
  // rank only when all hashes are equal.
  auto check = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{h, -h});
  AllreduceOptions agree;
  static_cast<OpOptions&>(agree) = options;
  agree.op = ReduceOp::max;
  agree.after = encoded;
  WorkPtr agreed = comm.allreduce(TensorView(check->data(), 2, DType::i64, Device::host(), check),
                                  ExecContext::host(), agree);

  AllreduceOptions sum;
  static_cast<OpOptions&>(sum) = options;
  sum.op = options.op;
  sum.after = encoded;
  const TensorView values(payload->data() + sizeof(kernels::PayloadHeader), k, DType::f32,
                          Device::host(), payload);
  WorkPtr summed = comm.allreduce(values, ctx, sum);

  return when_all(
      {encoded, agreed, summed},
      [payload, check, h, x, ctx](Work&) {
        RELAXCC_ENFORCE((*check)[0] == h && (*check)[1] == -h, PeerMismatch,
                        "sparse_allreduce: ranks disagree on the random-k selection (seed, step, "
                        "ratio, keep or mode)");
        kernels::decode(std::as_bytes(std::span(payload->data(), payload->size())), x, ctx);
      },
      "sparse_allreduce");
}

}  // namespace relaxcc
