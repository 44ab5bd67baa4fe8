#include "formats/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "core/text.h"
#include "formats/hf_config.h"
#include "formats/mapped_file.h"

namespace llmk::safetensors {

namespace {

using json_io::describe;
using json_io::Json;

constexpr uint64_t kSizeFieldBytes = 8;  // the u64 header size
constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

// ---- dtypes ---------------------------------------------------------------------------------

struct StDType {
  std::string_view name;
  std::optional<DType> dtype;  // empty: a safetensors dtype llmk does not read
};

// Every dtype the safetensors format defines.
constexpr std::array<StDType, 20> kDTypes = {{
    {"F32", DType::F32},       {"F16", DType::F16},       {"BF16", DType::BF16},
    {"I8", DType::I8},         {"I32", DType::I32},       {"F64", std::nullopt},
    {"I64", std::nullopt},     {"U64", std::nullopt},     {"U32", std::nullopt},
    {"I16", std::nullopt},     {"U16", std::nullopt},     {"U8", std::nullopt},
    {"BOOL", std::nullopt},    {"F8_E4M3", std::nullopt}, {"F8_E5M2", std::nullopt},
    {"F8_E8M0", std::nullopt}, {"F6_E2M3", std::nullopt}, {"F6_E3M2", std::nullopt},
    {"F4", std::nullopt},      {"C64", std::nullopt},
}};
constexpr std::string_view kReadable = "llmk reads F32, F16, BF16, I8 and I32";

const StDType* find_dtype(std::string_view name) {
  for (const StDType& t : kDTypes) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// ---- the mapping ----------------------------------------------------------------------------

using Mapping = formats::MappedFile;

std::shared_ptr<Mapping> map_safetensors(const std::string& path) {
  std::shared_ptr<Mapping> m = formats::map_file(path);
  LLMK_CHECK(m->size >= kSizeFieldBytes,
             "{}: file is too small to be safetensors: {} bytes, the header size alone takes {}",
             path, m->size, kSizeFieldBytes);
  return m;
}

// A hint for a header size that makes no sense: what the first bytes look like instead.
std::string_view what_it_looks_like(const uint8_t* head) {
  if (std::memcmp(head, "version ", 8) == 0) return "; this looks like a Git LFS pointer";
  if (std::memcmp(head, "GGUF", 4) == 0) return "; this looks like a GGUF file";
  if (head[0] == '<') return "; this looks like an HTML page, not a model";
  if (head[0] == '{') return "; this looks like a JSON file";
  return "";
}

// ---- header parsing -------------------------------------------------------------------------

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// Everything File::open learns; File::State (private to File) is this under another name.
struct Contents {
  std::string path;
  uint64_t file_size = 0;
  uint64_t data_offset = 0;
  std::shared_ptr<Mapping> mapping;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;
  std::map<std::string, std::string, std::less<>> metadata;
};

// Reads one header entry; errors name the file and the tensor.
class EntryReader {
 public:
  EntryReader(const std::string& path, const std::string& name, const Json& entry)
      : path_(path), name_(printable(name)), entry_(entry) {}

  [[noreturn]] void fail(std::string_view msg) const {
    LLMK_FAIL("{}: tensor '{}': {}", path_, name_, msg);
  }

  const Json& field(const char* key) const {
    const auto it = entry_.find(key);
    if (it == entry_.end()) fail(fmt::format("missing field '{}'", key));
    return *it;
  }

  // A non-negative integer that fits in int64.
  int64_t non_negative(const Json& v, std::string_view what) const {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(fmt::format("{} is {}, too large", what, u));
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) {
      const auto i = v.get<int64_t>();
      if (i < 0) fail(fmt::format("{} is negative ({})", what, i));
      return i;
    }
    fail(fmt::format("{} is {}, expected a non-negative integer", what, describe(v)));
  }

  DType dtype() const {
    const Json& v = field("dtype");
    if (!v.is_string()) fail(fmt::format("field 'dtype' is {}, expected a string", describe(v)));
    const auto& name = v.get_ref<const std::string&>();
    const StDType* t = find_dtype(name);
    if (t == nullptr) {
      LLMK_FAIL("{}: unknown dtype '{}' for tensor '{}' ({})", path_, printable(name), name_,
                kReadable);
    }
    if (!t->dtype) {
      LLMK_FAIL("{}: unsupported dtype {} for tensor '{}' ({})", path_, name, name_, kReadable);
    }
    return *t->dtype;
  }

  Shape shape() const {
    const Json& v = field("shape");
    if (!v.is_array()) fail(fmt::format("field 'shape' is {}, expected an array", describe(v)));
    Shape shape;
    shape.reserve(v.size());
    for (size_t d = 0; d < v.size(); ++d) {
      const Json& dim = v[d];
      if (dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
        fail(
            fmt::format("negative dimension {} = {} in shape {}", d, dim.get<int64_t>(), v.dump()));
      }
      shape.push_back(non_negative(dim, fmt::format("dimension {} of shape {}", d, v.dump())));
    }
    return shape;
  }

  std::pair<uint64_t, uint64_t> data_offsets() const {
    const Json& v = field("data_offsets");
    if (!v.is_array() || v.size() != 2) {
      fail(fmt::format("field 'data_offsets' is {}, expected [begin, end]", describe(v)));
    }
    const auto begin = static_cast<uint64_t>(non_negative(v[0], "data_offsets begin"));
    const auto end = static_cast<uint64_t>(non_negative(v[1], "data_offsets end"));
    if (end < begin) fail(fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
    return {begin, end};
  }

 private:
  const std::string& path_;
  std::string name_;
  const Json& entry_;
};

TensorInfo read_entry(const Contents& s, const std::string& name, const Json& entry) {
  EntryReader r(s.path, name, entry);
  if (name.empty()) LLMK_FAIL("{}: empty tensor name in the header", s.path);
  if (!entry.is_object()) {
    r.fail(fmt::format("entry is {}, expected an object with dtype, shape and data_offsets",
                       describe(entry)));
  }
  TensorInfo t;
  t.name = name;
  t.dtype = r.dtype();
  t.shape = r.shape();
  const auto [begin, end] = r.data_offsets();

  int64_t numel = 1;
  for (int64_t d : t.shape) {
    const auto prod = checked_mul(numel, d);
    if (!prod) r.fail(fmt::format("shape {} has too many elements", shape_str(t.shape)));
    numel = *prod;
  }
  const auto bytes = checked_mul(numel, static_cast<int64_t>(element_size(t.dtype)));
  if (!bytes)
    r.fail(fmt::format("shape {} is too large (byte size overflows)", shape_str(t.shape)));
  if (end - begin != static_cast<uint64_t>(*bytes)) {
    r.fail(fmt::format("data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {}", begin,
                       end, end - begin, shape_str(t.shape), entry.at("dtype").get<std::string>(),
                       *bytes));
  }
  const uint64_t data_bytes = s.file_size - s.data_offset;
  if (end > data_bytes) {
    LLMK_FAIL(
        "{}: tensor '{}' data extends past the end of the file (truncated download?): "
        "data_offsets [{}, {}] in a data section of {} bytes starting at {} (file size {})",
        s.path, printable(name), begin, end, data_bytes, s.data_offset, s.file_size);
  }
  t.offset = begin;
  t.nbytes = end - begin;
  return t;
}

void read_metadata(Contents& s, const Json& v) {
  if (!v.is_object()) {
    LLMK_FAIL("{}: '__metadata__' is {}, expected an object of strings", s.path, describe(v));
  }
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      LLMK_FAIL("{}: '__metadata__' key '{}' is {}, expected a string", s.path, printable(key),
                describe(value));
    }
    s.metadata.emplace(key, value.get<std::string>());
  }
}

// No two tensors share bytes. Empty tensors occupy none, so they may sit anywhere.
void check_overlaps(const Contents& s) {
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(s.tensors.size());
  for (const TensorInfo& t : s.tensors) {
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    LLMK_CHECK(a.offset + a.nbytes <= b.offset,
               "{}: overlapping tensors: '{}' at data_offsets [{}, {}] and '{}' at [{}, {}]",
               s.path, printable(a.name), a.offset, a.offset + a.nbytes, printable(b.name),
               b.offset, b.offset + b.nbytes);
  }
}

uint64_t read_header_size(const Contents& s) {
  uint64_t n = 0;
  std::memcpy(&n, s.mapping->data, sizeof n);  // little-endian, as is every host llmk runs on
  const uint64_t after = s.file_size - kSizeFieldBytes;
  if (n > kMaxHeaderBytes) {
    LLMK_FAIL("{}: not a safetensors file: header size {} is absurd (limit {}, file size {}){}",
              s.path, n, kMaxHeaderBytes, s.file_size, what_it_looks_like(s.mapping->data));
  }
  if (n > after) {
    LLMK_FAIL(
        "{}: truncated file: header size {} is larger than the {} bytes after the size field "
        "(file size {})",
        s.path, n, after, s.file_size);
  }
  return n;
}

void parse(const std::string& path, Contents* s) {
  s->path = path;
  s->mapping = map_safetensors(path);
  s->file_size = s->mapping->size;
  const uint64_t n = read_header_size(*s);
  s->data_offset = kSizeFieldBytes + n;

  const std::string_view text(reinterpret_cast<const char*>(s->mapping->data) + kSizeFieldBytes,
                              static_cast<size_t>(n));
  std::vector<std::string> order;  // the header's names in file order
  const Json header = json_io::parse(
      text, path,
      [&path](const std::vector<std::string>& parents, const std::string& key) {
        if (parents.empty()) {
          LLMK_FAIL("{}: duplicate tensor name '{}' in the header", path, printable(key));
        }
      },
      &order);
  if (!header.is_object()) {
    LLMK_FAIL("{}: the header is {}, expected a JSON object", path, describe(header));
  }

  s->tensors.reserve(header.size());
  for (const std::string& name : order) {
    const Json& entry = header.at(name);
    if (name == "__metadata__") {
      read_metadata(*s, entry);
      continue;
    }
    s->tensor_index.emplace(name, s->tensors.size());  // names are unique: parse checked
    s->tensors.push_back(read_entry(*s, name, entry));
  }
  check_overlaps(*s);
}

}  // namespace

