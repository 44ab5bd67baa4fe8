// The attention dispatch counters (ops::attention_stats) as one line for `llmk run --stats` and
// `llmk bench`.
#include <fmt/format.h>

#include "apps/llmk/commands.h"
#include "ops/ops.h"

namespace llmk::cli {

std::string attention_stats_line() {
  const ops::AttentionStats s = ops::attention_stats();
  return fmt::format(
      "attention calls: prefill {}, decode {}, chunked {}, fallback {}, cpu {} (a CUDA-graph step "
      "counts once, when captured; its replays are not counted)",
      s.prefill, s.decode, s.chunked, s.fallback, s.cpu);
}

}  // namespace llmk::cli
