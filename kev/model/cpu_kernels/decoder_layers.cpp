// Every Llama-shaped decoder layer of a step in one op: the same kernels, in the same order, as the
// Python layer loop (kev/model/llama.py), so the bits are the same; what goes is Python's per-op cost
// (about 270 op calls a step), which at a lone question's decode is a quarter of the step.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops.h"

#include <vector>

namespace kev {

// A linear of either kernel: Kev's GEMM, or the quantized one (uint8 cells, cpu_kernels/quant_gemm.cpp: core.precision
// gguf / w8a8) in x's dtype, as its Python caller asks for it (QuantWeight.__call__).
static at::Tensor any_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b,
                             const c10::optional<at::Tensor>& s, int64_t out_features) {
  if (w.scalar_type() == at::kByte) return quant_linear(x, w, s, b, out_features, 0, true);
  return linear(x, w, b, s, out_features);
}

// One linear's weights: usually one, or row parts of different block types side by side (QuantRows: a Q4_K_M
// file's q/k/v), each with its bias, scale and out_features; a column's value is its own part's alone.
struct LinearParts {
  const at::Tensor* w;
  const c10::optional<at::Tensor>* b;
  const c10::optional<at::Tensor>* s;
  const int64_t* n;
  int64_t count;

  at::Tensor operator()(const at::Tensor& x) const {
    if (count == 1) return any_linear(x, w[0], b[0], s[0], n[0]);
    std::vector<at::Tensor> outs;
    for (int64_t i = 0; i < count; ++i) outs.push_back(any_linear(x, w[i], b[i], s[i], n[i]));
    return at::cat(outs, 1);
  }
};

// weights: per layer [input norm, qkv, o, post-attention norm, gate_up, down], each linear as its parts (count in
// `parts`, 4 per layer; linears packed by model/linear.py's GemmWeight or quant_weight.py's QuantWeight); biases,
// scales (int8 weights' per-column scales) and out_features: one per linear part, in the same order.
// caches: one [2, slots, kv_heads, dim] tensor per layer.
// x: the residual stream, updated in place; pending: the previous layer's MLP output not yet added.
// Returns the last layer's pending MLP output.
at::Tensor decoder_layers(
    at::Tensor x, const std::vector<at::Tensor>& weights, const std::vector<c10::optional<at::Tensor>>& biases,
    const std::vector<c10::optional<at::Tensor>>& scales, const std::vector<at::Tensor>& caches,
    const std::vector<int64_t>& parts, const std::vector<int64_t>& out_features, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& token_rows, const at::Tensor& slot_mapping,
    const c10::optional<at::Tensor>& padding_rows, const at::Tensor& rows, const at::Tensor& kv_slots,
    const at::Tensor& starts, const at::Tensor& lengths, int64_t heads, int64_t kv_heads, int64_t dim, double eps,
    double scale) {
  const size_t layers = caches.size();
  size_t wi = 0, pi = 0, li = 0;  // cursors: weights, linear parts, linears
  int64_t total = 0;
  for (int64_t count : parts) total += count;
  TORCH_CHECK(parts.size() == 4 * layers && weights.size() == 2 * layers + static_cast<size_t>(total) &&
                  biases.size() == static_cast<size_t>(total) && scales.size() == biases.size() &&
                  out_features.size() == biases.size(),
              "decoder_layers: 4 linears a layer, 2 norms and each linear's parts as weights, a bias, scale and "
              "out_features per part");
  const auto next_linear = [&]() {
    const int64_t count = parts[li++];
    const LinearParts p{weights.data() + wi, biases.data() + pi, scales.data() + pi, out_features.data() + pi, count};
    wi += count, pi += count;
    return p;
  };
  const int64_t num_rows = x.size(0);
  at::Tensor pending;
  for (size_t i = 0; i < layers; ++i) {
    const at::Tensor& input_norm = weights[wi++];
    const LinearParts qkv_proj = next_linear(), o_proj = next_linear();
    const at::Tensor& post_norm = weights[wi++];
    const LinearParts gate_up = next_linear(), down = next_linear();
    at::Tensor h = pending.defined() ? add_rms_norm(pending, x, input_norm, eps) : rms_norm(x, input_norm, eps);
    at::Tensor qkv = qkv_proj(h);
    rope_store_kv_(qkv, caches[i], cos, sin, positions, token_rows, slot_mapping, heads, kv_heads, dim);
    at::Tensor q = qkv.narrow(1, 0, heads * dim).view({num_rows, heads, dim});
    at::Tensor attended = at::empty({num_rows, heads, dim}, x.options());
    if (padding_rows) attended.index_fill_(0, *padding_rows, 0);  // rows no channel owns
    paged_attention(q, caches[i], attended, rows, kv_slots, starts, lengths, scale);
    at::Tensor out = o_proj(attended.view({num_rows, heads * dim}));
    h = add_rms_norm(out, x, post_norm, eps);
    pending = down(silu_mul(gate_up(h)));
  }
  return pending;
}

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("decoder_layers(Tensor(a!) x, Tensor[] weights, Tensor?[] biases, Tensor?[] scales, Tensor(b!)[] caches, "
        "int[] parts, int[] out_features, "
        "Tensor cos, Tensor sin, Tensor positions, Tensor token_rows, Tensor slot_mapping, Tensor? padding_rows, "
        "Tensor rows, Tensor kv_slots, Tensor starts, Tensor lengths, int heads, int kv_heads, int dim, float eps, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(kev, CPU, m) { m.impl("decoder_layers", &kev::decoder_layers); }
