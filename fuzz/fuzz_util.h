// Shared pieces of the libFuzzer targets (fuzz/*.cpp; see docs/fuzzing.md).
//
// Every target feeds its input to a real loader. llmk::Error is the expected outcome of a bad
// input; its message must be one line of bounded length (README: "one line on stderr naming the
// problem"). Anything else (another exception escaping, a sanitizer report, a timeout, an
// allocation above -malloc_limit_mb) is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace llmk::fuzz {

// Longest error message accepted: a name from the file is quoted in excerpts of at most
// llmk::kExcerptBytes, and a message quotes a few of them beside the path.
inline constexpr size_t kMaxMessageBytes = 4096;

// Aborts (a finding) when an llmk::Error message is not one bounded line.
inline void check_message(const Error& e) {
  const std::string_view msg = e.what();
  if (msg.empty() || msg.size() > kMaxMessageBytes || msg.find('\n') != std::string_view::npos) {
    std::fprintf(stderr,
                 "llmk::Error message of %zu bytes is not one line of at most %zu: %.300s\n",
                 msg.size(), kMaxMessageBytes, std::string(msg).c_str());
    std::abort();
  }
}

// Aborts (a finding) when a promise of the API does not hold.
inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "llmk fuzz: check failed: %s\n", what);
    std::abort();
  }
}

// Reads the first and last byte of [p, p + n): a view past the end of a mapping faults here.
inline void touch(const uint8_t* p, uint64_t n) {
  if (n == 0) return;
  volatile uint8_t sink = p[0];
  sink = p[n - 1];
  (void)sink;
}

// Every tensor of an opened GGUF or safetensors file must have a view of its size inside the
// file (its first and last byte are read).
template <typename File>
void check_tensor_views(const File& f) {
  for (const auto& t : f.tensors()) {
    const auto view = f.tensor(t.name);
    check(static_cast<uint64_t>(view.nbytes()) == t.nbytes, "tensor view size");
    touch(static_cast<const uint8_t*>(view.data()), t.nbytes);
  }
}

// Runs `load`; an llmk::Error is the expected outcome of a bad input. Anything else escapes.
template <typename F>
void expect_llmk_errors(F&& load) {
  try {
    load();
  } catch (const Error& e) {
    check_message(e);
  }
}

// A directory of this process's own (loaders that only take a path read the input from a file
// in it), removed at exit. Parallel fuzzing jobs are separate processes, so they never share one.
class ScratchDir {
 public:
  static const std::filesystem::path& get() {
    static ScratchDir dir;
    return dir.path_;
  }

 private:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "llmk-fuzz-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("llmk fuzz: mkdtemp");
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path path_;
};

// Writes `data` to `name` in the scratch directory and returns the file's path.
inline std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path path = ScratchDir::get() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::perror("llmk fuzz: writing the scratch file");
    std::abort();
  }
  return path.string();
}

// A file of the repository (fixtures the targets build their fixed state from).
inline std::string source_path(std::string_view relative) {
  return std::string(LLMK_SOURCE_DIR) + "/" + std::string(relative);
}

}  // namespace llmk::fuzz
