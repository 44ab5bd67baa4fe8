#include "formats/hf_config.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "core/text.h"
#include "formats/mapped_file.h"

namespace llmk {

namespace json_io {

namespace {

// What nlohmann says after its "[json.exception.parse_error.101] parse error at line 1,
// column 2: " prefix; the position is recomputed by the caller.
// nlohmann's reason without its "[json.exception.parse_error.101] parse error at ...: " prefix.
// The token it quotes after "last read: " is as long as the file makes it (a whole string): it is
// cut and escaped.
std::string parse_error_reason(std::string_view what) {
  const size_t at = what.find("parse error");
  const size_t colon = at == std::string_view::npos ? at : what.find(": ", at);
  const std::string_view reason = colon == std::string_view::npos ? what : what.substr(colon + 2);
  constexpr std::string_view kLastRead = "; last read: '";
  const size_t token = reason.find(kLastRead);
  if (token == std::string_view::npos) return std::string(reason);
  const size_t begin = token + kLastRead.size();
  size_t end = reason.rfind("'; expected ");
  if (end == std::string_view::npos || end < begin) end = reason.size() - 1;
  if (end < begin || reason[end] != '\'') return std::string(reason);
  return fmt::format("{}{}{}", reason.substr(0, begin),
                     printable(reason.substr(begin, end - begin)), reason.substr(end));
}

// Tracks the keys of every open object so that a key seen twice in one object is reported
// (nlohmann would silently keep the last value).
class DuplicateKeyCheck {
 public:
  DuplicateKeyCheck(const std::string& path, const DuplicateKeyFn& on_duplicate,
                    std::vector<std::string>* top_level_keys)
      : path_(path), on_duplicate_(on_duplicate), top_level_keys_(top_level_keys) {}

  template <class AnyJson>
  bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, AnyJson& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
        frames_.push_back(Frame{true, {}, {}});
        break;
      case E::array_start:
        frames_.push_back(Frame{false, {}, {}});
        break;
      case E::object_end:
      case E::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case E::key:
        if (!frames_.empty() && parsed.is_string())
          on_key(parsed.template get_ref<const std::string&>());
        break;
      case E::value:
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string, std::less<>> keys;
    std::string last_key;
  };

  void on_key(const std::string& key) {
    Frame& top = frames_.back();
    top.last_key = key;
    if (top.keys.insert(key).second) {
      if (top_level_keys_ != nullptr && frames_.size() == 1) top_level_keys_->push_back(key);
      return;
    }
    std::vector<std::string> parents;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      if (frames_[i].is_object) parents.push_back(frames_[i].last_key);
    }
    if (on_duplicate_) on_duplicate_(parents, key);
    std::string full;
    for (const std::string& p : parents) full += printable(p) + ".";
    LLMK_FAIL("{}: duplicate key '{}'", path_, full + printable(key));
  }

  const std::string& path_;
  const DuplicateKeyFn& on_duplicate_;
  std::vector<std::string>* top_level_keys_;
  std::vector<Frame> frames_;
};

}  // namespace

std::string read_file(const std::string& path, size_t max_bytes) {
  return formats::read_file(path, max_bytes);
}

TextPosition text_position(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  TextPosition p;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++p.line;
      line_start = i + 1;
    }
  }
  p.column = offset - line_start + 1;
  return p;
}

Json parse(std::string_view text, const std::string& path, const DuplicateKeyFn& on_duplicate,
           std::vector<std::string>* top_level_keys) {
  DuplicateKeyCheck check(path, on_duplicate, top_level_keys);
  try {
    return Json::parse(text.begin(), text.end(),
                       [&check](int depth, Json::parse_event_t event, Json& parsed) {
                         return check(depth, event, parsed);
                       });
  } catch (const Json::parse_error& e) {
    // e.byte is 1-based: the byte at which the parser gave up.
    const TextPosition p = text_position(text, e.byte > 0 ? e.byte - 1 : 0);
    LLMK_FAIL("{}: malformed JSON at line {}, column {}: {}", path, p.line, p.column,
              parse_error_reason(e.what()));
  } catch (const Json::exception& e) {  // e.g. a number too large for a double
    LLMK_FAIL("{}: malformed JSON: {}", path, e.what());
  }
}

