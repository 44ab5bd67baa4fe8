// Helpers for the ops tests: seeded random f32 tensors, poisoned outputs, error expectations.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/test_util.h"

namespace llmk::test {

inline Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  const auto v = random_floats(static_cast<size_t>(t.numel()), seed, lo, hi);
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}

inline Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::fill(t.data<float>(), t.data<float>() + t.numel(), kPoison);
  return t;
}

inline Tensor i32_tensor(std::initializer_list<int32_t> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Element of a strided f32 (or, with T, other) tensor.
template <class T = float>
T& elem(const Tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0, i = 0;
  for (int64_t v : idx) off += v * t.stride(static_cast<int>(i++));
  return t.data<T>()[off];
}

// Runs fn, which must throw llmk::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn,
                         std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos)
          << "message \"" << msg << "\" lacks \"" << p << "\"";
    }
    return;
  }
  ADD_FAILURE() << "no llmk::Error thrown (wanted one mentioning \"" << *parts.begin() << "\")";
}

}  // namespace llmk::test