DType dtype_from_name(std::string_view name) {
  const StDType* t = find_dtype(name);
  LLMK_CHECK(t != nullptr, "unknown dtype '{}' ({})", printable(name), kReadable);
  LLMK_CHECK(t->dtype.has_value(), "unsupported dtype {} ({})", name, kReadable);
  return *t->dtype;
}

// ---- File -----------------------------------------------------------------------------------

struct File::State : Contents {};

File File::open(const std::string& path) {
  auto s = std::make_shared<State>();
  parse(path, s.get());
  File f;
  f.s_ = std::move(s);
  return f;
}

const std::string& File::path() const { return s_->path; }
uint64_t File::file_size() const { return s_->file_size; }
uint64_t File::data_offset() const { return s_->data_offset; }
const std::vector<TensorInfo>& File::tensors() const { return s_->tensors; }

std::vector<std::string> File::names() const {
  std::vector<std::string> out;
  out.reserve(s_->tensors.size());
  for (const TensorInfo& t : s_->tensors) out.push_back(t.name);
  return out;
}

const TensorInfo* File::find(std::string_view name) const {
  const auto it = s_->tensor_index.find(name);
  return it == s_->tensor_index.end() ? nullptr : &s_->tensors[it->second];
}

const TensorInfo& File::tensor_info(std::string_view name) const {
  const TensorInfo* t = find(name);
  LLMK_CHECK(t != nullptr, "{}: missing tensor '{}'", s_->path, printable(name));
  return *t;
}