std::string describe(const Json& v) {
  auto shown = [&v] {
    std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    constexpr size_t kMax = 40;
    if (s.size() > kMax) s = s.substr(0, kMax) + "...";
    return s;
  };
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return fmt::format("a bool ({})", shown());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return fmt::format("an integer ({})", shown());
    case nlohmann::json::value_t::number_float:
      return fmt::format("a float ({})", shown());
    case nlohmann::json::value_t::string:
      return fmt::format("a string ({})", shown());
    case nlohmann::json::value_t::array:
      return fmt::format("an array of {} items", v.size());
    case nlohmann::json::value_t::object:
      return "an object";
    default:
      return std::string(v.type_name());
  }
}

}  // namespace json_io

// ---- HfConfig -------------------------------------------------------------------------------

HfConfig HfConfig::open(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "config.json").string();
    LLMK_CHECK(std::filesystem::exists(file, ec), "{}: no config.json in this folder", path);
  }
  return parse(json_io::read_file(file, size_t{64} << 20), file);
}

HfConfig HfConfig::parse(std::string_view text, const std::string& path) {
  auto root = std::make_shared<const Json>(json_io::parse(text, path));
  LLMK_CHECK(root->is_object(), "{}: expected a JSON object at the top level, found {}", path,
             json_io::describe(*root));
  HfConfig c;
  c.path_ = path;
  c.node_ = root.get();
  c.root_ = std::move(root);
  return c;
}

const std::string& HfConfig::path() const { return path_; }
const HfConfig::Json& HfConfig::json() const { return *node_; }

std::string HfConfig::key_name(std::string_view key) const { return prefix_ + printable(key); }

void HfConfig::type_error(std::string_view key, const Json& v, std::string_view expected) const {
  LLMK_FAIL("{}: key '{}' is {}, expected {}", path_, key_name(key), json_io::describe(v),
            expected);
}

const HfConfig::Json* HfConfig::find(std::string_view key) const {
  const auto it = node_->find(std::string(key));
  if (it == node_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool HfConfig::has(std::string_view key) const { return find(key) != nullptr; }

const HfConfig::Json& HfConfig::get(std::string_view key) const {
  const Json* v = find(key);
  if (v == nullptr) {
    const bool null = node_->contains(std::string(key));
    LLMK_FAIL("{}: {} key '{}'", path_, null ? "null value for" : "missing", key_name(key));
  }
  return *v;
}

int64_t HfConfig::get_int(std::string_view key) const {
  const Json& v = get(key);
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      LLMK_FAIL("{}: key '{}' is {}, out of range for a 64-bit integer", path_, key_name(key), u);
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    // Python writes 4096.0 where it computed a float; accept it when the value is whole.
    const auto d = v.get<double>();
    constexpr double kLimit = 9223372036854775808.0;  // 2^63
    if (std::isfinite(d) && std::trunc(d) == d && d >= -kLimit && d < kLimit) {
      return static_cast<int64_t>(d);
    }
  }
  type_error(key, v, "an integer");
}

int64_t HfConfig::get_int(std::string_view key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double HfConfig::get_float(std::string_view key) const {
  const Json& v = get(key);
  if (!v.is_number()) type_error(key, v, "a number");
  return v.get<double>();
}

double HfConfig::get_float(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

std::string HfConfig::get_string(std::string_view key) const {
  const Json& v = get(key);
  if (!v.is_string()) type_error(key, v, "a string");
  return v.get<std::string>();
}

std::string HfConfig::get_string(std::string_view key, std::string_view fallback) const {
  return has(key) ? get_string(key) : std::string(fallback);
}

bool HfConfig::get_bool(std::string_view key) const {
  const Json& v = get(key);
  if (!v.is_boolean()) type_error(key, v, "a bool");
  return v.get<bool>();
}

bool HfConfig::get_bool(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}

std::vector<int64_t> HfConfig::get_int_list(std::string_view key) const {
  const Json& v = get(key);
  if (!v.is_array()) return {get_int(key)};
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& item = v[i];
    if (!item.is_number_integer() ||
        (item.is_number_unsigned() &&
         item.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      LLMK_FAIL("{}: key '{}' item {} is {}, expected an integer", path_, key_name(key), i,
                json_io::describe(item));
    }
    out.push_back(item.get<int64_t>());
  }
  return out;
}

HfConfig HfConfig::object(std::string_view key) const {
  const Json& v = get(key);
  if (!v.is_object()) type_error(key, v, "an object");
  HfConfig c = *this;
  c.node_ = &v;
  c.prefix_ = key_name(key) + ".";
  return c;
}

}  // namespace llmk
