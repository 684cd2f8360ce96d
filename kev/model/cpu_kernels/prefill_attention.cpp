// Prefill attention for the CPU (bf16): flash-style, over each channel's own paged keys, at any chunk length.
//
// A task is (channel, kv head, tile of 16 query rows): the rows' G query heads attend to the channel's keys
// in key tiles of 32 counted from position 0, with an online softmax; dot products are `vdpbf16ps` on bf16
// pairs into fp32 accumulators. Why a row's bits never depend on the chunking or on the other channels:
// every row walks the same key tiles 0, 1, ... up to the tile holding its own position, always from
// position 0 and in that order; a tile starting past the row's position is skipped for that row (its
// state is untouched), keys past its position inside its last tile get probability 0; and each output
// lane is one fp32 accumulator summed in the fixed order of the tile's keys. Which rows share the task,
// how many rows the chunk has and which thread runs it change none of that.
//
// Keys are first copied out of the paged cache per (channel, kv head, key tile) into the layouts the dot
// products want: K as [dim/2][32 keys] dim pairs, V as [16 key pairs][dim] key pairs. Positions past
// the channel's context are zeros, never whatever an unwritten slot holds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace kev {

#if defined(__AVX512BF16__)
namespace {

constexpr int64_t kKeyTile = 32;  // keys per tile: two zmm of scores per query vector
constexpr int64_t kRowTile = 16;  // query rows per task
constexpr int kScoreRows = 12;    // query vectors per score block: 24 accumulators

struct Span {
  int64_t q_start, q_len, ctx_len, slot_offset, packed_offset;  // packed_offset: in tiles, over kv heads
};

// exp on zmm lanes: kev::exp_approx's range reduction and polynomial (vec_math.h), with its clamps.
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(12582912.0f)),
                                 _mm512_set1_ps(12582912.0f));
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.3981999507e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh&>(x); }

// One key tile of one (channel, kv head) into the dot-product layouts.
template <int DIM>
void pack_tile(const uint16_t* k_ptr, const uint16_t* v_ptr, const int64_t* slots, int64_t kv_heads, int64_t kv_head,
               int64_t first, int64_t ctx_len, uint32_t* kp, uint32_t* vp) {
  const uint16_t* keys[kKeyTile];
  const uint16_t* values[kKeyTile];
  for (int64_t i = 0; i < kKeyTile; ++i) {
    const bool real = first + i < ctx_len;
    const int64_t at = real ? (slots[first + i] * kv_heads + kv_head) * DIM : 0;
    keys[i] = real ? k_ptr + at : nullptr;
    values[i] = real ? v_ptr + at : nullptr;
  }
  for (int64_t i = 0; i < kKeyTile; ++i) {  // kp[dp][i]: key i's dims (2dp, 2dp + 1)
    if (keys[i] == nullptr) {
      for (int dp = 0; dp < DIM / 2; ++dp) kp[dp * kKeyTile + i] = 0;
      continue;
    }
    uint32_t pairs[DIM / 2];
    std::memcpy(pairs, keys[i], sizeof(pairs));
    for (int dp = 0; dp < DIM / 2; ++dp) kp[dp * kKeyTile + i] = pairs[dp];
  }
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t tp = 0; tp < kKeyTile / 2; ++tp) {  // vp[tp][d]: dim d of keys (2tp, 2tp + 1)
    for (int d = 0; d < DIM; d += 16) {
      const __m512i a = values[2 * tp] == nullptr ? zero : _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values[2 * tp] + d)));
      const __m512i b = values[2 * tp + 1] == nullptr ? zero : _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values[2 * tp + 1] + d)));
      _mm512_storeu_si512(vp + tp * DIM + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
  }
}

