// Hugging Face config.json: typed getters whose errors name the file and the key, and raw JSON
// access for the nested objects ("rope_parameters", "rope_scaling", "text_config").
//
// Also the JSON helpers every Hugging Face format reader here shares (config.json,
// safetensors headers, model.safetensors.index.json): reading a file whole, parsing with
// line/column errors and duplicate-key detection, and describing a value for error messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>


namespace llmk {

namespace json_io {

// Objects keep their keys sorted (std::map): inserting n keys costs n log n, where an object
// that kept file order would cost n^2 (a 1 MB header of 125k keys took about 30 s).
using Json = nlohmann::json;

// The file's bytes. Throws llmk::Error "<path>: cannot open: <reason>" (or "not a regular
// file", or "larger than <max_bytes> bytes").
std::string read_file(const std::string& path, size_t max_bytes = size_t{1} << 30);

// Called for a key that occurs twice in one object. `parents` are the keys of the enclosing
// objects, outermost first ({} for a key of the top-level object).
using DuplicateKeyFn =
    std::function<void(const std::vector<std::string>& parents, const std::string& key)>;

// Parses `text`; errors name `path`: "<path>: malformed JSON at line L, column C: <reason>".
// A duplicate key calls `on_duplicate` when given (which should throw), else throws
// "<path>: duplicate key '<a.b.key>'". `top_level_keys`, when given, receives the keys of the
// top-level object in file order (for formats whose order means something, such as the tensors
// of a safetensors header).
Json parse(std::string_view text, const std::string& path,
           const DuplicateKeyFn& on_duplicate = nullptr,
           std::vector<std::string>* top_level_keys = nullptr);

// 1-based line and column of byte `offset` (0-based) of `text`; offsets past the end give the
// position just after the last byte.
struct TextPosition {
  size_t line = 1;
  size_t column = 1;
};
TextPosition text_position(std::string_view text, size_t offset);

// "an integer (3)", "a string (\"16\")", "null", "an array", ...: what a value is, for errors.
std::string describe(const Json& v);


}  // namespace json_io

class HfConfig {
 public:
  using Json = json_io::Json;

  // `path` is a model folder holding config.json, or the JSON file itself. Throws llmk::Error
  // naming the file: unreadable, malformed JSON (with line and column), not an object.
  static HfConfig open(const std::string& path);
  // The same, from text already in memory; `path` names it in errors.
  static HfConfig parse(std::string_view text, const std::string& path);

  const std::string& path() const;
  // This object: the whole file, or the nested object `object()` returned.
  const Json& json() const;

  // A key that is present with the value null counts as absent: Hugging Face writes null for
  // "not set" ("rope_scaling": null, "sliding_window": null).
  bool has(std::string_view key) const;
  const Json* find(std::string_view key) const;  // nullptr if absent or null
  const Json& get(std::string_view key) const;   // throws "<path>: missing key '<key>'"

  // Typed getters. A value of the wrong type throws "<path>: key '<key>' is <what it is>,
  // expected <type>" (nested keys are named "rope_parameters.factor"). The fallback versions
  // return the fallback only when the key is absent or null, never for a wrong type.
  int64_t get_int(std::string_view key) const;  // integers, and floats with integral values
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;  // floats and integers
  double get_float(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;
  bool get_bool(std::string_view key) const;
  bool get_bool(std::string_view key, bool fallback) const;
  // An integer or an array of integers ("eos_token_id": 2 or [128001, 128009]).
  std::vector<int64_t> get_int_list(std::string_view key) const;

  // The nested object under `key`, with the same getters; errors name "<key>.<inner key>".
  // Throws when the key is absent, null or not an object.
  HfConfig object(std::string_view key) const;

 private:
  std::string key_name(std::string_view key) const;  // prefix + key
  [[noreturn]] void type_error(std::string_view key, const Json& v,
                               std::string_view expected) const;

  std::string path_;
  std::shared_ptr<const Json> root_;  // keeps `node_` alive
  const Json* node_ = nullptr;
  std::string prefix_;  // "" or "rope_parameters."
};

}  // namespace llmk
