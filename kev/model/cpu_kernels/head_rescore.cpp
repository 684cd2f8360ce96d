// The head's second pass (model/head_rescoring.py): the first pass gave every logit from int8 activations in two
// groups (w8a8_gemm.cpp's split: the outlier channels first, then the rest, each with its own step d); here each row
// keeps those values except where the exact head could be the row's maximum, which it recomputes exactly.
//
// Bound: a group's activations are rounded to within d/2 each, so logit v of the first pass is off the exact sum
// Σ_k x_k q_vk · s_v by at most s_v · (d0/2 · Σ_first |q_vk| + d1/2 · Σ_rest |q_vk|), plus the fp32 rounding of both
// sums (under c · ‖x‖₂ · s_v · ‖q_v‖₂ <= c · ‖x‖₂ · s_v · Σ_k |q_vk|). With m_v that bound rounded up, T = max_v
// (a_v − m_v) is at most the exact maximum, and a logit with a_v + m_v < T − slack is below it even after the exact
// head's bf16 rounding (slack = |T| / 64 + 10⁻³ exceeds two bf16 half-steps at T). The scans take each block of 16
// logits' largest margin first (a superset of blocks), then each logit's own within those. Every block holding a
// logit that is not below gets its exact values (linear_gemm.cpp's int8 tile: the bits the plain head gives). So each row's maximum,
// and the lowest index holding it, are the exact head's, while the rest of the row keeps int8-activation logits.
// Everything is per row: a row's result never depends on the others.
#pragma GCC optimize("fp-contract=off")

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kev {
namespace {

constexpr int64_t kCols = 16;

float abs_max(const at::BFloat16* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<float>(x[i])));
  return m;
}

// Per block of 16 logits, the row's margin: (h0 · b0 + h1 · b1) · (1 + 10⁻⁴) + 10⁻³ with b0, b1 the block's largest
// s_v · Σ |q_vk| over each group (the rounding term folded in: ‖q_v‖₂ <= Σ_k |q_vk|).
void block_margins(float h0, float h1, const float* b0, const float* b1, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) out[b] = ((h0 * b0[b]) + (h1 * b1[b])) * 1.0001f + 1e-3f;
}

// T = max over blocks of (the block's largest a_v − its margin): at most max_v (a_v − m_v), so at most the exact max.
float floor_of_max(const float* a, const float* margin, int64_t vocab) {
  float best = -INFINITY;
  const int64_t whole = vocab / kCols;
  int64_t b = 0;
#if defined(__AVX512F__)
  __m512 acc = _mm512_set1_ps(-INFINITY);
  for (; b < whole; ++b)
    acc = _mm512_max_ps(acc, _mm512_sub_ps(_mm512_loadu_ps(a + b * kCols), _mm512_set1_ps(margin[b])));
  best = _mm512_reduce_max_ps(acc);
#endif
  for (int64_t v = b * kCols; v < vocab; ++v) best = std::max(best, a[v] - margin[v / kCols]);
  return best;
}

// The blocks holding some a_v + margin >= floor, ascending.
void blocks_reaching(const float* a, const float* margin, int64_t vocab, float floor, std::vector<int64_t>& out) {
  out.clear();
  const int64_t whole = vocab / kCols;
  int64_t b = 0;
#if defined(__AVX512F__)
  for (; b < whole; ++b)
    if (_mm512_cmp_ps_mask(_mm512_loadu_ps(a + b * kCols), _mm512_set1_ps(floor - margin[b]), _CMP_GE_OQ))
      out.push_back(b);
#endif
  for (; b * kCols < vocab; ++b) {
    bool reaches = false;
    for (int64_t v = b * kCols; v < std::min(vocab, (b + 1) * kCols); ++v) reaches |= a[v] + margin[b] >= floor;
    if (reaches) out.push_back(b);
  }
}

// Of the tentative blocks (a superset), those holding a logit with a_v + m_v >= T − slack, where m_v is v's own
// margin and T = max (a_v − m_v) over their logits (no lower than the blocks' floor it refines).
void refine(const float* a, float h0, float h1, const float* e0, const float* e1, int64_t vocab,
            std::vector<int64_t>& blocks) {
  const auto margin = [&](int64_t v) { return ((h0 * e0[v]) + (h1 * e1[v])) * 1.0001f + 1e-3f; };
  float t = -INFINITY;
  for (const int64_t b : blocks)
    for (int64_t v = b * kCols; v < std::min(vocab, (b + 1) * kCols); ++v) t = std::max(t, a[v] - margin(v));
  const float floor = t - (std::fabs(t) / 64.0f + 1e-3f);
  size_t kept = 0;
  for (const int64_t b : blocks) {
    bool reaches = false;
    for (int64_t v = b * kCols; v < std::min(vocab, (b + 1) * kCols); ++v) reaches |= a[v] + margin(v) >= floor;
    if (reaches) blocks[kept++] = b;
  }
  blocks.resize(kept);
}

}  // namespace

