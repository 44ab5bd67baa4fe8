// llmk serve: an OpenAI-compatible HTTP server on the many-sequence engine (engine/engine.h).
//
// HTTP threads (cpp-httplib's pool) only parse, check, enqueue and write; one engine thread owns
// the Engine: it takes new jobs, aborts cancelled ones, and steps while anything runs. A job's
// tokens reach its HTTP thread through the job's own mutex and condition variable, as text
// deltas (decoded incrementally, held back while they could still become a stop string or end in
// a partial UTF-8 sequence) and, at the end, the finish reason.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (streamed as server-sent events
// with "stream": true), GET /v1/models, GET /health, GET /metrics (Prometheus text). Errors are
// OpenAI's error object; a body that is not JSON (invalid UTF-8 included: the parser checks it),
// names a key twice in one object, or names a field not served is 400.
#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "apps/llmk/commands.h"
#include "core/error.h"
#include "core/text.h"
#include "engine/engine.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace llmk::cli {

namespace {

using json = nlohmann::ordered_json;

// An error answered to the client: HTTP status, OpenAI's type, the parameter at fault.
struct ApiError {
  int status;
  std::string message, type, param;
};
[[noreturn]] void bad(std::string message, std::string param = "") {
  throw ApiError{400, std::move(message), "invalid_request_error", std::move(param)};
}

std::string error_body(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", nullptr}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

struct ServeArgs {
  std::string model, device, host = "127.0.0.1", api_key, kv_memory, kv_dtype, dtype;
  bool batch_invariant = false;
  bool quantized = true;        // LoadOptions::quantized_weights
  bool host_embeddings = true;  // LoadOptions::host_embeddings
  bool cpu_int8 = false;        // cpu::set_int8_activations
  int port = 8080;
  int64_t ctx = 0, max_running = 64, max_queue = 256, step_tokens = 512, max_n = 16;
  int64_t max_body = 8 << 20, threads = 64;
};

// One sample's output as it grows.
struct Output {
  std::vector<int32_t> ids;
  std::string text;            // decoded so far (cut before a stop string)
  bool stale = false;          // ids has tokens text lacks: the HTTP thread decodes (text_of)
  size_t sent = 0;             // bytes of text already handed to the stream
  std::string finish;          // "" while running: "stop" or "length"
  std::vector<json> logprobs;  // per token, with logprobs
};

// One HTTP request in the engine.
struct Job {
  std::vector<int32_t> prompt;
  RequestOptions opts;
  std::vector<std::string> stop;
  bool chat = false;

  std::mutex m;
  std::condition_variable cv;
  std::vector<Output> outs;
  int running = 0;  // samples not finished
  std::string error;
  std::atomic<bool> cancelled{false};
  int64_t id = -1;  // the engine's (engine thread only)
  // Engine thread only: when it was queued, when its first token came, tokens since.
  std::chrono::steady_clock::time_point queued_at = std::chrono::steady_clock::now(), first_at;
  int64_t tokens = 0;
};

// A Prometheus histogram of seconds.
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts = std::vector<int64_t>(bounds.size() + 1, 0);
  double sum = 0;
  void add(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
  }
  void write(std::string& out, const char* name, const char* help) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    int64_t acc = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
      acc += counts[i];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds[i], acc);
    }
    acc += counts.back();
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, acc, name,
                       sum, name, acc);
  }
};

// What /metrics reports; guarded by Server::m_.
struct Metrics {
  std::map<int, int64_t> requests;  // by HTTP status
  int64_t prompt_tokens = 0, generated_tokens = 0, running = 0, queued = 0;
  KvPages::Stats kv;
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram tpot{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
};

// Memory freed after a burst of requests back to the system: glibc keeps freed heap memory for
// reuse (tens of MB after a thousand requests at once), so an idle server's resident size would
// stay at the burst's.
void release_free_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// cpp-httplib 0.11 listens with a backlog of 5: a burst of connections past that (a thousand
// clients at once) waits on SYN retransmits, and some are reset. listen() again on the bound
// socket deepens it (Linux caps it at net.core.somaxconn).
class HttpServer : public httplib::Server {
 public:
  bool deepen_backlog() { return ::listen(svr_sock_, SOMAXCONN) == 0; }
};

class Server {
 public:
  Server(const ServeArgs& a, Tokenizer tok, std::optional<ChatTemplate> tmpl,
         std::unique_ptr<Model> model, std::string model_id)
      : a_(a),
        tok_(std::move(tok)),
        tmpl_(std::move(tmpl)),
        model_(std::move(model)),
        engine_(*model_, {.max_running = a.max_running, .max_step_tokens = a.step_tokens}),
        model_id_(std::move(model_id)),
        eog_(tok_.end_of_generation_ids()) {}