Tensor File::tensor(std::string_view name) const {
  const TensorInfo& t = tensor_info(name);
  const uint8_t* p = s_->mapping->data + s_->data_offset + t.offset;
  if (reinterpret_cast<uintptr_t>(p) % element_size(t.dtype) != 0) {
    Tensor copy = Tensor::empty(t.shape, t.dtype);
    std::memcpy(copy.data(), p, static_cast<size_t>(t.nbytes));
    return copy;
  }
  // The mapping is read-only: writing through the view faults. Callers copy to modify.
  return Tensor::borrow(const_cast<uint8_t*>(p), t.shape, t.dtype, Device::CPU, s_->mapping);
}

const std::map<std::string, std::string, std::less<>>& File::metadata() const {
  return s_->metadata;
}

// ---- Folder ---------------------------------------------------------------------------------

namespace {

// Everything Folder::open learns; Folder::State is this under another name.
struct FolderContents {
  struct Entry {
    size_t shard;
    const TensorInfo* info;  // inside shards[shard], which the State keeps alive
  };
  std::string path;
  std::string index_path;
  std::vector<File> shards;
  std::vector<std::string> names;
  std::map<std::string, Entry, std::less<>> entries;
};

namespace fs = std::filesystem;

// No control characters either: the name becomes part of paths that error messages quote.
bool is_plain_file_name(std::string_view s) {
  const auto is_control = [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; };
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         std::none_of(s.begin(), s.end(), is_control);
}

// weight_map from the index: tensor name -> shard file name, in file order.
std::vector<std::pair<std::string, std::string>> read_weight_map(const std::string& index) {
  const std::string text = json_io::read_file(index, size_t{256} << 20);
  const Json j = json_io::parse(
      text, index, [&index](const std::vector<std::string>& parents, const std::string& key) {
        if (parents.size() == 1 && parents[0] == "weight_map") {
          LLMK_FAIL("{}: tensor '{}' is listed twice in weight_map", index, printable(key));
        }
      });
  LLMK_CHECK(j.is_object(), "{}: the index is {}, expected a JSON object", index, describe(j));
  const auto it = j.find("weight_map");
  LLMK_CHECK(it != j.end(), "{}: missing 'weight_map'", index);
  LLMK_CHECK(it->is_object(), "{}: 'weight_map' is {}, expected an object", index, describe(*it));
  LLMK_CHECK(!it->empty(), "{}: 'weight_map' is empty", index);
  std::vector<std::pair<std::string, std::string>> map;
  map.reserve(it->size());
  for (const auto& [name, shard] : it->items()) {
    LLMK_CHECK(shard.is_string(), "{}: weight_map entry '{}' is {}, expected a shard file name",
               index, printable(name), describe(shard));
    const auto& file = shard.get_ref<const std::string&>();
    LLMK_CHECK(is_plain_file_name(file),
               "{}: weight_map entry '{}' names shard '{}', which is not a file name in the "
               "index's folder",
               index, printable(name), printable(file));
    map.emplace_back(name, file);
  }
  return map;
}

void open_sharded(const std::string& index, FolderContents* s) {
  const auto weight_map = read_weight_map(index);
  std::set<std::string> shard_names;
  for (const auto& [name, shard] : weight_map) shard_names.insert(shard);

  std::map<std::string, size_t, std::less<>> shard_ids;
  for (const std::string& shard : shard_names) {
    const std::string file = (fs::path(s->path) / shard).string();
    std::error_code ec;
    LLMK_CHECK(fs::exists(file, ec), "{}: shard file is missing (listed in {})", file, index);
    shard_ids.emplace(shard, s->shards.size());
    s->shards.push_back(File::open(file));
  }

  std::map<std::string_view, std::string_view> shard_of;  // tensor -> shard file name
  for (const auto& [name, shard] : weight_map) {
    const File& f = s->shards[shard_ids.at(shard)];
    const TensorInfo* t = f.find(name);
    LLMK_CHECK(t != nullptr, "{}: tensor '{}' is mapped to {}, but that shard has no such tensor",
               index, printable(name), shard);
    s->entries.emplace(name, FolderContents::Entry{shard_ids.at(shard), t});
    shard_of.emplace(name, shard);
  }
  // A tensor the index maps to one shard must not also sit in another: which bytes are meant?
  for (const auto& [shard, id] : shard_ids) {
    for (const TensorInfo& t : s->shards[id].tensors()) {
      const auto it = shard_of.find(t.name);
      if (it == shard_of.end()) continue;  // not in the index: not exposed
      LLMK_CHECK(it->second == shard,
                 "{}: tensor '{}' is in two shards, {} and {} (weight_map names {})", index,
                 printable(t.name), it->second, shard, it->second);
      s->names.push_back(t.name);
    }
  }
}

void open_single(const std::string& file, FolderContents* s) {
  s->shards.push_back(File::open(file));
  for (const TensorInfo& t : s->shards[0].tensors()) {
    s->entries.emplace(t.name, FolderContents::Entry{0, &t});
    s->names.push_back(t.name);
  }
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

struct Folder::State : FolderContents {};

Folder Folder::open(const std::string& path) {
  auto s = std::make_shared<State>();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    LLMK_FAIL("{}: cannot open: {}", path, ec ? ec.message() : "No such file or directory");
  }
  if (fs::is_directory(st)) {
    s->path = path;
    const std::string index = (fs::path(path) / kIndexName).string();
    const std::string single = (fs::path(path) / kSingleName).string();
    if (fs::exists(index, ec)) {
      s->index_path = index;
      open_sharded(index, s.get());
    } else if (fs::exists(single, ec)) {
      open_single(single, s.get());
    } else {
      LLMK_FAIL("{}: neither {} nor {} is in this folder", path, kIndexName, kSingleName);
    }
  } else {
    // A file: an index (any name ending in .index.json) or one safetensors file.
    const fs::path parent = fs::path(path).parent_path();
    s->path = (parent.empty() ? fs::path(".") : parent).string();
    if (ends_with(path, ".index.json")) {
      s->index_path = path;
      open_sharded(path, s.get());
    } else {
      open_single(path, s.get());
    }
  }
  Folder f;
  f.s_ = std::move(s);
  return f;
}

const std::string& Folder::path() const { return s_->path; }
const std::string& Folder::index_path() const { return s_->index_path; }
const std::vector<File>& Folder::shards() const { return s_->shards; }
const std::vector<std::string>& Folder::names() const { return s_->names; }

const TensorInfo* Folder::find(std::string_view name) const {
  const auto it = s_->entries.find(name);
  return it == s_->entries.end() ? nullptr : it->second.info;
}

const File& Folder::shard_of(std::string_view name) const {
  const auto it = s_->entries.find(name);
  LLMK_CHECK(it != s_->entries.end(), "{}: missing tensor '{}'",
             s_->index_path.empty() ? s_->shards[0].path() : s_->index_path, printable(name));
  return s_->shards[it->second.shard];
}

const TensorInfo& Folder::tensor_info(std::string_view name) const {
  return *shard_of(name).find(name);
}

Tensor Folder::tensor(std::string_view name) const { return shard_of(name).tensor(name); }

}  // namespace llmk::safetensors
