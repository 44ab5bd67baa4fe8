// Mutations of the real model's header: truncations at many points and random byte flips. Each
// mutant must open or throw llmk::Error; anything else (another exception, a crash, a sanitizer
// report) fails. The data section is left sparse (zeros from ftruncate), so only the header
// region (about 1.8 MB) is ever written.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "formats/gguf.h"
#include "gguf_model_util.h"
#include "gguf_test_util.h"
#include "test_paths.h"

namespace llmk::gguf {
namespace {

using namespace testkit;  // NOLINT: the writer helpers

// The real file's header region, and a scratch copy of the file to mutate.
class GgufFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    const File f = File::open(test::model_path(test::kSmolLM2));
    file_size_ = f.file_size();
    const Layout layout = rewrite_header(f);
    header_ = layout.bytes;  // equal to the file's own first bytes (gguf_model_test checks)
    tensor_infos_offset_ = layout.tensor_infos_offset;
    path_ = dir_.path() + "/mutant.gguf";
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd_, 0);
    restore();
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
  }

  // The header, then zeros up to the real size.
  void restore() {
    ASSERT_EQ(ftruncate(fd_, 0), 0);
    ASSERT_EQ(pwrite(fd_, header_.data(), header_.size(), 0), static_cast<ssize_t>(header_.size()));
    ASSERT_EQ(ftruncate(fd_, static_cast<off_t>(file_size_)), 0);
  }
  void write_byte(uint64_t at, uint8_t b) {
    ASSERT_EQ(pwrite(fd_, &b, 1, static_cast<off_t>(at)), 1);
  }

  // Opens the mutant: "" when it opened, the llmk::Error message otherwise. Any other
  // exception is a test failure.
  std::string open_mutant(const std::string& what) {
    try {
      const File f = File::open(path_);
      // Whatever opened must be usable: every tensor view lies inside the file.
      for (const TensorInfo& t : f.tensors()) {
        const Tensor v = f.tensor(t.name);
        EXPECT_EQ(static_cast<uint64_t>(v.nbytes()), t.nbytes) << what;
      }
      return "";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path_ + ": ", 0), 0u) << what << ": message lacks the path: " << msg;
      return msg.empty() ? "(empty message)" : msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": threw a non-llmk exception: " << e.what();
    }
    return "(foreign exception)";
  }

  TempDir dir_;
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint64_t tensor_infos_offset_ = 0;
  std::vector<uint8_t> header_;
};

TEST_F(GgufFuzz, TruncationsFailWithTruncatedOrPastTheEnd) {
  const uint64_t data_offset = header_.size();
  std::set<uint64_t> cuts;
  for (uint64_t c = 0; c < 4096; c += 37) cuts.insert(c);  // header and the first entries
  for (uint64_t c = 4096; c < tensor_infos_offset_; c += 32771) cuts.insert(c);  // vocabulary
  for (uint64_t c = tensor_infos_offset_ - 64; c < data_offset; c += 97) cuts.insert(c);
  for (uint64_t c : {data_offset - 1, data_offset, data_offset + 1, data_offset + 30081023,
                     file_size_ / 2, file_size_ - 2304, file_size_ - 1}) {
    cuts.insert(c);
  }
  int n = 0;
  // Longest first, so that each cut is one ftruncate of the previous file.
  for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {
    const uint64_t cut = *it;
    ASSERT_EQ(ftruncate(fd_, static_cast<off_t>(cut)), 0);
    const std::string what = fmt::format("cut at {}", cut);
    const std::string msg = open_mutant(what);
    ASSERT_FALSE(msg.empty()) << what << " opened";
    if (cut < 24) {
      EXPECT_NE(msg.find("too small"), std::string::npos) << what << ": " << msg;
    } else if (cut < data_offset) {
      EXPECT_NE(msg.find("truncated"), std::string::npos) << what << ": " << msg;
    } else {
      EXPECT_NE(msg.find("past the end of the file"), std::string::npos) << what << ": " << msg;
    }
    ++n;
    if (HasFailure()) break;
  }
  EXPECT_GT(n, 300);
}

TEST_F(GgufFuzz, RandomByteFlipsOpenOrFailCleanly) {
  std::mt19937_64 rng(20240611);
  const uint64_t data_offset = header_.size();
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi - 1)(rng);
  };
  int opened = 0, rejected = 0;
  constexpr int kMutants = 300;
  for (int m = 0; m < kMutants; ++m) {
    // Thirds: the header and first entries, the tensor table, anywhere before the data.
    std::vector<std::pair<uint64_t, uint8_t>> flips;
    const int n_flips = 1 + static_cast<int>(pick(0, 3));
    for (int k = 0; k < n_flips; ++k) {
      uint64_t at = 0;
      switch (m % 3) {
        case 0:
          at = pick(0, 512);
          break;
        case 1:
          at = pick(tensor_infos_offset_, data_offset);
          break;
        default:
          at = pick(0, data_offset);
      }
      const auto mask = static_cast<uint8_t>(pick(1, 256));
      flips.emplace_back(at, mask);
    }
    std::string what = fmt::format("mutant {} flips", m);
    for (const auto& [at, mask] : flips) {
      what += fmt::format(" {}^{}", at, mask);
      write_byte(at, static_cast<uint8_t>(header_[at] ^ mask));
    }
    const std::string msg = open_mutant(what);
    (msg.empty() ? opened : rejected)++;
    const bool hit_magic =
        std::any_of(flips.begin(), flips.end(), [](const auto& f) { return f.first < 4; });
    if (hit_magic) {
      EXPECT_NE(msg.find("bad magic"), std::string::npos) << what << ": " << msg;
    }
    for (const auto& [at, mask] : flips) write_byte(at, header_[at]);
    if (HasFailure()) break;
  }
  // Not vacuous: mutants both pass (flipped string bytes) and fail (broken structure).
  EXPECT_GT(opened, 10);
  EXPECT_GT(rejected, 50);
  // The restored file is the original header again.
  EXPECT_EQ(open_mutant("restored"), "");
}

}  // namespace
}  // namespace llmk::gguf
