#include "core/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace llmk {

namespace {

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

DeviceAllocFn& device_allocator(Device d) {
  static DeviceAllocFn fns[2];
  return fns[static_cast<int>(d)];
}

std::shared_ptr<void> allocate(size_t bytes, Device device) {
  if (device == Device::CPU) {
    // 64-byte alignment so SIMD loads of rows never straddle more cache lines than needed.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    LLMK_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  const DeviceAllocFn& fn = device_allocator(device);
  LLMK_CHECK(fn != nullptr, "no allocator for device {} (built without CUDA?)",
             device_name(device));
  return fn(bytes);
}

DeviceCopyFn& device_copy() {
  static DeviceCopyFn fn;
  return fn;
}

void check_shape(const Shape& shape) {
  for (int64_t d : shape) LLMK_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
}

}  // namespace

std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

void set_device_allocator(Device device, DeviceAllocFn fn) {
  device_allocator(device) = std::move(fn);
}

void set_device_copy(DeviceCopyFn fn) { device_copy() = std::move(fn); }

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  if (is_quantized(dtype)) {
    LLMK_CHECK(!shape.empty() && shape.back() % block_size(dtype) == 0,
               "shape {} is not whole {} blocks of {}", shape_str(shape), dtype_name(dtype),
               block_size(dtype));
  }
  t.storage_ = allocate(static_cast<size_t>(t.nbytes()), device);
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  LLMK_CHECK(device == Device::CPU, "Tensor::zeros is host-only; use ops to fill device memory");
  Tensor t = empty(shape, dtype, device);
  std::memset(t.data_, 0, static_cast<size_t>(t.nbytes()));
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, Device device,
                      std::shared_ptr<void> keep_alive) {
  check_shape(shape);
  Tensor t;
  t.data_ = data;
  t.storage_ = std::move(keep_alive);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::borrow_strided(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                              DType dtype, Device device, std::shared_ptr<void> keep_alive) {
  LLMK_CHECK(strides.size() == shape.size(), "{} strides given for shape {}", strides.size(),
             shape_str(shape));
  LLMK_CHECK(!is_quantized(dtype), "borrow_strided(): {} is a block type", dtype_name(dtype));
  for (int64_t s : strides) LLMK_CHECK(s >= 0, "borrow_strided(): negative stride {}", s);
  Tensor t = borrow(data, shape, dtype, device, std::move(keep_alive));
  t.strides_ = strides;
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  const int j = i < 0 ? i + n : i;
  LLMK_CHECK(j >= 0 && j < n, "dimension {} out of range for {}", i, str());
  return shape_[static_cast<size_t>(j)];
}

int64_t Tensor::stride(int i) const {
  const int n = ndim();
  const int j = i < 0 ? i + n : i;
  LLMK_CHECK(j >= 0 && j < n, "dimension {} out of range for {}", i, str());
  return strides_[static_cast<size_t>(j)];
}

int64_t Tensor::nbytes() const {
  if (shape_.empty()) return static_cast<int64_t>(dtype_info(dtype_).block_bytes);
  return bytes_for(dtype_, numel());
}

int64_t Tensor::row_bytes() const {
  LLMK_CHECK(!shape_.empty(), "row_bytes of a scalar tensor");
  return bytes_for(dtype_, shape_.back());
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::view(const Shape& shape) const {
  LLMK_CHECK(is_contiguous(), "view() needs a contiguous tensor, got strides [{}] for {}",
             fmt::join(strides_, ", "), str());
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LLMK_CHECK(infer < 0, "view(): more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    LLMK_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer {} from {}",
               shape_str(shape), str());
    s[static_cast<size_t>(infer)] = numel() / known;
  }
  LLMK_CHECK(shape_numel(s) == numel(), "view(): {} has {} elements, {} has {}", str(), numel(),
             shape_str(s), shape_numel(s));
  if (is_quantized(dtype_)) {
    LLMK_CHECK(!s.empty() && s.back() % block_size(dtype_) == 0,
               "view(): {} rows must be whole {} blocks", shape_str(s), dtype_name(dtype_));
  }
  Tensor t = *this;
  t.shape_ = std::move(s);
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  const int n = ndim();
  const int j = d < 0 ? d + n : d;
  LLMK_CHECK(j >= 0 && j < n, "slice(): dimension {} out of range for {}", d, str());
  const int64_t size = shape_[static_cast<size_t>(j)];
  LLMK_CHECK(0 <= begin && begin <= end && end <= size,
             "slice(): [{}, {}) out of range 0..{} of {}", begin, end, size, str());
  Tensor t = *this;
  t.shape_[static_cast<size_t>(j)] = end - begin;
  int64_t offset_bytes;
  if (is_quantized(dtype_)) {
    LLMK_CHECK(j < n - 1, "slice(): cannot slice inside the rows of block type {}",
               dtype_name(dtype_));
    offset_bytes = begin * strides_[static_cast<size_t>(j)] / block_size(dtype_) *
                   dtype_info(dtype_).block_bytes;
  } else {
    offset_bytes =
        begin * strides_[static_cast<size_t>(j)] * static_cast<int64_t>(element_size(dtype_));
  }
  t.data_ = static_cast<char*>(data_) + offset_bytes;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  const int n = ndim();
  const int j = d < 0 ? d + n : d;
  Tensor t = slice(j, index, index + 1);
  t.shape_.erase(t.shape_.begin() + j);
  t.strides_.erase(t.strides_.begin() + j);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  LLMK_CHECK(!is_quantized(dtype_), "transpose() of block type {}", dtype_name(dtype_));
  const int n = ndim();
  const int ja = a < 0 ? a + n : a;
  const int jb = b < 0 ? b + n : b;
  LLMK_CHECK(ja >= 0 && ja < n && jb >= 0 && jb < n, "transpose({}, {}) out of range for {}", a, b,
             str());
  Tensor t = *this;
  std::swap(t.shape_[static_cast<size_t>(ja)], t.shape_[static_cast<size_t>(jb)]);
  std::swap(t.strides_[static_cast<size_t>(ja)], t.strides_[static_cast<size_t>(jb)]);
  return t;
}

Tensor Tensor::unflatten(int d, const Shape& sizes) const {
  LLMK_CHECK(!is_quantized(dtype_), "unflatten() of block type {}", dtype_name(dtype_));
  const int n = ndim();
  const int j = d < 0 ? d + n : d;
  LLMK_CHECK(j >= 0 && j < n, "unflatten(): dimension {} out of range for {}", d, str());
  LLMK_CHECK(!sizes.empty() && shape_numel(sizes) == shape_[static_cast<size_t>(j)],
             "unflatten(): {} does not split dimension {} of {}", shape_str(sizes), d, str());
  Tensor t = *this;
  const int64_t base = strides_[static_cast<size_t>(j)];
  std::vector<int64_t> st(sizes.size());
  int64_t acc = base;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    acc *= sizes[i];
  }
  t.shape_.erase(t.shape_.begin() + j);
  t.strides_.erase(t.strides_.begin() + j);
  t.shape_.insert(t.shape_.begin() + j, sizes.begin(), sizes.end());
  t.strides_.insert(t.strides_.begin() + j, st.begin(), st.end());
  return t;
}

