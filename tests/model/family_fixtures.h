// The tiny random-weight models of tests/fixtures/families/<family>/ (written by
// tests/fixtures/families/make_models.py with transformers) and their reference logits, plus
// helpers to make altered copies of a fixture folder. Used by the model tests and the GPU tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_paths.h"

namespace llmk::test {

inline const std::vector<std::string>& family_names() {
  static const std::vector<std::string> k = {"llama3", "qwen2", "phi3", "gemma3"};
  return k;
}

inline std::string family_dir(const std::string& family) {
  return source_path("tests/fixtures/families/" + family);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

// transformers' float32 CPU logits for the fixture's prompt.
struct FamilyReference {
  nlohmann::json meta;       // reference.json
  std::vector<int32_t> ids;  // the prompt
  int64_t vocab = 0;
  std::vector<float> logits;  // [ids.size(), vocab]

  static FamilyReference load(const std::string& family) {
    FamilyReference r;
    const std::string dir = family_dir(family);
    r.meta = nlohmann::json::parse(read_text(dir + "/reference.json"));
    r.ids = r.meta.at("ids").get<std::vector<int32_t>>();
    const auto shape = r.meta.at("logits_shape").get<std::vector<int64_t>>();
    r.vocab = shape.at(1);
    const std::string bytes = read_text(dir + "/" + r.meta.at("logits_file").get<std::string>());
    r.logits.resize(bytes.size() / sizeof(float));
    std::memcpy(r.logits.data(), bytes.data(), r.logits.size() * sizeof(float));
    if (shape.at(0) != static_cast<int64_t>(r.ids.size()) ||
        static_cast<int64_t>(r.logits.size()) != shape[0] * shape[1]) {
      throw std::runtime_error(family + ": reference logits do not match their shape");
    }
    return r;
  }
  const float* row(size_t t) const { return logits.data() + t * static_cast<size_t>(vocab); }
};

// The relative error of one row: max_v |got - want| / max_v |want| (the largest logit's
// magnitude sets the scale, so small logits near zero do not inflate it).
inline double row_rel_err(const float* got, const float* want, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t v = 0; v < n; ++v) {
    diff = std::max(diff, std::abs(static_cast<double>(got[v]) - want[v]));
    scale = std::max(scale, std::abs(static_cast<double>(want[v])));
  }
  return scale > 0 ? diff / scale : diff;
}

inline int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

// A fresh directory under /tmp, removed with everything in it when the object dies.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = "/tmp/llmk-model-test-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

  // A copy of the fixture folder (config.json and the safetensors) named `name` in here.
  std::string copy_family(const std::string& family, const std::string& name) const {
    namespace fs = std::filesystem;
    const fs::path dst = fs::path(path_) / name;
    fs::create_directories(dst);
    for (const auto& e : fs::directory_iterator(family_dir(family))) {
      const std::string f = e.path().filename().string();
      if (f == "config.json" || f.find(".safetensors") != std::string::npos) {
        fs::copy_file(e.path(), dst / f, fs::copy_options::overwrite_existing);
      }
    }
    return dst.string();
  }

 private:
  std::string path_;
};

// Edits config.json of a copied folder: `edit` changes the parsed JSON in place.
template <typename Edit>
void edit_config(const std::string& folder, Edit&& edit) {
  const std::string p = folder + "/config.json";
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(read_text(p));
  edit(j);
  write_text(p, j.dump(2));
}

}  // namespace llmk::test