// Scores of MR query vectors against one packed key tile: s[m][32], each lane one fp32 sum over the dim
// pairs in order.
template <int DIM, int MR>
inline void scores_block(const uint32_t* const* q, const uint32_t* kp, float* s) {
  __m512 lo[MR], hi[MR];
  for (int m = 0; m < MR; ++m) lo[m] = hi[m] = _mm512_setzero_ps();
  for (int dp = 0; dp < DIM / 2; ++dp) {
    const __m512bh k0 = as_bh(_mm512_loadu_si512(kp + dp * kKeyTile));
    const __m512bh k1 = as_bh(_mm512_loadu_si512(kp + dp * kKeyTile + 16));
    for (int m = 0; m < MR; ++m) {
      const __m512bh qm = as_bh(_mm512_set1_epi32(static_cast<int>(q[m][dp])));
      lo[m] = _mm512_dpbf16_ps(lo[m], qm, k0);
      hi[m] = _mm512_dpbf16_ps(hi[m], qm, k1);
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm512_storeu_ps(s + m * kKeyTile, lo[m]);
    _mm512_storeu_ps(s + m * kKeyTile + 16, hi[m]);
  }
}

template <int DIM, int MR>
inline void scores_rest(int n, const uint32_t* const* q, const uint32_t* kp, float* s) {
  if constexpr (MR > 0) {
    if (n == MR) return scores_block<DIM, MR>(q, kp, s);
    scores_rest<DIM, MR - 1>(n, q, kp, s);
  }
}

// o[m] = o[m] * alpha[m] + p[m] · V over one packed value tile (p: 16 key pairs of bf16 per vector).
template <int DIM, int MR>
inline void values_block(const uint32_t* p, const float* alpha, const uint32_t* vp, float* o) {
  constexpr int kVec = DIM / 16;
  __m512 acc[MR][kVec];
  for (int m = 0; m < MR; ++m) {
    const __m512 a = _mm512_set1_ps(alpha[m]);
    for (int v = 0; v < kVec; ++v) acc[m][v] = _mm512_mul_ps(_mm512_loadu_ps(o + m * DIM + 16 * v), a);
  }
  for (int tp = 0; tp < kKeyTile / 2; ++tp) {
    __m512bh x[kVec];
    for (int v = 0; v < kVec; ++v) x[v] = as_bh(_mm512_loadu_si512(vp + tp * DIM + 16 * v));
    for (int m = 0; m < MR; ++m) {
      const __m512bh pm = as_bh(_mm512_set1_epi32(static_cast<int>(p[m * (kKeyTile / 2) + tp])));
      for (int v = 0; v < kVec; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], pm, x[v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVec; ++v) _mm512_storeu_ps(o + m * DIM + 16 * v, acc[m][v]);
}

template <int DIM, int MR>
inline void values_rest(int n, const uint32_t* p, const float* alpha, const uint32_t* vp, float* o) {
  if constexpr (MR > 0) {
    if (n == MR) return values_block<DIM, MR>(p, alpha, vp, o);
    values_rest<DIM, MR - 1>(n, p, alpha, vp, o);
  }
}

// Online-softmax state of one query vector: running max, per-lane sums, and this tile's rescale.
struct RowState {
  float top;
  float alpha;
  __m512 sum;
};

// Scores -> bf16 probabilities (p) for one vector over one tile; `visible` keys of the tile are
// at or before its position.
inline void softmax_tile(const float* s, int64_t visible, float scale, RowState& st, uint32_t* p) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __mmask16 m0 = visible >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << visible) - 1u);
  const __mmask16 m1 = visible >= 32 ? 0xFFFF : (visible <= 16 ? 0 : static_cast<__mmask16>((1u << (visible - 16)) - 1u));
  const __m512 sc = _mm512_set1_ps(scale);
  const __m512 s0 = _mm512_mask_mul_ps(neg_inf, m0, _mm512_loadu_ps(s), sc);
  const __m512 s1 = _mm512_mask_mul_ps(neg_inf, m1, _mm512_loadu_ps(s + 16), sc);
  const float top = std::max(st.top, _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
  // alpha exactly 1 where the max holds (x * 1 is exact), 0 on the first tile (nothing to rescale)
  st.alpha = top == st.top ? 1.0f : (st.top == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                                      : exp512(_mm512_set1_ps(st.top - top))[0]);
  st.top = top;
  const __m512 t = _mm512_set1_ps(top);
  const __m512 p0 = _mm512_maskz_mov_ps(m0, exp512(_mm512_sub_ps(s0, t)));
  const __m512 p1 = _mm512_maskz_mov_ps(m1, exp512(_mm512_sub_ps(s1, t)));
  const __m512bh pb = _mm512_cvtne2ps_pbh(p1, p0);  // keys 0..15 from p0, 16..31 from p1, in order
  _mm512_storeu_si512(p, reinterpret_cast<const __m512i&>(pb));
  // the sum of the probabilities as rounded for the value products
  const __m512i words = reinterpret_cast<const __m512i&>(pb);
  const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
  const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  st.sum = _mm512_fmadd_ps(st.sum, _mm512_set1_ps(st.alpha), _mm512_add_ps(even, odd));
}

template <int DIM>
struct Task {
  // inputs
  const uint16_t* q_ptr;
  int64_t q_row_stride, heads, group;
  const uint32_t* kp_tiles;  // this (channel, kv head)'s packed tiles
  const uint32_t* vp_tiles;
  float scale;
  // scratch, reused across a thread's tasks
  std::vector<const uint32_t*> q;
  std::vector<float> s, o;
  std::vector<uint32_t> p;
  std::vector<RowState> state;
  std::vector<float> alpha;

  void run(const Span& span, int64_t kv_head, int64_t row0, uint16_t* out_ptr) {
    const int64_t rows = std::min(kRowTile, span.q_len - row0), g = group, vectors = rows * g;
    const int64_t first_pos = span.ctx_len - span.q_len + row0;  // position of the task's first row
    q.resize(vectors);
    s.resize(vectors * kKeyTile);
    o.assign(vectors * DIM, 0.0f);
    p.resize(vectors * kKeyTile / 2);
    state.assign(vectors, RowState{-std::numeric_limits<float>::infinity(), 0.0f, _mm512_setzero_ps()});
    alpha.resize(vectors);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < g; ++j)
        q[r * g + j] = reinterpret_cast<const uint32_t*>(
            q_ptr + (span.q_start + row0 + r) * q_row_stride + (kv_head * g + j) * DIM);
    const int64_t last_tile = (first_pos + rows - 1) / kKeyTile;
    for (int64_t tile = 0; tile <= last_tile; ++tile) {
      // the rows this tile is visible to: those at or after its first key (a suffix of the task's rows)
      const int64_t first_row = std::max<int64_t>(0, tile * kKeyTile - first_pos), v0 = first_row * g;
      const uint32_t* kp = kp_tiles + tile * (DIM / 2) * kKeyTile;
      const uint32_t* vp = vp_tiles + tile * (kKeyTile / 2) * DIM;
      for (int64_t m = v0; m < vectors; m += kScoreRows)
        scores_rest<DIM, kScoreRows>(static_cast<int>(std::min<int64_t>(kScoreRows, vectors - m)), q.data() + m, kp,
                                     s.data() + m * kKeyTile);
      for (int64_t m = v0; m < vectors; ++m) {
        const int64_t visible = first_pos + m / g - tile * kKeyTile + 1;
        softmax_tile(s.data() + m * kKeyTile, visible, scale, state[m], p.data() + m * kKeyTile / 2);
        alpha[m] = state[m].alpha;
      }
      constexpr int kValueRows = DIM == 64 ? 6 : (DIM == 128 ? 2 : 1);
      for (int64_t m = v0; m < vectors; m += kValueRows)
        values_rest<DIM, kValueRows>(static_cast<int>(std::min<int64_t>(kValueRows, vectors - m)),
                                     p.data() + m * kKeyTile / 2, alpha.data() + m, vp, o.data() + m * DIM);
    }
    for (int64_t m = 0; m < vectors; ++m) {
      const float inverse = 1.0f / _mm512_reduce_add_ps(state[m].sum);
      const __m512 inv = _mm512_set1_ps(inverse);
      uint16_t* dst = out_ptr + ((span.q_start + row0 + m / g) * heads + kv_head * g + m % g) * DIM;
      for (int d = 0; d < DIM; d += 16) {
        const __m256bh b = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o.data() + m * DIM + d), inv));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), reinterpret_cast<const __m256i&>(b));
      }
    }
  }
};