Tensor Tensor::contiguous() const {
  LLMK_CHECK(device_ == Device::CPU, "contiguous() is host-only");
  if (is_contiguous()) {
    Tensor t = empty(shape_, dtype_, device_);
    std::memcpy(t.data_, data_, static_cast<size_t>(nbytes()));
    return t;
  }
  Tensor t = empty(shape_, dtype_, device_);
  const size_t es = element_size(dtype_);
  const int n = ndim();
  std::vector<int64_t> idx(static_cast<size_t>(n), 0);
  char* dst = static_cast<char*>(t.data_);
  const int64_t total = numel();
  for (int64_t i = 0; i < total; ++i) {
    int64_t off = 0;
    for (int k = 0; k < n; ++k)
      off += idx[static_cast<size_t>(k)] * strides_[static_cast<size_t>(k)];
    std::memcpy(dst + static_cast<size_t>(i) * es,
                static_cast<const char*>(data_) + off * static_cast<int64_t>(es), es);
    for (int k = n - 1; k >= 0; --k) {
      if (++idx[static_cast<size_t>(k)] < shape_[static_cast<size_t>(k)]) break;
      idx[static_cast<size_t>(k)] = 0;
    }
  }
  return t;
}

Tensor Tensor::to(Device device) const {
  LLMK_CHECK(defined(), "to({}): undefined tensor", device_name(device));
  if (device_ == Device::CPU && device == Device::CPU) return contiguous();
  const Tensor src = device_ == Device::CPU && !is_contiguous() ? contiguous() : *this;
  LLMK_CHECK(src.is_contiguous(), "to({}): {} is not contiguous (strides [{}])",
             device_name(device), str(), fmt::join(strides_, ", "));
  const DeviceCopyFn& copy = device_copy();
  LLMK_CHECK(copy != nullptr,
             "to({}): no copy between {} and {} (call cuda::init(); built without CUDA?)",
             device_name(device), device_name(device_), device_name(device));
  Tensor t = empty(shape_, dtype_, device);
  copy(t.data_, device, src.data_, device_, static_cast<size_t>(src.nbytes()));
  return t;
}

std::string Tensor::str() const {
  return fmt::format("{}{}{}", dtype_name(dtype_), shape_str(shape_),
                     device_ == Device::CPU ? "" : "@cuda");
}

}  // namespace llmk
