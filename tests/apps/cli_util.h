// Running the built `llmk` binary from the CLI tests: stdout, stderr and the exit code, and the
// check that an error is exactly one "llmk: error: ..." line.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

namespace llmk::test {

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `llmk <args>` (args are passed through the shell) with stdin read from `stdin_path` and
// stdout written to `stdout_path` (default: a file in `scratch`, returned in `out`); stderr is
// captured through a file in `scratch`.
inline CliResult run_llmk_io(const std::string& args, const std::filesystem::path& scratch,
                             const std::string& stdin_path, const std::string& stdout_path = "") {
  const std::filesystem::path out = scratch / "stdout", err = scratch / "stderr";
  std::filesystem::remove(out);
  const std::string cmd = std::string(LLMK_BINARY_DIR) + "/llmk " + args + " >" +
                          (stdout_path.empty() ? out.string() : stdout_path) + " 2>" +
                          err.string() + " <" + stdin_path;
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// The same with `input` on stdin.
inline CliResult run_llmk(const std::string& args, const std::filesystem::path& scratch,
                          const std::string& input = "") {
  const std::filesystem::path in = scratch / "stdin";
  std::ofstream(in, std::ios::binary) << input;
  return run_llmk_io(args, scratch, in.string());
}

// Exit code 1, nothing on stdout, and exactly one stderr line, "llmk: error: ...", holding every
// needle.
inline void expect_clean_error(const CliResult& r, std::initializer_list<std::string> needles) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("llmk: error: ", 0), 0u) << r.err;
  for (const std::string& n : needles) {
    EXPECT_NE(r.err.find(n), std::string::npos) << "wanted '" << n << "' in: " << r.err;
  }
}

}  // namespace llmk::test