// logits: fp32 [M, V], the first pass's (rewritten in place); x: bf16 [M, K], the head's input; grouped: x with its
// columns in the first pass's order (the first `first_k` of them the first group); packed, scale: the head's int8
// weight as linear() takes it; element_bounds: fp32 [2, V], s_v · Σ_first |q_vk| and s_v · Σ_rest |q_vk|; bounds:
// [2, blocks of 16 logits], each block's largest of those; rounding: c above. Returns the blocks recomputed (all
// rows).
int64_t head_rescore_(at::Tensor logits, const at::Tensor& x, const at::Tensor& grouped, int64_t first_k,
                      const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& bounds,
                      const at::Tensor& element_bounds, double rounding) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat,
              "kev::head_rescore_: logits must be a contiguous fp32 [rows, vocab] matrix");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 && x.size(0) == logits.size(0),
              "kev::head_rescore_: x must be contiguous bf16 [rows, K], a row per logits row");
  TORCH_CHECK(grouped.sizes() == x.sizes() && grouped.is_contiguous() && grouped.scalar_type() == at::kBFloat16 &&
                  first_k > 0 && first_k < x.size(1),
              "kev::head_rescore_: grouped must be x's shape and dtype, split by 0 < first_k < K");
  const int64_t rows = x.size(0), k = x.size(1), vocab = logits.size(1);
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 3 && packed.size(1) * 2 == k &&
                  packed.size(2) == 2 * kCols && packed.size(0) * kCols >= vocab,
              "kev::head_rescore_: packed must be the head's int8 packing [blocks, K/2, 32]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() >= packed.size(0) * kCols,
              "kev::head_rescore_: one fp32 scale per (padded) column");
  const int64_t blocks_per_row = (vocab + kCols - 1) / kCols;
  TORCH_CHECK(bounds.scalar_type() == at::kFloat && bounds.dim() == 2 && bounds.size(0) == 2 &&
                  bounds.size(1) == blocks_per_row && bounds.is_contiguous(),
              "kev::head_rescore_: bounds must be fp32 [2, blocks of 16 logits]");
  TORCH_CHECK(element_bounds.scalar_type() == at::kFloat && element_bounds.dim() == 2 && element_bounds.size(0) == 2 &&
                  element_bounds.size(1) == vocab && element_bounds.is_contiguous(),
              "kev::head_rescore_: element_bounds must be fp32 [2, vocab]");
  const auto* xp = x.data_ptr<at::BFloat16>();
  const auto* gp = grouped.data_ptr<at::BFloat16>();
  float* out = logits.data_ptr<float>();
  const float* lp = bounds.data_ptr<float>();
  const float* ep = element_bounds.data_ptr<float>();
  std::vector<int64_t> counts(rows);
  bool ok = true;
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> blocks;
    std::vector<float> margin(blocks_per_row);
    for (int64_t r = begin; r < end; ++r) {
      const at::BFloat16* g = gp + r * k;
      // The steps as w8a8_gemm.cpp's quantization takes them (max|x| / 127 of each group), halved.
      const float d0 = abs_max(g, first_k) / 127.0f, d1 = abs_max(g + first_k, k - first_k) / 127.0f;
      if (d0 == 0.0f && d1 == 0.0f) continue;  // a zero row (tile padding): both passes give zeros, all tied
      double norm = 0.0;
      for (int64_t i = 0; i < k; ++i) norm += static_cast<double>(static_cast<float>(xp[r * k + i])) * static_cast<float>(xp[r * k + i]);
      const float h = static_cast<float>(rounding * std::sqrt(norm));
      block_margins(d0 * 0.5f + h, d1 * 0.5f + h, lp, lp + blocks_per_row, blocks_per_row, margin.data());
      float* a = out + r * vocab;
      const float t = floor_of_max(a, margin.data(), vocab);
      blocks_reaching(a, margin.data(), vocab, t - (std::fabs(t) / 64.0f + 1e-3f), blocks);
      refine(a, d0 * 0.5f + h, d1 * 0.5f + h, ep, ep + vocab, vocab, blocks);
      counts[r] = static_cast<int64_t>(blocks.size());
      if (!int8_blocks_row(xp + r * k, packed.data_ptr<int8_t>(), scale.data_ptr<float>(), packed.size(1),
                           blocks.data(), counts[r], vocab, a))
        ok = false;
    }
  });
  TORCH_CHECK(ok, "kev::head_rescore_ needs the AVX-512 BF16 build of kev::linear");
  int64_t total = 0;
  for (const int64_t c : counts) total += c;
  return total;
}

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("head_rescore_(Tensor(a!) logits, Tensor x, Tensor grouped, int first_k, Tensor packed, Tensor scale, "
        "Tensor bounds, Tensor element_bounds, float rounding) -> int");
}

TORCH_LIBRARY_IMPL(kev, CPU, m) { m.impl("head_rescore_", &kev::head_rescore_); }
