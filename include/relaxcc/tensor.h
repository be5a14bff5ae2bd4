// TensorView: a non-owning view of a contiguous typed buffer on a device.
#pragma once

#include <cstdint>
#include <memory>

#include "relaxcc/dtype.h"

namespace relaxcc {

struct TensorView {
  TensorView() = default;
  TensorView(void* data_, int64_t numel_, DType dtype_, Device device_ = Device::host(),
             std::shared_ptr<const void> owner_ = {})
      : data(data_), numel(numel_), dtype(dtype_), device(device_), owner(std::move(owner_)) {}

  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::host();
  // Optional keep-alive for the memory behind `data` (a frontend's tensor
  // storage, for example). Asynchronous operations copy the view, and with it
  // this owner, into their Work, so the memory outlives the operation.
  std::shared_ptr<const void> owner;

  size_t nbytes() const noexcept { return static_cast<size_t>(numel) * dtype_size(dtype); }
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(data);
  }
  // Elements [offset, offset + count) of this view, sharing its owner.
  // Throws InvalidArgument when the range is out of bounds.
  TensorView slice(int64_t offset, int64_t count) const;
  // Throws InvalidArgument when data is null with numel > 0, or numel < 0.
  // `what` names the tensor in the message.
  void check_valid(const char* what) const;

  template <typename T>
  static TensorView host(T* ptr, int64_t n, std::shared_ptr<const void> keep_alive = {}) {
    return TensorView{ptr, n, dtype_of<T>(), Device::host(), std::move(keep_alive)};
  }
};

}  // namespace relaxcc
