// config.json: typed getters, nested objects, and errors that name the file, the key and (for
// malformed JSON) the line and column. The fixture is the config transformers wrote for
// tests/fixtures/safetensors/tiny-llama (tests/fixtures/safetensors/make_safetensors.py).
#include "formats/hf_config.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "gguf_test_util.h"

namespace llmk {
namespace {

using gguf::testkit::error_of;
using gguf::testkit::TempDir;

const std::string kTinyLlama =
    std::string(LLMK_SOURCE_DIR) + "/tests/fixtures/safetensors/tiny-llama";
const std::string kPath = "/models/x/config.json";  // names in-memory configs in errors

HfConfig config(std::string_view text) { return HfConfig::parse(text, kPath); }

template <typename Fn>
std::string message_of(Fn&& fn) {
  return error_of(std::forward<Fn>(fn));
}

TEST(HfConfig, ReadsTheTransformersConfig) {
  const HfConfig c = HfConfig::open(kTinyLlama);
  EXPECT_EQ(c.path(), kTinyLlama + "/config.json");
  EXPECT_EQ(c.get_int("hidden_size"), 16);
  EXPECT_EQ(c.get_int("num_hidden_layers"), 2);
  EXPECT_EQ(c.get_int("num_attention_heads"), 4);
  EXPECT_EQ(c.get_int("num_key_value_heads"), 2);
  EXPECT_EQ(c.get_int("intermediate_size"), 32);
  EXPECT_EQ(c.get_int("vocab_size"), 64);
  EXPECT_EQ(c.get_int("head_dim"), 4);
  EXPECT_EQ(c.get_int("max_position_embeddings"), 128);
  EXPECT_DOUBLE_EQ(c.get_float("rms_norm_eps"), 1e-5);
  EXPECT_EQ(c.get_string("model_type"), "llama");
  EXPECT_EQ(c.get_string("hidden_act"), "silu");
  EXPECT_FALSE(c.get_bool("tie_word_embeddings"));
  EXPECT_EQ(c.get_int_list("eos_token_id"), std::vector<int64_t>{2});
  EXPECT_EQ(c.json()["architectures"][0], "LlamaForCausalLM");
  // "pad_token_id": null counts as absent.
  EXPECT_FALSE(c.has("pad_token_id"));
  EXPECT_EQ(c.get_int("pad_token_id", -1), -1);
  EXPECT_FALSE(c.has("rope_scaling"));

  const HfConfig rope = c.object("rope_parameters");
  EXPECT_EQ(rope.get_string("rope_type"), "llama3");
  EXPECT_DOUBLE_EQ(rope.get_float("rope_theta"), 500000.0);
  EXPECT_DOUBLE_EQ(rope.get_float("factor"), 8.0);
  EXPECT_DOUBLE_EQ(rope.get_float("low_freq_factor"), 1.0);
  EXPECT_DOUBLE_EQ(rope.get_float("high_freq_factor"), 4.0);
  EXPECT_EQ(rope.get_int("original_max_position_embeddings"), 64);
  EXPECT_EQ(message_of([&] { rope.get_string("factor"); }),
            c.path() + ": key 'rope_parameters.factor' is a float (8.0), expected a string");

  // The file path works as well as the folder.
  EXPECT_EQ(HfConfig::open(kTinyLlama + "/config.json").get_int("hidden_size"), 16);
}

// Every scalar in the config, as Python's json module read it, through the typed getters.
TEST(HfConfig, AgreesWithPythonOnEveryScalar) {
  std::ifstream in(kTinyLlama + "/../expected.json");
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json want = nlohmann::json::parse(ss.str())["tiny_llama"]["config"];
  const HfConfig c = HfConfig::open(kTinyLlama);
  int checked = 0;
  for (const auto& [key, v] : want.items()) {
    SCOPED_TRACE(key);
    if (v.is_boolean()) {
      EXPECT_EQ(c.get_bool(key), v.get<bool>());
    } else if (v.is_number_integer()) {
      EXPECT_EQ(c.get_int(key), v.get<int64_t>());
    } else if (v.is_number_float()) {
      EXPECT_EQ(c.get_float(key), v.get<double>());
    } else if (v.is_string()) {
      EXPECT_EQ(c.get_string(key), v.get<std::string>());
    } else {
      continue;
    }
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(HfConfig, TypedGetters) {
  const HfConfig c = config(R"({
    "i": 7, "neg": -3, "f": 2.5, "whole": 4096.0, "big": 18446744073709551615,
    "s": "text", "b": true, "n": null, "list": [128001, 128009], "obj": {"inner": {"x": 1}}
  })");
  EXPECT_EQ(c.get_int("i"), 7);
  EXPECT_EQ(c.get_int("neg"), -3);
  EXPECT_EQ(c.get_int("whole"), 4096);
  EXPECT_DOUBLE_EQ(c.get_float("f"), 2.5);
  EXPECT_DOUBLE_EQ(c.get_float("i"), 7.0);  // integers are accepted as floats
  EXPECT_EQ(c.get_string("s"), "text");
  EXPECT_TRUE(c.get_bool("b"));
  EXPECT_EQ(c.get_int_list("list"), (std::vector<int64_t>{128001, 128009}));
  EXPECT_EQ(c.get_int_list("i"), std::vector<int64_t>{7});
  EXPECT_EQ(c.object("obj").object("inner").get_int("x"), 1);
  EXPECT_TRUE(c.has("i"));
  EXPECT_FALSE(c.has("n"));
  EXPECT_FALSE(c.has("absent"));
  EXPECT_EQ(c.find("absent"), nullptr);
  ASSERT_NE(c.find("s"), nullptr);
  EXPECT_EQ(*c.find("s"), "text");

  // Fallbacks apply to absent and null keys only.
  EXPECT_EQ(c.get_int("absent", 11), 11);
  EXPECT_EQ(c.get_int("n", 12), 12);
  EXPECT_EQ(c.get_int("i", 12), 7);
  EXPECT_DOUBLE_EQ(c.get_float("absent", 0.5), 0.5);
  EXPECT_EQ(c.get_string("absent", "dflt"), "dflt");
  EXPECT_TRUE(c.get_bool("absent", true));
  EXPECT_EQ(message_of([&] { c.get_int("s", 1); }),
            kPath + ": key 's' is a string (\"text\"), expected an integer");
}

TEST(HfConfig, ErrorsNameTheFileAndTheKey) {
  const HfConfig c = config(R"({"i": 7, "f": 2.5, "s": "x", "n": null, "big": 18446744073709551615,
                                "list": [1, "two"], "obj": {"inner": {"x": "y"}}})");
  EXPECT_EQ(message_of([&] { c.get_int("absent"); }), kPath + ": missing key 'absent'");
  EXPECT_EQ(message_of([&] { c.get_int("n"); }), kPath + ": null value for key 'n'");
  EXPECT_EQ(message_of([&] { c.get_int("f"); }),
            kPath + ": key 'f' is a float (2.5), expected an integer");
  EXPECT_EQ(message_of([&] { c.get_int("big"); }),
            kPath + ": key 'big' is 18446744073709551615, out of range for a 64-bit integer");
  EXPECT_EQ(message_of([&] { c.get_float("s"); }),
            kPath + ": key 's' is a string (\"x\"), expected a number");
  EXPECT_EQ(message_of([&] { c.get_string("i"); }),
            kPath + ": key 'i' is an integer (7), expected a string");
  EXPECT_EQ(message_of([&] { c.get_bool("i"); }),
            kPath + ": key 'i' is an integer (7), expected a bool");
  EXPECT_EQ(message_of([&] { c.object("i"); }),
            kPath + ": key 'i' is an integer (7), expected an object");
  EXPECT_EQ(message_of([&] { c.get_int_list("list"); }),
            kPath + ": key 'list' item 1 is a string (\"two\"), expected an integer");
  EXPECT_EQ(message_of([&] { c.get_int_list("s"); }),
            kPath + ": key 's' is a string (\"x\"), expected an integer");
  EXPECT_EQ(message_of([&] { c.object("obj").object("inner").get_int("x"); }),
            kPath + ": key 'obj.inner.x' is a string (\"y\"), expected an integer");
  EXPECT_EQ(message_of([&] { c.object("obj").get_int("nope"); }),
            kPath + ": missing key 'obj.nope'");
}

TEST(HfConfig, MalformedJsonNamesLineAndColumn) {
  // Missing colon: the parser stops at the '2' on line 3, column 7.
  EXPECT_EQ(message_of([] { config("{\n  \"a\": 1,\n  \"b\" 2\n}"); }),
            kPath +
                ": malformed JSON at line 3, column 7: syntax error while parsing object "
                "separator - unexpected number literal; expected ':'");
  // Trailing comma: the '}' on line 2, column 1.
  EXPECT_EQ(message_of([] {
              config("{\"a\": 1,\n}");
            }).rfind(kPath + ": malformed JSON at line 2, column 1: ", 0),
            0u);
  // Unterminated: the position just past the end.
  EXPECT_EQ(message_of([] {
              config("{\"a\": [1, 2");
            }).rfind(kPath + ": malformed JSON at line 1, column 12: ", 0),
            0u);
  const std::string empty = message_of([] { config(""); });
  EXPECT_EQ(empty.rfind(kPath + ": malformed JSON at line 1, column 1: ", 0), 0u) << empty;
  EXPECT_NE(empty.find("unexpected end of input"), std::string::npos) << empty;
}

// The parser quotes the token it gave up in ("last read: '...'"), as long as the file makes it;
// the message quotes it cut (found by fuzz/hf_config.cpp; a 4,197-byte message, reproducer
// tests/fixtures/bad/fuzz/hf_config-long-bad-string).
TEST(HfConfig, MalformedJsonQuotesTheBadTokenCut) {
  const std::string msg =
      message_of([] { config("{\"a\": \"" + std::string(100000, 'x') + "\\u\"}"); });
  EXPECT_EQ(msg.rfind(kPath + ": malformed JSON at line 1, column ", 0), 0u) << msg;
  EXPECT_NE(msg.find(R"(must be followed by 4 hex digits; last read: '\"xxx)"), std::string::npos)
      << msg;
  EXPECT_LT(msg.size(), 400u) << msg;
}

TEST(HfConfig, TopLevelMustBeAnObjectWithUniqueKeys) {
  EXPECT_EQ(message_of([] { config("[1]"); }),
            kPath + ": expected a JSON object at the top level, found an array of 1 items");
  EXPECT_EQ(message_of([] { config(R"({"a": 1, "b": {"c": 1, "c": 2}})"); }),
            kPath + ": duplicate key 'b.c'");
  EXPECT_EQ(message_of([] { config(R"({"a": 1, "a": 2})"); }), kPath + ": duplicate key 'a'");
  // The same key in sibling objects is fine.
  EXPECT_EQ(config(R"({"x": {"k": 1}, "y": [{"k": 2}, {"k": 3}]})").object("x").get_int("k"), 1);
}

TEST(HfConfig, ObjectsOfManyKeysParseInLinearithmicTime) {
  // 200k keys (2.6 MB): objects that kept file order made each insert a linear search, and a
  // 1 MB file of 125k keys took about 30 s; with sorted objects this takes well under a second.
  constexpr int kKeys = 200000;
  std::string text = "{\"hidden_size\": 8";
  for (int i = 0; i < kKeys; ++i) text += ",\"k" + std::to_string(i) + "\": 1";
  text += "}";
  const auto t0 = std::chrono::steady_clock::now();
  const HfConfig c = config(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(c.get_int("hidden_size"), 8);
  EXPECT_EQ(c.json().size(), kKeys + 1u);
  EXPECT_LT(seconds, 5.0) << "parsing " << kKeys << " keys took " << seconds << " s";
  // A duplicate among them is still found.
  text.back() = ',';
  text += "\"k1234\": 2}";
  EXPECT_EQ(message_of([&] { config(text); }), kPath + ": duplicate key 'k1234'");
}

TEST(HfConfig, LongKeysAreCutInMessages) {
  const std::string key(1 << 20, 'k');
  const std::string msg = message_of([&] { config("{\"" + key + "\": 1, \"" + key + "\": 2}"); });
  EXPECT_LT(msg.size(), 400u) << msg.substr(0, 400);
  EXPECT_NE(msg.find("... (1048576 bytes)"), std::string::npos) << msg.substr(0, 400);
}

TEST(HfConfig, FilesAndFolders) {
  TempDir dir;
  EXPECT_EQ(message_of([&] { HfConfig::open(dir.path()); }),
            dir.path() + ": no config.json in this folder");
  const std::string missing = dir.path() + "/missing.json";
  EXPECT_EQ(message_of([&] { HfConfig::open(missing); }),
            missing + ": cannot open: No such file or directory");
  const std::string text = "{\"hidden_size\": 8,\n \"x\": }";
  const std::string path = dir.write("config.json", std::vector<uint8_t>(text.begin(), text.end()));
  const std::string msg = message_of([&] { HfConfig::open(dir.path()); });
  EXPECT_EQ(msg.rfind(path + ": malformed JSON at line 2, column 7: ", 0), 0u) << msg;
}

TEST(HfConfig, TextPosition) {
  using json_io::text_position;
  const std::string_view t = "ab\ncd\n\nef";
  EXPECT_EQ(text_position(t, 0).line, 1u);
  EXPECT_EQ(text_position(t, 0).column, 1u);
  EXPECT_EQ(text_position(t, 2).column, 3u);  // the '\n' ends line 1
  EXPECT_EQ(text_position(t, 3).line, 2u);
  EXPECT_EQ(text_position(t, 3).column, 1u);
  EXPECT_EQ(text_position(t, 6).line, 3u);
  EXPECT_EQ(text_position(t, 8).line, 4u);
  EXPECT_EQ(text_position(t, 8).column, 2u);
  EXPECT_EQ(text_position(t, 100).line, 4u);  // clamped: just past the end
  EXPECT_EQ(text_position(t, 100).column, 3u);
}

}  // namespace
}  // namespace llmk