template <int DIM>
void run_prefill(const at::Tensor& q, const at::Tensor& kv, at::Tensor& out, const std::vector<Span>& spans,
                 const int64_t* slots, int64_t total_tiles, double scale) {
  const int64_t heads = q.size(1), kv_heads = kv.size(2), num_slots = kv.size(1), group = heads / kv_heads;
  const uint16_t* k_ptr = reinterpret_cast<const uint16_t*>(kv.data_ptr<at::BFloat16>());
  const uint16_t* v_ptr = k_ptr + num_slots * kv_heads * DIM;
  constexpr int64_t kTileWords = kKeyTile * DIM / 2;  // one packed K (or V) tile, in 32-bit words
  std::vector<uint32_t> kp(total_tiles * kv_heads * kTileWords), vp(total_tiles * kv_heads * kTileWords);
  // packing: one task per (channel, kv head, key tile)
  std::vector<int64_t> tile_owner;  // packed tile index -> span (tiles of one span are consecutive per head)
  for (size_t i = 0; i < spans.size(); ++i) {
    const int64_t tiles = (spans[i].ctx_len + kKeyTile - 1) / kKeyTile;
    tile_owner.insert(tile_owner.end(), tiles, static_cast<int64_t>(i));
  }
  at::parallel_for(0, total_tiles * kv_heads, 8, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv_head = task / total_tiles, flat = task % total_tiles;
      const Span& span = spans[tile_owner[flat]];
      const int64_t tile = flat - span.packed_offset;
      const int64_t at = (kv_head * total_tiles + flat) * kTileWords;
      pack_tile<DIM>(k_ptr, v_ptr, slots + span.slot_offset, kv_heads, kv_head, tile * kKeyTile, span.ctx_len,
                     kp.data() + at, vp.data() + at);
    }
  });
  // attention: one task per (channel, kv head, row tile); a channel's row tiles are ordered first, last,
  // second, second-to-last, ... so that equal-length halves of the task list carry equal causal work.
  std::vector<std::array<int64_t, 3>> tasks;
  for (size_t i = 0; i < spans.size(); ++i) {
    const int64_t n = (spans[i].q_len + kRowTile - 1) / kRowTile;
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t k = 0; k < n; ++k) {
        const int64_t tile = k % 2 == 0 ? k / 2 : n - 1 - k / 2;
        tasks.push_back({static_cast<int64_t>(i), h, tile * kRowTile});
      }
  }
  uint16_t* out_ptr = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const uint16_t* q_ptr = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    Task<DIM> task{q_ptr, q.stride(0), heads, group, nullptr, nullptr, static_cast<float>(scale), {}, {}, {}, {}, {}, {}};
    for (int64_t i = begin; i < end; ++i) {
      const auto [index, kv_head, row0] = tasks[i];
      const Span& span = spans[index];
      const int64_t at = (kv_head * total_tiles + span.packed_offset) * kTileWords;
      task.kp_tiles = kp.data() + at;
      task.vp_tiles = vp.data() + at;
      task.run(span, kv_head, row0, out_ptr);
    }
  });
}

}  // namespace
#endif