  // Serves until stop(); returns false if it could not listen.
  bool run() {
    engine_thread_ = std::thread([this] { engine_loop(); });
    http_.new_task_queue = [this] {
      return new httplib::ThreadPool(static_cast<size_t>(a_.threads));
    };
    http_.set_payload_max_length(static_cast<size_t>(a_.max_body));
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (a_.api_key.empty() || req.path == "/health")
        return httplib::Server::HandlerResponse::Unhandled;
      const std::string want = "Bearer " + a_.api_key;
      const std::string got = req.get_header_value("Authorization");
      // Constant time in the key's length: every byte compared whatever the first difference.
      unsigned diff = got.size() != want.size() ? 1u : 0u;
      for (size_t i = 0; i < want.size(); ++i) {
        diff |= static_cast<unsigned char>(want[i]) ^
                static_cast<unsigned char>(i < got.size() ? got[i] : 0);
      }
      if (diff == 0) return httplib::Server::HandlerResponse::Unhandled;
      reply_error(res, {401, "missing or wrong API key (Authorization: Bearer KEY)",
                        "authentication_error", ""});
      return httplib::Server::HandlerResponse::Handled;
    });
    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json j = {{"object", "list"},
                {"data", json::array({{{"id", model_id_},
                                       {"object", "model"},
                                       {"created", started_},
                                       {"owned_by", "llmk"}}})}};
      res.set_content(j.dump(), "application/json");
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    for (const bool chat : {true, false}) {
      http_.Post(chat ? "/v1/chat/completions" : "/v1/completions",
                 [this, chat](const httplib::Request& req, httplib::Response& res) {
                   handle(req, res, chat);
                 });
    }
    http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error
      const int s = res.status;
      reply_error(res,
                  {s,
                   s == 404   ? fmt::format("no route {} {}", req.method, printable(req.path, 80))
                   : s == 413 ? "request body too large"
                              : fmt::format("HTTP {}", s),
                   s == 404 ? "not_found_error" : "invalid_request_error", ""});
      res.status = s;
    });
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      fmt::print(stderr, "[llmk serve] {} {} {}\n", req.method, printable(req.path, 80),
                 res.status);
      std::lock_guard<std::mutex> lk(m_);
      ++metrics_.requests[res.status];
    });
    bool ok = http_.bind_to_port(a_.host, a_.port);
    if (ok) {
      if (!http_.deepen_backlog()) {
        fmt::print(stderr, "[llmk serve] warning: cannot deepen the listen backlog: {}\n",
                   std::strerror(errno));
      }
      fmt::print(stderr, "[llmk serve] listening on http://{}:{} (model {})\n", a_.host, a_.port,
                 model_id_);
      ok = http_.listen_after_bind();
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    engine_thread_.join();
    return ok;
  }

  void stop() { http_.stop(); }

 private:
  static void reply_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
  }

  // The body as JSON: 400 where it is not, or where an object names a key twice (the parser would
  // keep the last silently). The parser's callback checks keys as they come, in the one pass.
  static json parse_json(const std::string& body) {
    struct Level {  // an object or array the parser is inside
      bool object;
      std::set<std::string> keys;  // (objects) keys seen
      const std::string* key;      // (objects) the last of them
      size_t index;                // (arrays) the element being parsed
    };
    std::vector<Level> levels;
    const auto path = [&levels] {  // of the innermost level, as "messages[0].content"
      std::string out;
      for (size_t i = 0; i + 1 < levels.size(); ++i) {
        const Level& l = levels[i];
        out += l.object ? fmt::format("{}{}", out.empty() ? "" : ".", printable(*l.key, 60))
                        : fmt::format("[{}]", l.index);
      }
      return out;
    };
    const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
      using E = json::parse_event_t;
      switch (event) {
        case E::object_start:
        case E::array_start:
          levels.push_back({event == E::object_start, {}, nullptr, 0});
          break;
        case E::key: {
          const auto [it, fresh] = levels.back().keys.insert(parsed.get<std::string>());
          if (!fresh) {
            const std::string at = path();
            const std::string key = printable(*it, 60);
            bad(fmt::format("duplicate key \"{}\" in {}", key, at.empty() ? "the body" : at),
                at.empty() ? key : at + "." + key);
          }
          levels.back().key = &*it;
          break;
        }
        case E::object_end:
        case E::array_end:
          levels.pop_back();
          [[fallthrough]];
        case E::value:
          if (!levels.empty() && !levels.back().object) ++levels.back().index;
          break;
      }
      return true;
    };
    try {
      return json::parse(body, check);
    } catch (const std::exception& e) {
      bad(fmt::format("the body is not valid JSON: {}", printable(e.what(), 120)));
    }
  }

  // A chat message's content: a string, or a list of content parts whose texts are joined in order
  // (parts of other types, images or audio, are not served). `at`: its path, "messages[0].content".
  static std::string content_text(const json& content, const std::string& at) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array() || content.empty()) {
      bad(fmt::format("\"{}\" must be a string or a non-empty list of content parts", at), at);
    }
    std::string text;
    for (size_t k = 0; k < content.size(); ++k) {
      const json& part = content[k];
      const std::string p = fmt::format("{}[{}]", at, k);
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
        bad(fmt::format("\"{}\" must be an object with a \"type\" (a string)", p), p);
      }
      const std::string type = part["type"].get<std::string>();
      if (type != "text") {
        bad(fmt::format("content part type \"{}\" is not supported (only \"text\")",
                        printable(type, 40)),
            p + ".type");
      }
      if (!part.contains("text") || !part["text"].is_string()) {
        bad("a \"text\" content part needs \"text\" (a string)", p + ".text");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }

  // The request's fields into a job (400 for anything unknown, mistyped or out of range).
  std::shared_ptr<Job> parse(const std::string& body, bool chat, bool& stream,
                             bool& include_usage) const {
    json j = parse_json(body);
    if (!j.is_object()) bad("the body must be a JSON object");
    static const std::set<std::string> common = {"model",
                                                 "max_tokens",
                                                 "temperature",
                                                 "top_p",
                                                 "top_k",
                                                 "min_p",
                                                 "n",
                                                 "stop",
                                                 "seed",
                                                 "presence_penalty",
                                                 "frequency_penalty",
                                                 "repetition_penalty",
                                                 "logprobs",
                                                 "stream",
                                                 "stream_options",
                                                 "user",
                                                 "ignore_eos"};
    static const std::set<std::string> chat_only = {"messages", "max_completion_tokens",
                                                    "top_logprobs"};
    static const std::set<std::string> completion_only = {"prompt", "echo"};
    for (const auto& [key, value] : j.items()) {
      if (common.count(key) || (chat ? chat_only : completion_only).count(key)) continue;
      bad(fmt::format("unsupported parameter \"{}\"", printable(key, 60)), key);
    }
    auto job = std::make_shared<Job>();
    job->chat = chat;
    RequestOptions& o = job->opts;
    SamplerConfig& c = o.sampler;
    // OpenAI's defaults: no truncation but top_p; temperature 1.
    c.temperature = 1.0f;
    c.top_k = 0;
    c.top_p = 1.0f;
    c.min_p = 0.0f;
    const auto number = [&](const char* key, auto& out, double lo, double hi) {
      if (!j.contains(key) || j[key].is_null()) return;
      const json& v = j[key];
      using T = std::remove_reference_t<decltype(out)>;
      constexpr bool integral = std::is_integral_v<T>;
      if (integral ? !v.is_number_integer() : !v.is_number()) {
        bad(fmt::format("\"{}\" must be {}", key, integral ? "an integer" : "a number"), key);
      }
      const double d = v.get<double>();
      if (!(d >= lo && d <= hi)) {
        bad(fmt::format("\"{}\" = {} is outside [{}, {}]", key, printable(v.dump(), 40), lo, hi),
            key);
      }
      out = integral ? static_cast<T>(v.get<int64_t>()) : static_cast<T>(d);
    };
    if (j.contains("model") && !j["model"].is_string()) bad("\"model\" must be a string", "model");
    if (j.contains("user") && !j["user"].is_string()) bad("\"user\" must be a string", "user");
    if (j.contains("model") && j["model"].get<std::string>() != model_id_) {
      throw ApiError{404,
                     fmt::format("model \"{}\" is not served here (this server: \"{}\")",
                                 printable(j["model"].get<std::string>(), 80), model_id_),
                     "not_found_error", "model"};
    }
    const auto ctx = static_cast<double>(model_->context());
    o.max_tokens = 16;
    if (chat) o.max_tokens = static_cast<int64_t>(ctx);
    number("max_tokens", o.max_tokens, 1, ctx);
    if (chat) number("max_completion_tokens", o.max_tokens, 1, ctx);
    number("temperature", c.temperature, 0, 2);
    number("top_p", c.top_p, 0, 1);
    if (c.top_p == 0.0f) c.temperature = 0.0f;  // nothing kept but the most likely
    number("top_k", c.top_k, 0, 1e9);
    number("min_p", c.min_p, 0, 0.999999);
    number("presence_penalty", c.presence_penalty, -2, 2);
    number("frequency_penalty", c.frequency_penalty, -2, 2);
    number("repetition_penalty", c.repeat_penalty, 1e-3, 100);
    number("n", o.n, 1, static_cast<double>(a_.max_n));
    if (j.contains("seed") && !j["seed"].is_null()) {
      if (!j["seed"].is_number_integer()) bad("\"seed\" must be an integer", "seed");
      c.seed = static_cast<uint64_t>(j["seed"].get<int64_t>());
    } else {
      c.seed = std::chrono::steady_clock::now().time_since_epoch().count();
    }
    if (j.contains("stop") && !j["stop"].is_null()) {
      const json& s = j["stop"];
      if (!s.is_string() && !s.is_array()) bad("\"stop\" must be a string or a list", "stop");
      const json list = s.is_string() ? json::array({s}) : s;
      if (list.size() > 4) bad("\"stop\" holds at most 4 strings", "stop");
      for (const json& v : list) {
        if (!v.is_string() || v.get<std::string>().empty()) {
          bad("\"stop\" must hold non-empty strings", "stop");
        }
        job->stop.push_back(v.get<std::string>());
      }
    }
    if (chat) {
      if (j.contains("logprobs") && !j["logprobs"].is_null()) {
        if (!j["logprobs"].is_boolean()) bad("\"logprobs\" must be true or false", "logprobs");
        o.logprobs = j["logprobs"].get<bool>();
      }
      number("top_logprobs", o.top_logprobs, 0, 20);
      if (o.top_logprobs > 0 && !o.logprobs) {
        bad("\"top_logprobs\" needs \"logprobs\": true", "top_logprobs");
      }
    } else if (j.contains("logprobs") && !j["logprobs"].is_null()) {
      number("logprobs", o.top_logprobs, 0, 20);
      o.logprobs = true;
    }
    stream = false;
    if (j.contains("stream") && !j["stream"].is_null()) {
      if (!j["stream"].is_boolean()) bad("\"stream\" must be true or false", "stream");
      stream = j["stream"].get<bool>();
    }
    include_usage = false;
    if (j.contains("stream_options") && !j["stream_options"].is_null()) {
      const json& so = j["stream_options"];
      if (!so.is_object()) bad("\"stream_options\" must be an object", "stream_options");
      for (const auto& [key, value] : so.items()) {
        if (key != "include_usage" || !value.is_boolean()) {
          bad("\"stream_options\" takes \"include_usage\": true or false", "stream_options");
        }
        include_usage = value.get<bool>();
      }
    }
    if (chat) {
      if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
        bad("\"messages\" must be a non-empty list", "messages");
      }
      if (j["messages"].size() > 1024) bad("at most 1024 messages", "messages");
      std::vector<ChatMessage> msgs;
      for (size_t i = 0; i < j["messages"].size(); ++i) {
        const json& m = j["messages"][i];
        const std::string at = fmt::format("messages[{}]", i);
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
            !m.contains("content")) {
          bad("each message needs \"role\" (a string) and \"content\"", at);
        }
        const std::string role = m["role"].get<std::string>();
        if (role != "system" && role != "user" && role != "assistant") {
          bad(fmt::format("message role \"{}\" is not system, user or assistant",
                          printable(role, 40)),
              at + ".role");
        }
        msgs.push_back({role, content_text(m["content"], at + ".content")});
      }
      if (!tmpl_) bad("this model has no chat template: use /v1/completions", "messages");
      job->prompt = tok_.encode(tmpl_->apply(msgs, true), tok_.add_bos(), /*parse_special=*/true);
    } else {
      if (!j.contains("prompt")) bad("\"prompt\" is required", "prompt");
      const json& p = j["prompt"];
      if (p.is_string()) {
        if (p.get<std::string>().empty()) bad("\"prompt\" is empty", "prompt");
        job->prompt = tok_.encode(p.get<std::string>(), tok_.add_bos(), false);
      } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
        for (const json& t : p) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
              t.get<int64_t>() >= model_->config().vocab_size) {
            bad("\"prompt\" token ids must be integers inside the vocabulary", "prompt");
          }
          job->prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
      } else {
        bad("\"prompt\" must be a string or a list of token ids", "prompt");
      }
      if (j.contains("echo") && !j["echo"].is_null() &&
          (!j["echo"].is_boolean() || j["echo"].get<bool>())) {
        bad("\"echo\" is not supported", "echo");
      }
    }
    if (job->prompt.empty()) bad("the prompt is empty", chat ? "messages" : "prompt");
    const auto plen = static_cast<int64_t>(job->prompt.size());
    if (plen >= model_->context()) {
      bad(fmt::format("the prompt has {} tokens; the context holds {}", plen, model_->context()),
          chat ? "messages" : "prompt");
    }
    o.max_tokens = std::min<int64_t>(o.max_tokens, model_->context() - plen);
    o.stop_ids = eog_;
    if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) {  // vLLM's: for benchmarks
      if (!j["ignore_eos"].is_boolean()) bad("\"ignore_eos\" must be true or false", "ignore_eos");
      if (j["ignore_eos"].get<bool>()) o.stop_ids.clear();
    }
    job->outs.resize(static_cast<size_t>(o.n));
    job->running = o.n;
    return job;
  }

  // Into the engine thread's queue; 429 when it is full.
  void submit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (static_cast<int64_t>(incoming_.size()) + running_jobs_ >= a_.max_queue + a_.max_running) {
        throw ApiError{429, "the server is busy: too many requests queued", "rate_limit_error", ""};
      }
      incoming_.push_back(job);
    }
    cv_.notify_all();
  }

  // A client gone: the engine thread ends its job at its next turn.
  void cancel(Job& job) {
    job.cancelled = true;
    {
      std::lock_guard<std::mutex> lk(m_);
      cancel_pending_ = true;
    }
    cv_.notify_all();
  }

  // The engine's callback for one token of one sample (engine thread).
  bool on_token(Job& job, const TokenEvent& e) {
    std::lock_guard<std::mutex> lk(job.m);
    Output& x = job.outs[static_cast<size_t>(e.sample)];
    if (job.cancelled.load()) {  // the client is gone: this sample ends here
      if (x.finish.empty()) {
        x.finish = "cancelled";
        --job.running;
      }
      return false;
    }
    bool go_on = true;
    if (e.finish == Finish::Stop) {  // an end-of-generation token: not part of the text
      x.finish = "stop";
    } else {
      x.ids.push_back(e.token);
      // The engine thread decodes only where a stop string needs the text now; else the HTTP
      // thread does, when it next looks (text_of), off the engine's path.
      if (job.stop.empty()) {
        x.stale = true;
      } else {
        x.text = tok_.decode(x.ids);
      }
      if (job.opts.logprobs) {
        json top = json::array();
        for (const auto& [id, lp] : e.top) {
          top.push_back({{"token", tok_.decode(std::vector<int32_t>{id})}, {"logprob", lp}});
        }
        x.logprobs.push_back({{"token", tok_.decode(std::vector<int32_t>{e.token})},
                              {"logprob", e.logprob},
                              {"top_logprobs", top}});
      }
      for (const std::string& s : job.stop) {
        const size_t at = x.text.find(s);
        if (at != std::string::npos) {
          x.text.resize(at);
          x.finish = "stop";
          go_on = false;
        }
      }
      if (x.finish.empty() && e.finish == Finish::Length) x.finish = "length";
    }
    if (!x.finish.empty()) --job.running;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> mk(m_);  // (job.m, then m_: never the other way)
      ++metrics_.generated_tokens;
      if (job.tokens++ == 0) {
        job.first_at = now;
        metrics_.ttft.add(std::chrono::duration<double>(now - job.queued_at).count());
      } else if (job.running == 0) {
        metrics_.tpot.add(std::chrono::duration<double>(now - job.first_at).count() /
                          static_cast<double>(job.tokens - 1));
      }
    }
    job.cv.notify_all();
    return go_on && !job.cancelled.load();
  }

  std::string metrics_text() {
    std::lock_guard<std::mutex> lk(m_);
    const Metrics& m = metrics_;
    std::string out;
    out += "# HELP llmk_requests_total HTTP requests answered, by status.\n";
    out += "# TYPE llmk_requests_total counter\n";
    for (const auto& [status, n] : m.requests) {
      out += fmt::format("llmk_requests_total{{status=\"{}\"}} {}\n", status, n);
    }
    const auto one = [&](const char* name, const char* type, const char* help, int64_t v) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
    };
    one("llmk_prompt_tokens_total", "counter", "Prompt tokens of the requests taken.",
        m.prompt_tokens);
    one("llmk_generation_tokens_total", "counter", "Tokens generated.", m.generated_tokens);
    one("llmk_requests_running", "gauge", "Requests in the engine.", m.running);
    one("llmk_requests_queued", "gauge", "Requests waiting for the engine thread.", m.queued);
    one("llmk_kv_pages", "gauge", "Pages of the KV cache pool.", m.kv.pages);
    one("llmk_kv_pages_used", "gauge", "KV pages held by a sequence.", m.kv.in_use);
    one("llmk_kv_pages_shared", "gauge", "KV pages held by more than one sequence.", m.kv.shared);
    one("llmk_kv_pages_cached", "gauge", "KV pages kept for prefix hits.", m.kv.cached);
    one("llmk_preemptions_total", "counter", "Sequences preempted when the pool ran out.",
        preemptions_);
    m.ttft.write(out, "llmk_time_to_first_token_seconds",
                 "From a request's arrival to its first token.");
    m.tpot.write(out, "llmk_time_per_output_token_seconds",
                 "A sample's time from its first to its last token, per token after the first.");
    return out;
  }

  void engine_loop() {
    std::vector<std::shared_ptr<Job>> live;
    bool stepped = false;  // since memory was last handed back
    for (;;) {
      std::vector<std::shared_ptr<Job>> fresh;
      {
        std::unique_lock<std::mutex> lk(m_);
        const auto ready = [&] {
          return stopping_ || cancel_pending_ || !incoming_.empty() || !engine_.idle();
        };
        if (!stepped) {
          cv_.wait(lk, ready);
        } else if (!cv_.wait_for(lk, std::chrono::seconds(1), ready)) {  // idle a second
          lk.unlock();
          release_free_memory();
          stepped = false;
          continue;
        }
        if (stopping_ && engine_.idle() && incoming_.empty()) break;
        cancel_pending_ = false;
        fresh.assign(incoming_.begin(), incoming_.end());
        incoming_.clear();
      }
      for (const auto& job : fresh) {
        try {
          job->id = engine_.add_request(
              job->prompt, job->opts,
              [this, j = job.get()](const TokenEvent& e) { return on_token(*j, e); });
          live.push_back(job);
          std::lock_guard<std::mutex> lk(m_);
          metrics_.prompt_tokens += static_cast<int64_t>(job->prompt.size());
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lk(job->m);
          job->error = e.what();
          job->running = 0;
          job->cv.notify_all();
        }
      }
      for (const auto& job : live) {  // a client gone: its pages freed now
        if (job->cancelled.load()) {
          engine_.abort(job->id);  // (false where its callback already ended its samples)
          std::lock_guard<std::mutex> lk(job->m);
          job->running = 0;
          job->cv.notify_all();
        }
      }
      if (!engine_.idle()) {
        stepped = true;
        try {
          engine_.step();
        } catch (const std::exception& e) {
          fmt::print(stderr, "[llmk serve] engine step failed: {}\n", e.what());
          for (const auto& job : live) {
            engine_.abort(job->id);
            std::lock_guard<std::mutex> lk(job->m);
            job->error = e.what();
            job->running = 0;
            job->cv.notify_all();
          }
        }
      }
      std::erase_if(live, [](const std::shared_ptr<Job>& j) {
        std::lock_guard<std::mutex> lk(j->m);
        return j->running == 0;
      });
      std::lock_guard<std::mutex> lk(m_);
      running_jobs_ = static_cast<int64_t>(live.size());
      metrics_.running = running_jobs_;
      metrics_.queued = static_cast<int64_t>(incoming_.size());
      metrics_.kv = engine_.kv_stats();
      preemptions_ = engine_.scheduler_stats().preemptions;
    }
  }

  // x's text, decoded up to its last token (the job's lock held).
  const std::string& text_of(Output& x) const {
    if (x.stale) {
      x.text = tok_.decode(x.ids);
      x.stale = false;
    }
    return x.text;
  }

  json usage(const Job& job) const {
    int64_t out = 0;
    for (const Output& x : job.outs) out += static_cast<int64_t>(x.ids.size());
    const auto in = static_cast<int64_t>(job.prompt.size());
    return {{"prompt_tokens", in}, {"completion_tokens", out}, {"total_tokens", in + out}};
  }

  json choice(const Job& job, size_t i, const std::string& text, const std::string& finish,
              const std::vector<json>* lps, bool delta) const {
    json c = {{"index", i}};
    if (job.chat) {
      c[delta ? "delta" : "message"] =
          delta ? (text.empty() ? json::object() : json{{"content", text}})
                : json{{"role", "assistant"}, {"content", text}};
    } else {
      c["text"] = text;
    }
    if (lps != nullptr) {
      c["logprobs"] = job.chat ? json{{"content", *lps}} : json{{"tokens", *lps}};
    } else {
      c["logprobs"] = nullptr;
    }
    c["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
    return c;
  }

  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    bool stream = false, include_usage = false;
    std::shared_ptr<Job> job;
    // The connection's socket, to watch for its client leaving; looked up before the job is
    // submitted, while the client surely waits (once it has gone its peer cannot be read).
    int sock = -1;
    try {
      job = parse(req.body, chat, stream, include_usage);
      sock = connection_socket(req);
      submit(job);
    } catch (const ApiError& e) {
      reply_error(res, e);
      if (e.status == 429) res.set_header("Retry-After", "1");
      return;
    } catch (const std::exception& e) {
      reply_error(res, {400, e.what(), "invalid_request_error", ""});
      return;
    }
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_++);
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    const char* object =
        chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    const auto head = [this, id, created, object] {
      return json{{"id", id}, {"object", object}, {"created", created}, {"model", model_id_}};
    };
    if (!stream) {
      // A client gone before its answer: its job cancelled (its pages freed) as for a stream.
      std::unique_lock<std::mutex> lk(job->m);
      while (!job->cv.wait_for(lk, std::chrono::milliseconds(100),
                               [&] { return job->running == 0; })) {
        if (peer_closed(sock)) {
          lk.unlock();
          cancel(*job);
          reply_error(res, {499, "the client closed the connection", "client_closed", ""});
          return;
        }
      }
      if (!job->error.empty()) {
        reply_error(res, {500, job->error, "server_error", ""});
        return;
      }
      json j = head();
      j["choices"] = json::array();
      for (size_t i = 0; i < job->outs.size(); ++i) {
        Output& x = job->outs[i];
        j["choices"].push_back(choice(*job, i, text_of(x), x.finish.empty() ? "length" : x.finish,
                                      job->opts.logprobs ? &x.logprobs : nullptr, false));
      }
      j["usage"] = usage(*job);
      res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    auto first = std::make_shared<bool>(true);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, head, first, include_usage, sock](size_t, httplib::DataSink& sink) {
          const auto send = [&](const json& j) {
            const std::string s =
                "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          std::vector<json> chunks;
          bool done = false;
          {
            std::unique_lock<std::mutex> lk(job->m);
            // What of x may go out now: its text up to a held-back tail while it runs.
            const auto ready_of = [&](Output& x) {
              text_of(x);
              return x.finish.empty() ? safe_prefix(x.text, job->stop) : x.text.size();
            };
            job->cv.wait_for(lk, std::chrono::milliseconds(200), [&] {
              if (job->running == 0) return true;
              for (Output& x : job->outs) {
                if (x.sent != SIZE_MAX && (ready_of(x) > x.sent || !x.finish.empty())) return true;
              }
              return false;
            });
            if (*first && job->chat) {
              for (size_t i = 0; i < job->outs.size(); ++i) {
                json c = {{"index", i},
                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}};
                json j = head();
                j["choices"] = json::array({c});
                chunks.push_back(j);
              }
            }
            *first = false;
            for (size_t i = 0; i < job->outs.size(); ++i) {
              Output& x = job->outs[i];
              const size_t ready = ready_of(x);
              if (ready > x.sent || (!x.finish.empty() && x.sent != SIZE_MAX)) {
                const std::string delta =
                    x.text.substr(x.sent, ready > x.sent ? ready - x.sent : 0);
                x.sent = x.finish.empty() ? ready : SIZE_MAX;  // SIZE_MAX: the finish is sent
                json j = head();
                j["choices"] = json::array(
                    {choice(*job, i, delta, x.finish.empty() ? "" : x.finish, nullptr, true)});
                chunks.push_back(j);
              }
            }
            done = job->running == 0;
            if (done && !job->error.empty()) {
              chunks.push_back(json::parse(error_body({500, job->error, "server_error", ""})));
            }
            if (done && include_usage) {
              json j = head();
              j["choices"] = json::array();
              j["usage"] = usage(*job);
              chunks.push_back(j);
            }
          }
          // A stream with nothing to send (queued behind others) looks at its client between
          // waits: one gone cancels the job, as a failed write does once tokens flow.
          if (chunks.empty() && !done && peer_closed(sock)) {
            cancel(*job);
            return false;
          }
          for (const json& j : chunks) {
            if (!send(j)) {
              cancel(*job);
              return false;
            }
          }
          if (done) {
            static const std::string kDone = "data: [DONE]\n\n";
            sink.write(kDone.data(), kDone.size());
            sink.done();
          }
          return true;
        },
        [this, job](bool success) {
          if (!success) cancel(*job);
        });
  }

  // The socket of req's connection, or -1. cpp-httplib 0.11 hands a handler no socket (later
  // versions: Request::is_connection_closed), so it is found among the process's descriptors by
  // the connection's two ends: a getpeername per descriptor, once per request.
  static int connection_socket(const httplib::Request& req) {
    // The address at one end of socket fd, if it is port `port` (the ip as cpp-httplib writes it).
    const auto end_at = [](int fd, bool peer, int port, std::string& ip) {
      sockaddr_storage a{};
      socklen_t n = sizeof(a);
      auto* sa = reinterpret_cast<sockaddr*>(&a);
      if ((peer ? getpeername(fd, sa, &n) : getsockname(fd, sa, &n)) != 0) return false;
      const int at = a.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(sa)->sin_port)
                     : a.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(sa)->sin6_port)
                         : -1;
      char host[NI_MAXHOST];
      if (at != port || getnameinfo(sa, n, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
        return false;
      }
      ip = host;
      return true;
    };
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int found = -1;
    std::string ip;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const int fd = std::atoi(e->d_name);
      if (end_at(fd, true, req.remote_port, ip) && ip == req.remote_addr &&
          end_at(fd, false, req.local_port, ip) && ip == req.local_addr) {
        found = fd;
        break;
      }
    }
    closedir(dir);
    return found;
  }

  // Whether the client at the other end of `sock` has closed it (or reset it, or shut its sending
  // side, which no client still waiting for its answer does).
  static bool peer_closed(int sock) {
    if (sock < 0) return false;
    pollfd p{sock, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

  // How much of `text` may go out while the sample runs: not a tail that could still grow into a
  // stop string, nor an unfinished UTF-8 sequence (the replacement character decode gives it).
  static size_t safe_prefix(const std::string& text, const std::vector<std::string>& stops) {
    size_t n = text.size();
    for (const std::string& s : stops) {
      for (size_t k = std::min(s.size() - 1, text.size()); k > 0; --k) {
        if (text.compare(text.size() - k, k, s, 0, k) == 0) {
          n = std::min(n, text.size() - k);
          break;
        }
      }
    }
    static const std::string kReplacement = "\xEF\xBF\xBD";
    if (n >= 3 && text.compare(n - 3, 3, kReplacement) == 0) n -= 3;
    return n;
  }

  ServeArgs a_;
  Tokenizer tok_;
  std::optional<ChatTemplate> tmpl_;
  std::unique_ptr<Model> model_;
  Engine engine_;
  std::string model_id_;
  std::vector<int32_t> eog_;
  HttpServer http_;
  std::thread engine_thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> incoming_;
  int64_t running_jobs_ = 0;
  bool stopping_ = false;
  bool cancel_pending_ = false;  // some job was cancelled since the engine thread last looked
  Metrics metrics_;
  int64_t preemptions_ = 0;
  std::atomic<int64_t> next_id_{0};
  int64_t started_ = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
};

Server* g_server = nullptr;
extern "C" void on_signal(int) {
  if (g_server != nullptr) g_server->stop();
}

// Each connection holds a descriptor: a soft limit of 1024 (a common default) would refuse
// clients past a thousand or so. Raised to the hard limit, as the Go runtime does.
void raise_descriptor_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

int run_serve(const ServeArgs& a) {
  raise_descriptor_limit();
  const Device device = resolve_device(a.device);
  const Tokenizer tok = load_tokenizer(a.model);
  std::optional<ChatTemplate> tmpl;
  try {
    tmpl = chat_template_for(load_config(a.model), tok, a.model);
  } catch (const Error&) {  // no template: completions only
  }
  fmt::print(stderr, "[llmk serve] loading {} ...\n", a.model);
  cpu::set_int8_activations(a.cpu_int8);
  // (ctx 0: the model's context, at most 4096.)
  const std::optional<DType> dtype = parse_dtype(a.dtype, device);
  auto model = Engine::load(a.model, a.ctx, a.max_running, 16, device, parse_kv_memory(a.kv_memory),
                            parse_kv_type(a.kv_dtype, device, dtype), dtype, a.batch_invariant,
                            a.quantized, a.host_embeddings);
  std::string id = a.model;
  while (!id.empty() && id.back() == '/') id.pop_back();
  id = id.substr(id.find_last_of('/') + 1);
  Server server(a, tok, std::move(tmpl), std::move(model), id);
  g_server = &server;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const bool ok = server.run();
  g_server = nullptr;
  LLMK_CHECK(ok, "llmk serve: cannot listen on {}:{}", a.host, a.port);
  fmt::print(stderr, "[llmk serve] stopped\n");
  return 0;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  add_model_option(*cmd, a->model);
  cmd->add_option("--host", a->host, "Address to listen on")->default_val("127.0.0.1");
  cmd->add_option("--port", a->port, "Port")->check(in_range(1, 65535))->default_val(8080);
  add_device_option(*cmd, a->device);
  add_dtype_option(*cmd, a->dtype);
  add_quantized_weights_flag(*cmd, a->quantized);
  add_gpu_embeddings_flag(*cmd, a->host_embeddings);
  add_cpu_int8_flag(*cmd, a->cpu_int8);
  add_batch_invariant_flag(*cmd, a->batch_invariant);
  cmd->add_option("--api-key", a->api_key,
                  "Require 'Authorization: Bearer KEY' on every request but /health");
  cmd->add_option("--max-running", a->max_running, "Sequences in flight")
      ->check(in_range(1, 4096))
      ->default_val(64);
  cmd->add_option("--max-queue", a->max_queue,
                  "Requests waiting beyond those running; more get 429")
      ->check(in_range(0, 1 << 20))
      ->default_val(256);
  cmd->add_option("--max-n", a->max_n, "Largest n (samples per request) accepted")
      ->check(in_range(1, 1024))
      ->default_val(16);
  cmd->add_option("--ctx", a->ctx, "Context length (tokens); default: the model's, at most 4096")
      ->check(in_range(0, 1 << 24));
  cmd->add_option("--kv-memory", a->kv_memory,
                  "KV cache size in GiB, or 'free' (the GPU's free memory); default: "
                  "--max-running contexts");
  add_kv_dtype_option(*cmd, a->kv_dtype);
  cmd->add_option("--threads", a->threads, "HTTP threads (each streaming request holds one)")
      ->check(in_range(1, 4096))
      ->default_val(64);
  return [a] { return run_serve(*a); };
}

}  // namespace llmk::cli
