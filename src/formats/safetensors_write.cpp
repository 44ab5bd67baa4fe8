#include "formats/safetensors_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace llmk::safetensors {

namespace {
// Writes all of `bytes` at `offset` of fd; false (errno set) when a write fails or writes
// nothing (a full disk: ENOSPC).
bool pwrite_all(int fd, std::string_view bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w =
        ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return false;
    }
    done += static_cast<size_t>(w);
  }
  return true;
}
}  // namespace

Writer::Writer(const std::string& path, std::vector<OutTensor> tensors,
               const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const OutTensor& t : tensors_) {
    LLMK_CHECK(t.elem_size > 0 && !t.name.empty() && t.name != "__metadata__",
               "{}: bad tensor '{}'", path, t.name);
    uint64_t n = t.elem_size;
    for (const int64_t d : t.shape) {
      LLMK_CHECK(d >= 0, "{}: tensor '{}' has a negative dimension", path, t.name);
      n *= static_cast<uint64_t>(d);
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + n}}};
    begin_.push_back(at);
    size_.push_back(n);
    at += n;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t data = 8 + json.size();
  for (uint64_t& b : begin_) b += data;

  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LLMK_CHECK(fd_ >= 0, "{}: cannot write: {}", path, formats::errno_message(errno));
  std::string head(8, '\0');
  const uint64_t hs = json.size();
  for (int i = 0; i < 8; ++i) head[static_cast<size_t>(i)] = static_cast<char>(hs >> (8 * i));
  head += json;
  if (::ftruncate(fd_, static_cast<off_t>(data + at)) != 0 || !pwrite_all(fd_, head, 0)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    LLMK_FAIL("{}: cannot write: {}", path, formats::errno_message(err));
  }
}

Writer::~Writer() {
  if (fd_ >= 0) ::close(fd_);
}

void Writer::write(size_t index, uint64_t offset, std::string_view bytes) {
  LLMK_CHECK(fd_ >= 0, "{}: write after close", path_);
  LLMK_CHECK(
      index < tensors_.size() && offset <= size_[index] && bytes.size() <= size_[index] - offset,
      "{}: write of {} bytes at {} outside tensor {}", path_, bytes.size(), offset, index);
  LLMK_CHECK(pwrite_all(fd_, bytes, begin_[index] + offset), "{}: cannot write: {}", path_,
             formats::errno_message(errno));
}

void Writer::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  LLMK_CHECK(::close(fd) == 0, "{}: cannot write: {}", path_, formats::errno_message(errno));
}

}  // namespace llmk::safetensors
