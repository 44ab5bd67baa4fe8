// llmk::Error: the one exception type for host-side failures. Messages carry context
// (file, tensor name, shape, key) so that the CLI can print one line that names the problem.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace llmk {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace llmk

// Throws llmk::Error with an fmt-formatted message when `cond` is false.
#define LLMK_CHECK(cond, ...)                                \
  do {                                                       \
    if (!(cond)) throw ::llmk::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define LLMK_FAIL(...) throw ::llmk::Error(::fmt::format(__VA_ARGS__))