bool prefill_attention_supported() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// q: [rows, heads, dim] bf16 (rows may be strided); kv: [2, slots, kv_heads, dim]; out: [rows, heads, dim].
// spans: [n, 4] int64 (q_start, q_len, ctx_len, slot_offset): rows q_start .. q_start + q_len - 1 are the
// chunk's last q_len positions of a context of ctx_len keys at slots[slot_offset : slot_offset + ctx_len].
void prefill_attention(const at::Tensor& q, const at::Tensor& kv, at::Tensor out, const at::Tensor& spans,
                       const at::Tensor& slots, double scale) {
  TORCH_CHECK(prefill_attention_supported(), "prefill_attention: built without AVX-512 BF16");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && kv.scalar_type() == at::kBFloat16 &&
                  out.scalar_type() == at::kBFloat16, "prefill_attention: bf16 only");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && kv.is_contiguous() && out.is_contiguous(),
              "prefill_attention: heads of a row contiguous, kv and out contiguous");
  TORCH_CHECK(q.size(1) % kv.size(2) == 0, "prefill_attention: heads must be a multiple of kv heads");
  TORCH_CHECK(spans.dim() == 2 && spans.size(1) == 4 && spans.scalar_type() == at::kLong && spans.is_contiguous(),
              "prefill_attention: spans [n, 4] int64");
#if defined(__AVX512BF16__)
  const int64_t* info = spans.data_ptr<int64_t>();
  std::vector<Span> list;
  int64_t total_tiles = 0;
  for (int64_t i = 0; i < spans.size(0); ++i) {
    const Span span{info[4 * i], info[4 * i + 1], info[4 * i + 2], info[4 * i + 3], total_tiles};
    TORCH_CHECK(span.q_len >= 1 && span.q_len <= span.ctx_len, "prefill_attention: 1 <= q_len <= ctx_len");
    total_tiles += (span.ctx_len + kKeyTile - 1) / kKeyTile;
    list.push_back(span);
  }
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  switch (q.size(2)) {
    case 64: run_prefill<64>(q, kv, out, list, slot_ptr, total_tiles, scale); break;
    case 128: run_prefill<128>(q, kv, out, list, slot_ptr, total_tiles, scale); break;
    default: TORCH_CHECK(false, "prefill_attention: head_dim 64 or 128, not ", q.size(2));
  }
#endif
}

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("prefill_attention(Tensor q, Tensor kv, Tensor(a!) out, Tensor spans, Tensor slots, float scale) -> ()");
  m.def("prefill_attention_supported() -> bool", &kev::prefill_attention_supported);
}

TORCH_LIBRARY_IMPL(kev, CPU, m) { m.impl("prefill_attention", &kev::prefill_attention); }
