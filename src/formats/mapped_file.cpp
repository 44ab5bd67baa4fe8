#include "formats/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <system_error>

#include "core/error.h"

namespace llmk::formats {

namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens `path` without blocking (a FIFO must not wait for a writer).
int open_nonblocking(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) LLMK_FAIL("{}: cannot open: {}", path, errno_message(errno));
  return fd;
}

// The size of the open file, which must be a regular file.
uint64_t regular_file_size(const std::string& path, const Fd& fd) {
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) LLMK_FAIL("{}: cannot stat: {}", path, errno_message(errno));
  if (!S_ISREG(st.st_mode)) LLMK_FAIL("{}: not a regular file", path);
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace

std::string errno_message(int err) { return std::generic_category().message(err); }

MappedFile::~MappedFile() {
  if (data != nullptr) munmap(const_cast<uint8_t*>(data), size);
}

std::shared_ptr<MappedFile> map_file(const std::string& path) {
  const Fd fd(open_nonblocking(path));
  const uint64_t size = regular_file_size(path, fd);
  auto m = std::make_shared<MappedFile>();
  if (size == 0) return m;
  LLMK_CHECK(size <= std::numeric_limits<size_t>::max(), "{}: file too large to map", path);
  void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED) LLMK_FAIL("{}: cannot map {} bytes: {}", path, size, errno_message(errno));
  m->data = static_cast<const uint8_t*>(p);
  m->size = static_cast<size_t>(size);
  return m;
}

std::string read_file(const std::string& path, size_t max_bytes) {
  const Fd fd(open_nonblocking(path));
  const uint64_t size = regular_file_size(path, fd);
  LLMK_CHECK(size <= max_bytes, "{}: file is {} bytes, larger than the {} bytes expected", path,
             size, max_bytes);
  std::string text(static_cast<size_t>(size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) LLMK_FAIL("{}: cannot read: {}", path, errno_message(errno));
    if (n == 0) break;  // shrank while reading
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace llmk::formats
