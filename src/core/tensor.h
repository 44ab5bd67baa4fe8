// Tensor: shape, strides, dtype and device over a block of memory that is either owned
// (reference-counted, freed with the last owner) or borrowed (a view into memory someone else
// keeps alive, such as an mmap'ed model file).
//
// Strides are in elements. Block (quantised) dtypes are only supported contiguous and row-major,
// with the last dimension a whole number of blocks; views of them may select ranges of the
// leading dimension.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace llmk {

enum class Device : uint8_t { CPU, CUDA };
std::string_view device_name(Device d);

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  // A new, owning, contiguous tensor. Contents are uninitialised.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  // A contiguous view over memory the caller keeps alive; `keep_alive` (optional) is held by
  // the tensor and every view made from it.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, Device device = Device::CPU,
                       std::shared_ptr<void> keep_alive = nullptr);
  // The same with the given strides (elements, one per dimension, none negative; plain dtypes
  // only): a view of another library's tensor (the Python bindings' DLPack arrays).
  static Tensor borrow_strided(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                               DType dtype, Device device = Device::CPU,
                               std::shared_ptr<void> keep_alive = nullptr);

  bool defined() const { return data_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t stride(int i) const;
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const;  // bytes spanned by the elements, for contiguous tensors
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_contiguous() const;
  // Bytes of one row (the last dimension) for contiguous tensors, block types included.
  int64_t row_bytes() const;

  void* data() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Views sharing storage.
  Tensor view(const Shape& shape) const;                    // contiguous only; one dim may be -1
  Tensor slice(int dim, int64_t begin, int64_t end) const;  // [begin, end) along dim
  Tensor select(int dim, int64_t index) const;              // drops dim
  Tensor transpose(int a, int b) const;                     // plain types only
  // Splits dimension `dim` into `sizes` (their product must equal it); works on strided views
  // too, e.g. [T, H*D] columns of a wider row -> [T, H, D]. Plain types only.
  Tensor unflatten(int dim, const Shape& sizes) const;

  // A contiguous owning copy on the same device (CPU only for now).
  Tensor contiguous() const;
  // A contiguous owning copy on `device` (always a copy, even on the same device). Waits for the
  // copy to finish. CUDA sources must be contiguous; CPU sources may have any strides. Needs the
  // copy hook below (cuda::init() registers it) for anything but CPU -> CPU.
  Tensor to(Device device) const;

  std::string str() const;  // "f32[3, 4]"

 private:
  void* data_ = nullptr;
  std::shared_ptr<void> storage_;
  Shape shape_;
  std::vector<int64_t> strides_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Allocation hook so that a CUDA caching allocator can serve Device::CUDA tensors without the
// core depending on CUDA. Returns memory and a deleter.
using DeviceAllocFn = std::function<std::shared_ptr<void>(size_t bytes)>;
void set_device_allocator(Device device, DeviceAllocFn fn);

// Copy hook for Tensor::to, registered by cuda::init() for the same reason: copies `bytes` from
// `src` on `src_device` to `dst` on `dst_device` and returns when the copy is complete.
using DeviceCopyFn = std::function<void(void* dst, Device dst_device, const void* src,
                                        Device src_device, size_t bytes)>;
void set_device_copy(DeviceCopyFn fn);

}  // namespace llmk
