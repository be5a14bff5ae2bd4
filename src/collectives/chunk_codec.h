// ChunkCodec: how the ring puts a segment on the wire.
//
// The pipelined ring (ring.cc) is written once against this interface:
//   reduce-scatter hop   acc = decode(wire_in) op local;  wire_out = encode(acc)
//   allgather hop        out = decode(wire_in); forward wire_in unchanged
// The identity codec sends raw elements: acc aliases the received wire
// buffer, allgather receives straight into the output, and nothing is copied.
// Compressed codecs (quantized, sparsified) encode into scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "relaxcc/exec_context.h"
#include "relaxcc/reduce_op.h"
#include "relaxcc/tensor.h"

namespace relaxcc {

class ChunkCodec {
 public:
  virtual ~ChunkCodec() = default;
  virtual const char* name() const = 0;
  // Bytes on the wire for `count` elements of `dtype`. A pure function.
  virtual size_t wire_bytes(int64_t count, DType dtype) const = 0;
  // True when acc can live in the received wire buffer itself and
  // allgather can receive straight into the output.
  virtual bool in_place() const = 0;
  // Reduce-scatter: acc = decode(wire) op local. acc may be the wire buffer
  // itself or the final destination.
  virtual void combine(const void* wire, const TensorView& local, ReduceOp op,
                       const TensorView& acc, const ExecContext& ctx) = 0;
  // The wire form of `values`: either values.data itself or `scratch`
  // (wire_bytes long) filled with the encoding.
  virtual const void* encode(const TensorView& values, void* scratch, const ExecContext& ctx) = 0;
  // Allgather: out = decode(wire). A no-op when wire is out.data.
  virtual void decode(const void* wire, const TensorView& out, const ExecContext& ctx) = 0;
};

// Raw elements, no copies.
class IdentityCodec final : public ChunkCodec {
 public:
  const char* name() const override { return "identity"; }
  size_t wire_bytes(int64_t count, DType dtype) const override {
    return static_cast<size_t>(count) * dtype_size(dtype);
  }
  bool in_place() const override { return true; }
  void combine(const void* wire, const TensorView& local, ReduceOp op, const TensorView& acc,
               const ExecContext& ctx) override;
  const void* encode(const TensorView& values, void*, const ExecContext&) override {
    return values.data;
  }
  void decode(const void* wire, const TensorView& out, const ExecContext& ctx) override;
};

}  // namespace relaxcc
