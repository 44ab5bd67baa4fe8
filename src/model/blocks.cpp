#include "model/blocks.h"

#include "core/error.h"
#include "ops/ops.h"

namespace llmk {

void Projection::load(WeightLoader& loader, const std::vector<std::string>& weight_names,
                      const std::vector<Shape>& shapes,
                      const std::vector<std::string>& bias_names) {
  rows = 0;
  std::vector<Shape> bias_shapes;
  for (const Shape& s : shapes) {
    rows += s[0];
    bias_shapes.push_back({s[0]});
  }
  ws.clear();
  bs.clear();
  if (weight_names.size() == 1) {  // stored fused (Phi-3): used as it is, borrowed on the CPU
    w = loader.matrix(weight_names[0], shapes[0]);
    b = bias_names.empty() ? Tensor() : loader.optional_vector(bias_names[0], bias_shapes[0]);
    return;
  }
  if (loader.can_stack(weight_names)) {
    w = loader.stacked(weight_names, shapes);
    b = bias_names.empty() ? Tensor() : loader.stacked(bias_names, bias_shapes, /*is_bias=*/true);
    return;
  }
  w = b = Tensor();
  for (size_t i = 0; i < weight_names.size(); ++i) {
    ws.push_back(loader.matrix(weight_names[i], shapes[i]));
    bs.push_back(bias_names.empty() ? Tensor()
                                    : loader.optional_vector(bias_names[i], bias_shapes[i]));
  }
}

void Projection::apply(Tensor& out, const Tensor& x) const {
  if (ws.empty()) {
    ops::linear(out, x, w, bias());
    return;
  }
  int64_t at = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    Tensor cols = out.slice(1, at, at + ws[i].dim(0));
    ops::linear(cols, x, ws[i], bs[i].defined() ? &bs[i] : nullptr);
    at += ws[i].dim(0);
  }
}

void Projection::apply_gated(Tensor& out, const Tensor& x, ops::Activation act,
                             Tensor& scratch) const {
  if (ws.empty()) {
    ops::linear_gated(out, x, w, act, scratch, bias());
    return;
  }
  apply(scratch, x);
  const int64_t F = rows / 2;
  ops::gated_act(out, scratch.slice(1, 0, F), scratch.slice(1, F, 2 * F), act);
}

}  // namespace llmk
