// Helpers for the GGUF tests: a private temporary directory, file writing, and a check that
// opening a file fails with llmk::Error whose message carries the expected phrases.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"

namespace llmk::gguf::testkit {

// A fresh directory under /tmp, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/llmk-gguf-test-XXXXXX";
    char* p = mkdtemp(tmpl.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string p = path_ + "/" + name;
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) throw std::runtime_error("cannot write " + p);
    return p;
  }

 private:
  std::string path_;
};

// Opens `path`, expecting llmk::Error; returns its message (empty, with a test failure, if the
// open succeeded or threw something else). Every phrase must occur in the message.
inline std::string expect_open_error(const std::string& path,
                                     std::initializer_list<std::string_view> phrases) {
  std::string msg;
  try {
    File::open(path);
    ADD_FAILURE() << "opening " << path << " succeeded; expected an error containing "
                  << (phrases.size() ? *phrases.begin() : "");
    return "";
  } catch (const Error& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "opening " << path << " threw a non-llmk exception: " << e.what();
    return "";
  }
  for (std::string_view p : phrases) {
    EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
  }
  return msg;
}

// The message of the llmk::Error that `fn` throws, or a test failure when it throws none.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected llmk::Error";
  return "";
}

}  // namespace llmk::gguf::testkit
