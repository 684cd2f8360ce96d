// Every Llama-shaped decoder layer of a step in one op: the same kernels, in the same order, as the
// Python layer loop (kev/model/llama.py), so the bits are the same; what goes is Python's per-op cost
// (about 270 op calls a step), which at a lone question's decode is a quarter of the step.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops.h"

#include <vector>

namespace kev {

// A linear of either kernel: Kev's GEMM, or the quantized one (uint8 cells, kernels/quant_gemm.cpp: core.precision
// gguf / w8a8), whose fp32 result is rounded to x's dtype exactly as its Python caller does (QuantWeight.__call__).
static at::Tensor any_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b,
                             const c10::optional<at::Tensor>& s, int64_t out_features) {
  if (w.scalar_type() == at::kByte) return quant_linear(x, w, s, b, out_features, 0).to(x.scalar_type());
  return linear(x, w, b, s, out_features);
}

// weights: per layer [input norm, qkv, o, post-attention norm, gate_up, down] (linears packed by
// model/linear.py's GemmWeight); biases, scales (int8 weights' per-column scales): per layer one per linear
// [qkv, o, gate_up, down];
// out_features: [qkv, o, gate_up, down]; caches: one [2, slots, kv_heads, dim] tensor per layer.
// x: the residual stream, updated in place; pending: the previous layer's MLP output not yet added.
// Returns the last layer's pending MLP output.
at::Tensor decoder_layers(
    at::Tensor x, const std::vector<at::Tensor>& weights, const std::vector<c10::optional<at::Tensor>>& biases,
    const std::vector<c10::optional<at::Tensor>>& scales, const std::vector<at::Tensor>& caches, const std::vector<int64_t>& out_features, const at::Tensor& cos,
    const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& token_rows, const at::Tensor& slot_mapping,
    const c10::optional<at::Tensor>& padding_rows, const at::Tensor& rows, const at::Tensor& kv_slots,
    const at::Tensor& starts, const at::Tensor& lengths, int64_t heads, int64_t kv_heads, int64_t dim, double eps,
    double scale) {
  const size_t layers = caches.size();
  TORCH_CHECK(weights.size() == 6 * layers && biases.size() == 4 * layers && scales.size() == 4 * layers && out_features.size() == 4,
              "decoder_layers: 6 weights, 4 biases and 4 scales per layer, 4 out_features");
  const int64_t num_rows = x.size(0);
  at::Tensor pending;
  for (size_t i = 0; i < layers; ++i) {
    const at::Tensor* w = weights.data() + 6 * i;
    const c10::optional<at::Tensor>* b = biases.data() + 4 * i;
    const c10::optional<at::Tensor>* s = scales.data() + 4 * i;
    at::Tensor h = pending.defined() ? add_rms_norm(pending, x, w[0], eps) : rms_norm(x, w[0], eps);
    at::Tensor qkv = any_linear(h, w[1], b[0], s[0], out_features[0]);
    rope_store_kv_(qkv, caches[i], cos, sin, positions, token_rows, slot_mapping, heads, kv_heads, dim);
    at::Tensor q = qkv.narrow(1, 0, heads * dim).view({num_rows, heads, dim});
    at::Tensor attended = at::empty({num_rows, heads, dim}, x.options());
    if (padding_rows) attended.index_fill_(0, *padding_rows, 0);  // rows no channel owns
    paged_attention(q, caches[i], attended, rows, kv_slots, starts, lengths, scale);
    at::Tensor out = any_linear(attended.view({num_rows, heads * dim}), w[2], b[1], s[1], out_features[1]);
    h = add_rms_norm(out, x, w[3], eps);
    pending = any_linear(silu_mul(any_linear(h, w[4], b[2], s[2], out_features[2])), w[5], b[3], s[3], out_features[3]);
  }
  return pending;
}

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("decoder_layers(Tensor(a!) x, Tensor[] weights, Tensor?[] biases, Tensor?[] scales, Tensor(b!)[] caches, int[] out_features, "
        "Tensor cos, Tensor sin, Tensor positions, Tensor token_rows, Tensor slot_mapping, Tensor? padding_rows, "
        "Tensor rows, Tensor kv_slots, Tensor starts, Tensor lengths, int heads, int kv_heads, int dim, float eps, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(kev, CPU, m) { m.impl("decoder_layers", &kev::decoder_layers); }
