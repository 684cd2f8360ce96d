// core.precision w8a8 as vLLM, oneDNN and SmoothQuant run it: y = x Wᵀ (+ b) with int8 weights (one fp32 scale per
// output column) times int8 activations (one fp32 scale per row, i.e. per token), ONE exact int32 sum over all of K
// and one fp32 step per output. A row's bits depend on that row alone: at every M, every thread count, every path.
//
// Activations: each row on its own, dx = max|x| / 127, q = round-to-nearest-even(x · (1 / dx)) (|q| <= 127), the
// same IEEE operations as torch's reference (model/quant_weight.py's quantize_per_row), and the row's sum Σq.
// Weights (model/quant_weight.py's pack_w8a8): cells of 16 output columns × 64 k, each 1,024 bytes: 16 steps of 4 k,
// a step's 64 bytes the 16 columns × 4 consecutive k, each weight stored as w + 128 (an unsigned byte; K padded to
// 64 with w = 0). That is at once an AMX B tile (16 rows of 64 bytes) and 16 vpdpbusd operands.
// One output element (row m, column n):
//   isum = Σ_k q[m,k] · (w[n,k] + 128) − 128 · Σ_k q[m,k]     (exact int32: |isum| < 2^31 for K < 66,000)
//   y = (float(isum) · scale[n]) · dx[m]  (+ bias[n])          (each · and + one IEEE fp32 operation, never fused)
// isum is an integer, so whichever instructions produce it (AMX tdpbsud tiles, AVX-512 VNNI vpdpbusd, plain C++,
// float64 matmul in torch's reference) it is the same number, and the fp32 steps are the same: the same bits on
// every path, at every M and thread count, by construction.
//
// Two scales (`split` > 0, the head's first pass, model/head_rescoring.py): the first `split` cells of K (64 k each)
// and the rest are quantized as two rows of their own, with dx0, Σq0 and dx1, Σq1, and summed apart:
//   y = (float(isum0) · scale[n]) · dx0[m] + (float(isum1) · scale[n]) · dx1[m]  (+ bias[n])
// so a few outlier channels placed first no longer set the step of all the others. AVX-512 VNNI and plain C++ only.
//
// Paths: AMX (Sapphire Rapids and later: amx_tile + amx_int8, and Linux's permission for the tile state, asked once
// per process), AVX-512 VNNI, AVX2 (vpmaddubsw, exact by the sign trick below), and plain C++; the best present is
// chosen at run time, tests force each.
#pragma GCC optimize("fp-contract=off")

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"
#include "vec_avx2.h"
#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KEV_W8_X86 1
#else
#define KEV_W8_X86 0
#endif
#if KEV_W8_X86 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define KEV_W8_VNNI 1
#else
#define KEV_W8_VNNI 0
#endif
// AMX code is compiled for its own target (function attributes) whatever -march says, and run only where the CPU
// and the kernel allow it; it needs the AVX-512 epilogue too.
#if KEV_W8_VNNI && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define KEV_W8_AMX 1
#define KEV_AMX_TARGET __attribute__((target("amx-tile,amx-int8")))
#else
#define KEV_W8_AMX 0
#endif

namespace kev {
namespace {

constexpr int64_t kCols = 16;        // output columns per cell
constexpr int64_t kTileK = 64;       // k per cell (an AMX tile row of bytes)
constexpr int64_t kCellBytes = 1024; // 16 steps × 16 columns × 4 k
constexpr int64_t kTileRows = 16;    // rows of an AMX A / C tile
enum Path : int64_t { kAuto = 0, kVnni = 1, kPlain = 2, kAmx = 3, kAvx2 = 4 };

typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;

struct Aligned {
  void operator()(void* p) const { std::free(p); }
};

// The rows quantized, per row dx and the integer sums' starting value −128·Σq. q is blocked as AMX A tiles: per
// group of 16 rows (fewer when the call has fewer), per 64 k, the group's rows' 64 bytes one after another, so a
// tile is 1 KiB read at stride 64 (a row-major stride of K bytes, a power of two for most models, would put a
// tile's 16 rows in the same few L1 sets). Rows past `rows` and k past K are 0.
struct Acts {
  int64_t rows = 0, padded = 0, group = 0, kt = 0;
  std::unique_ptr<int8_t, Aligned> q, qa;  // qa: |q| (the AVX2 path's), or none
  std::vector<float> dx, dx1;          // dx1, start1: the second group's (split > 0 only)
  std::vector<int32_t> start, start1;
  int64_t split = 0;                   // cells of K in the first group; 0: one group
  // Row m's first 64 k; its next 64 k are kTileK · group bytes further.
  const int8_t* row(int64_t m) const { return q.get() + (m / group) * group * kt * kTileK + (m % group) * kTileK; }
  int64_t tile_stride() const { return group * kTileK; }
};

// q: the row's first byte; k i lands at q + (i / 64) · stride + i % 64.
template <class T>
void quantize_plain(const T* x, int64_t k, int8_t* q, int64_t stride, float& dx, int32_t& start) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int32_t v = static_cast<int32_t>(std::nearbyint(static_cast<float>(x[i]) * id));
    q[i / kTileK * stride + i % kTileK] = static_cast<int8_t>(v), sum += v;
  }
  dx = d, start = -128 * sum;
}

#if KEV_W8_VNNI
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const at::BFloat16* p, __mmask16 m) {  // bf16 to fp32 is exact: the 16 bits above 16 zero bits
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __mmask16 mask_of(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}
// The same operations as quantize_plain, 16 lanes at a time (masked lanes read 0: no effect on the max or the sum).
template <class T>
void quantize_vector(const T* x, int64_t k, int8_t* q, int64_t stride, float& dx, int32_t& start) {
  __m512 vmax = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(load16(x + i, mask_of(k - i))));
  const float d = _mm512_reduce_max_ps(vmax) / 127.0f;
  const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = mask_of(k - i);
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(load16(x + i, m), id));  // round-to-nearest-even
    _mm_mask_storeu_epi8(q + i / kTileK * stride + i % kTileK, m, _mm512_cvtepi32_epi8(v));
    sum = _mm512_add_epi32(sum, v);
  }
  dx = d, start = -128 * _mm512_reduce_add_epi32(sum);
}
#endif

#if KEV_AVX2
// quantize_plain's operations 8 lanes at a time (|x| max, one IEEE reciprocal, products rounded to nearest even by
// vcvtps2dq under the default rounding mode); a tail of K past a multiple of 8 takes the scalar steps.
template <class T>
void quantize_avx2(const T* x, int64_t k, int8_t* q, int64_t stride, float& dx, int32_t& start) {
  const int64_t k8 = k / 8 * 8;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int64_t i = 0; i < k8; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, load8(x + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float amax = 0.0f;
  for (float v : lanes) amax = std::max(amax, v);
  for (int64_t i = k8; i < k; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
  const float d = amax / 127.0f;
  const float idf = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 id = _mm256_set1_ps(idf);
  __m256i sum = _mm256_setzero_si256();
  for (int64_t i = 0; i < k8; i += 8) {
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + i), id));
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));  // |v| <= 127
    const __m128i w8 = _mm_packs_epi16(w16, w16);
    std::memcpy(q + i / kTileK * stride + i % kTileK, &w8, 8);  // 8 k never cross a 64-k tile (8 divides 64)
    sum = _mm256_add_epi32(sum, v);
  }
  alignas(32) int32_t sums[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums), sum);
  int32_t total = 0;
  for (int32_t v : sums) total += v;
  for (int64_t i = k8; i < k; ++i) {
    const int32_t v = static_cast<int32_t>(std::nearbyint(static_cast<float>(x[i]) * idf));
    q[i / kTileK * stride + i % kTileK] = static_cast<int8_t>(v), total += v;
  }
  dx = d, start = -128 * total;
}
#endif

// One row's quants at q (k i at q + (i / 64) · stride + i % 64), with the path's quantization.
template <class T>
void quantize_row(const T* x, int64_t k, int8_t* q, int64_t stride, float& dx, int32_t& start, bool vector) {
#if KEV_W8_VNNI
  if (vector) return quantize_vector(x, k, q, stride, dx, start);
#elif KEV_AVX2
  if (vector) return quantize_avx2(x, k, q, stride, dx, start);
#endif
  (void)vector;
  quantize_plain(x, k, q, stride, dx, start);
}

// absolute: also |q| (AVX2's unsigned side), at the same offsets in a.qa.
Acts quantize(const at::Tensor& x, int64_t kt, bool vector, bool absolute = false, int64_t split = 0) {
  const int64_t rows = x.size(0), k = x.size(1);
  Acts a;
  a.rows = rows, a.kt = kt, a.split = split;
  a.group = std::min(rows, kTileRows);
  a.padded = (rows + a.group - 1) / a.group * a.group;  // whole AMX tiles
  const int64_t bytes = std::max<int64_t>(64, a.padded * kt * kTileK);
  a.q.reset(static_cast<int8_t*>(std::aligned_alloc(64, bytes)));
  if (absolute) a.qa.reset(static_cast<int8_t*>(std::aligned_alloc(64, bytes)));
  a.dx.resize(rows), a.start.resize(rows);
  if (split) a.dx1.resize(rows), a.start1.resize(rows);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xf = bf16 || x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const int64_t stride = a.tile_stride();
  at::parallel_for(0, a.padded, 8, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      int8_t* q = const_cast<int8_t*>(a.row(m));
      if (m >= rows) {
        for (int64_t t = 0; t < kt; ++t) std::memset(q + t * stride, 0, kTileK);
      } else {
        if (k % kTileK) std::memset(q + (kt - 1) * stride + k % kTileK, 0, kTileK - k % kTileK);
        const int64_t k0 = split ? split * kTileK : k;  // the first group's k (all of K without a split)
        const auto groups = [&](auto* xm) {
          quantize_row(xm, k0, q, stride, a.dx[m], a.start[m], vector);
          if (split) quantize_row(xm + k0, k - k0, q + split * stride, stride, a.dx1[m], a.start1[m], vector);
        };
        if (bf16) groups(xf.data_ptr<at::BFloat16>() + m * k);
        else groups(xf.data_ptr<float>() + m * k);
      }
      if (!absolute) continue;
      int8_t* qa = a.qa.get() + (q - a.q.get());
      for (int64_t t = 0; t < kt; ++t)
        for (int64_t i = 0; i < kTileK; ++i) qa[t * stride + i] = static_cast<int8_t>(std::abs(q[t * stride + i]));
    }
  });
  return a;
}

struct Weights {
  const uint8_t* cells;  // [blocks][kt][1024]
  const float* scale;    // padded to whole blocks
  const float* bias;     // padded, or null
  int64_t kt, blocks, out_features;
  const uint8_t* cell(int64_t block, int64_t t) const { return cells + (block * kt + t) * kCellBytes; }
};

// Where the results go: fp32, or bf16 rounded as they are stored (vec_math.h's round_to_bf16: torch's .to() bits).
struct Out {
  float* fp32;
  uint16_t* bf16;
  void store(int64_t at, float v) const {
    if (bf16) round_to_bf16(&v, bf16 + at, 1, 1, 0, 1);
    else fp32[at] = v;
  }
};

// The fp32 step of one element: y = (float(isum) · scale[n]) · dx[m] (+ bias[n]); with a split, raw0 and raw1 are
// the two groups' sums.
inline float finish_one(const Weights& w, const Acts& a, int64_t m, int64_t n, int32_t raw0, int32_t raw1) {
  float v = (static_cast<float>(raw0 + a.start[m]) * w.scale[n]) * a.dx[m];
  if (a.split) v = v + (static_cast<float>(raw1 + a.start1[m]) * w.scale[n]) * a.dx1[m];
  return w.bias ? v + w.bias[n] : v;
}

void plain_chunk(const Weights& w, const Acts& a, int64_t b0, int64_t b1, const Out& out) {
  for (int64_t block = b0; block < b1; ++block)
    for (int64_t m = 0; m < a.rows; ++m) {
      int32_t acc[kCols] = {}, first[kCols] = {};
      for (int64_t t = 0; t < w.kt; ++t) {
        if (t == a.split && t > 0) std::memcpy(first, acc, sizeof acc), std::memset(acc, 0, sizeof acc);
        const uint8_t* c = w.cell(block, t);
        const int8_t* x = a.row(m) + t * a.tile_stride();
        for (int s = 0; s < 16; ++s)
          for (int col = 0; col < kCols; ++col)
            for (int i = 0; i < 4; ++i) acc[col] += static_cast<int32_t>(c[s * 64 + col * 4 + i]) * x[s * 4 + i];
      }
      for (int col = 0; col < kCols && block * kCols + col < w.out_features; ++col)
        out.store(m * w.out_features + block * kCols + col,
                  a.split ? finish_one(w, a, m, block * kCols + col, first[col], acc[col])
                          : finish_one(w, a, m, block * kCols + col, acc[col], 0));
    }
}

#if KEV_W8_VNNI
// 16 columns of row m from their raw int32 sums (with a split: `first`, the first group's, and raw the second's).
inline void finish16(const Weights& w, const Acts& a, int64_t m, int64_t block, __m512i raw, const Out& out,
                     const __m512i* first = nullptr) {
  const int64_t col = block * kCols;
  const __m512 scale = _mm512_loadu_ps(w.scale + col);
  __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(first ? *first : raw, _mm512_set1_epi32(a.start[m])));
  v = _mm512_mul_ps(v, scale);
  v = _mm512_mul_ps(v, _mm512_set1_ps(a.dx[m]));
  if (first) {
    __m512 v1 = _mm512_cvtepi32_ps(_mm512_add_epi32(raw, _mm512_set1_epi32(a.start1[m])));
    v1 = _mm512_mul_ps(_mm512_mul_ps(v1, scale), _mm512_set1_ps(a.dx1[m]));
    v = _mm512_add_ps(v, v1);
  }
  if (w.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(w.bias + col));
  const int64_t at = m * w.out_features + col;
  if (!out.bf16) return _mm512_mask_storeu_ps(out.fp32 + at, mask_of(w.out_features - col), v);
  const __m512i u = _mm512_castps_si512(v);  // round_to_bf16 on 16 lanes
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i bits = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(out.bf16 + at, mask_of(w.out_features - col), _mm512_cvtepi32_epi16(bits));
}

// acc += 4-byte dot products of u (unsigned) and s (signed) per lane: vpdpbusd in inline asm, since GCC 12 copies
// the intrinsic's accumulator between registers at every use (a third of the loop's instructions).
inline void dot(__m512i& acc, __m512i u, __m512i s) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s)); }

// A register tile of MR rows × NB column blocks: per 4-k step, NB weight vectors (unsigned) times each row's 4
// activations broadcast (signed).
template <int MR, int NB>
void vnni_tile(const Weights& w, const Acts& a, int64_t row0, int64_t block0, const Out& out) {
  __m512i acc[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_si512();
  const int8_t* x[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) x[r] = a.row(row0 + r);
  const int64_t stride = a.tile_stride();
  __m512i first[MR][NB];  // the first group's sums (split > 0): out of registers from the split on
  // (every loop over r and j unrolled: the accumulators must live in registers; GCC spills them otherwise)
  for (int64_t t = 0; t < w.kt; ++t) {
    if (t == a.split && t > 0) {
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) first[r][j] = acc[r][j], acc[r][j] = _mm512_setzero_si512();
    }
    const uint8_t* c = w.cell(block0, t);
    for (int s = 0; s < 16; ++s) {
      __m512i wv[NB];
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(c + j * w.kt * kCellBytes + s * 64);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512i xb = _mm512_set1_epi32(*reinterpret_cast<const unaligned_i32*>(x[r] + t * stride + s * 4));
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) dot(acc[r][j], wv[j], xb);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) finish16(w, a, row0 + r, block0 + j, acc[r][j], out, a.split ? &first[r][j] : nullptr);
}

using TileFn = void (*)(const Weights&, const Acts&, int64_t, int64_t, const Out&);
// 24 (16) accumulators + 4 (8) weight vectors + one broadcast: 29 of the 32 registers
constexpr int kVnniRows = 6, kVnniBlocks = 4, kVnniWide = 8;

void vnni_chunk(const Weights& w, const Acts& a, int64_t b0, int64_t b1, const Out& out) {
  static const TileFn four[kVnniRows] = {vnni_tile<1, 4>, vnni_tile<2, 4>, vnni_tile<3, 4>,
                                         vnni_tile<4, 4>, vnni_tile<5, 4>, vnni_tile<6, 4>};
  static const TileFn one[kVnniRows] = {vnni_tile<1, 1>, vnni_tile<2, 1>, vnni_tile<3, 1>,
                                        vnni_tile<4, 1>, vnni_tile<5, 1>, vnni_tile<6, 1>};
  // One or two rows (a lone question's decode): eight column blocks keep more weight loads in flight.
  const int nb = a.rows <= 2 ? kVnniWide : kVnniBlocks;
  for (int64_t block = b0; block < b1;) {
    const bool whole = b1 - block >= nb;
    for (int64_t row0 = 0; row0 < a.rows; row0 += kVnniRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kVnniRows, a.rows - row0));
      if (!whole) one[mr - 1](w, a, row0, block, out);
      else if (nb == kVnniWide) (mr == 1 ? vnni_tile<1, 8> : vnni_tile<2, 8>)(w, a, row0, block, out);
      else four[mr - 1](w, a, row0, block, out);
    }
    block += whole ? nb : 1;
  }
}
#endif

#if KEV_AVX2
// AVX2 has no int8 dot product into int32, and vpmaddubsw's int16 pair sums saturate for a u8 · s8 pair of full
// range. The sign trick keeps them exact: |q| (0..127, the unsigned side) times w with q's sign (vpsignb: -127..127)
// is q · w, and a pair sums to at most 2 · 127 · 127 = 32,258 < 32,767. vpmaddwd by ones widens the pairs to int32,
// so a lane sums 4 k. The weights are read from the cells as the other paths read them (w + 128, flipped back to w
// by the top bit), and the sum is Σ q · w itself: the other paths' raw + start, the same integer.
// A step's 64 bytes are 16 columns × 4 k: its first 32 bytes one 8-column half (h = 0), the next 32 the other.

// 8 columns of row m (half h of a block) from their int32 sums.
inline void finish8(const Weights& w, const Acts& a, int64_t m, int64_t col, __m256i isum, const Out& out) {
  __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_loadu_ps(w.scale + col));
  v = _mm256_mul_ps(v, _mm256_set1_ps(a.dx[m]));
  if (w.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(w.bias + col));
  const int64_t n = std::min<int64_t>(8, w.out_features - col);
  if (n <= 0) return;
  const int64_t at = m * w.out_features + col;
  if (n == 8) {
    if (out.bf16) return store8(reinterpret_cast<at::BFloat16*>(out.bf16 + at), v);
    return _mm256_storeu_ps(out.fp32 + at, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (int64_t i = 0; i < n; ++i) out.store(at + i, lanes[i]);
}

// acc += the 4-k dot products of w (signed) and the broadcast q: the four instructions in one asm with one scratch
// register, since GCC otherwise keeps a copy of each step's products live and spills accumulators to the stack.
inline __m256i signed_dot(__m256i acc, __m256i w, __m256i xq, __m256i xa, __m256i ones) {
  __m256i t;
  asm("vpsignb %[xq], %[w], %[t]\n\t"
      "vpmaddubsw %[t], %[xa], %[t]\n\t"
      "vpmaddwd %[ones], %[t], %[t]\n\t"
      "vpaddd %[t], %[acc], %[acc]"
      : [acc] "+x"(acc), [t] "=&x"(t)
      : [w] "x"(w), [xq] "x"(xq), [xa] "x"(xa), [ones] "x"(ones));
  return acc;
}

// A register tile of MR rows × NH 8-column halves (NH / 2 column blocks), 16 ymm registers: MR · NH accumulators,
// NH weight vectors, the row's broadcast q and |q| (read from a.qa: vpabsb would take one of the two pipes that
// vpsignb, vpmaddubsw and vpmaddwd share on Zen 3), ones and a product.
template <int MR, int NH>
void avx2_tile(const Weights& w, const Acts& a, int64_t row0, int64_t block0, const Out& out) {
  __m256i acc[MR][NH];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NH; ++j) acc[r][j] = _mm256_setzero_si256();
  const int8_t* x[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) x[r] = a.row(row0 + r);
  const int64_t stride = a.tile_stride(), to_abs = a.qa.get() - a.q.get();
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < w.kt; ++t) {
    const uint8_t* c = w.cell(block0, t);
    for (int s = 0; s < 16; ++s) {
      __m256i wv[NH];
#pragma GCC unroll 8
      for (int j = 0; j < NH; ++j)
        wv[j] = _mm256_xor_si256(top, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                          c + (j / 2) * w.kt * kCellBytes + s * 64 + (j % 2) * 32)));
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256i xq = _mm256_set1_epi32(*reinterpret_cast<const unaligned_i32*>(x[r] + t * stride + s * 4));
        const __m256i xa =
            _mm256_set1_epi32(*reinterpret_cast<const unaligned_i32*>(x[r] + to_abs + t * stride + s * 4));
#pragma GCC unroll 8
        for (int j = 0; j < NH; ++j) acc[r][j] = signed_dot(acc[r][j], wv[j], xq, xa, ones);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NH; ++j) finish8(w, a, row0 + r, (block0 + j / 2) * kCols + (j % 2) * 8, acc[r][j], out);
}

using Avx2TileFn = void (*)(const Weights&, const Acts&, int64_t, int64_t, const Out&);
constexpr int kAvx2Rows = 4;

void avx2_chunk(const Weights& w, const Acts& a, int64_t b0, int64_t b1, const Out& out) {
  static const Avx2TileFn one[kAvx2Rows] = {avx2_tile<1, 2>, avx2_tile<2, 2>, avx2_tile<3, 2>, avx2_tile<4, 2>};
  // One or two rows (a lone question's decode): two column blocks keep more weight loads in flight.
  const bool wide = a.rows <= 2;
  for (int64_t block = b0; block < b1;) {
    if (wide && b1 - block >= 2) {
      (a.rows == 1 ? avx2_tile<1, 4> : avx2_tile<2, 4>)(w, a, 0, block, out);
      block += 2;
      continue;
    }
    for (int64_t row0 = 0; row0 < a.rows; row0 += kAvx2Rows)
      one[std::min<int64_t>(kAvx2Rows, a.rows - row0) - 1](w, a, row0, block, out);
    ++block;
  }
}
#endif

#if KEV_W8_AMX
// The tile configuration (palette 1): tmm0-3 the int32 sums (rows × 16 columns), tmm4-5 activations (rows × 64 k),
// tmm6-7 weights (16 steps of 4 k × 16 columns).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// RT row tiles × CT column blocks of `rows` rows each (the last tile may hold padded zero rows: not written out).
template <int RT, int CT>
KEV_AMX_TARGET void amx_tile(const Weights& w, const Acts& a, int64_t row0, int64_t block0, int rows,
                             const Out& out) {
  _tile_zero(0);
  if constexpr (CT == 2) _tile_zero(1);
  if constexpr (RT == 2) {
    _tile_zero(2);
    if constexpr (CT == 2) _tile_zero(3);
  }
  const int8_t* x0 = a.row(row0);
  const int8_t* x1 = a.row(row0 + rows);  // (a row past the end when RT is 1: not read)
  const int64_t stride = a.tile_stride();
  for (int64_t t = 0; t < w.kt; ++t) {
    _tile_loadd(4, x0 + t * stride, 64);
    _tile_loadd(6, w.cell(block0, t), 64);
    _tile_dpbsud(0, 4, 6);
    if constexpr (CT == 2) {
      _tile_loadd(7, w.cell(block0 + 1, t), 64);
      _tile_dpbsud(1, 4, 7);
    }
    if constexpr (RT == 2) {
      _tile_loadd(5, x1 + t * stride, 64);
      _tile_dpbsud(2, 5, 6);
      if constexpr (CT == 2) _tile_dpbsud(3, 5, 7);
    }
  }
  alignas(64) int32_t c[4][kTileRows * kCols];
  _tile_stored(0, c[0], 64);
  if constexpr (CT == 2) _tile_stored(1, c[1], 64);
  if constexpr (RT == 2) {
    _tile_stored(2, c[2], 64);
    if constexpr (CT == 2) _tile_stored(3, c[3], 64);
  }
  for (int rt = 0; rt < RT; ++rt)
    for (int r = 0; r < rows && row0 + rt * rows + r < a.rows; ++r)
      for (int ct = 0; ct < CT; ++ct)
        finish16(w, a, row0 + rt * rows + r, block0 + ct,
                 _mm512_load_si512(c[2 * rt + ct] + r * kCols), out);
}

KEV_AMX_TARGET void amx_chunk(const Weights& w, const Acts& a, int64_t b0, int64_t b1, const Out& out) {
  const int rows = static_cast<int>(std::min<int64_t>(kTileRows, a.rows));  // fewer than 16 rows: tiles that short
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = static_cast<uint8_t>(t < 6 ? rows : 16);
  _tile_loadconfig(&cfg);
  for (int64_t block = b0; block < b1; block += 2) {
    const bool two = block + 1 < b1;
    for (int64_t row0 = 0; row0 < a.padded; row0 += 2 * rows) {
      const bool pair = row0 + rows < a.padded;
      if (two && pair) amx_tile<2, 2>(w, a, row0, block, rows, out);
      else if (two) amx_tile<1, 2>(w, a, row0, block, rows, out);
      else if (pair) amx_tile<2, 1>(w, a, row0, block, rows, out);
      else amx_tile<1, 1>(w, a, row0, block, rows, out);
    }
  }
  _tile_release();
}

// AMX where the CPU has it (CPUID.7.0:EDX bits 24 tile, 25 int8; the OS saving tile state, XCR0 bits 17-18) and Linux
// gives this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): asked once.
bool amx_usable() {
  static const bool usable = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 24)) || !(edx & (1u << 25))) return false;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
    unsigned lo, hi;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return usable;
}
#endif

bool path_present(Path p) {
  switch (p) {
    case kPlain: return true;
#if KEV_AVX2
    case kAvx2: return true;
#endif
#if KEV_W8_VNNI
    case kVnni: return true;
#endif
#if KEV_W8_AMX
    case kAmx: return amx_usable();
#endif
    default: return false;
  }
}

// AMX from kAmxMinRows rows: below it the call streams weights from memory and a tile's mostly empty rows cost more
// than vpdpbusd (measured on a Xeon of family 6 model 167: even at 1 row, AMX ahead from 8; bench/w8a8_speed.py).
constexpr int64_t kAmxMinRows = 4;
Path best_path(int64_t rows) {
  if (rows >= kAmxMinRows && path_present(kAmx)) return kAmx;
  if (path_present(kVnni)) return kVnni;
  if (path_present(kAvx2)) return kAvx2;
  return kPlain;
}

}  // namespace

bool is_w8a8_cells(const at::Tensor& cells) { return cells.dim() == 3 && cells.size(2) == kCellBytes; }

// x: [M, K] bf16 / fp32; cells: uint8 [blocks, ceil(K/64), 1024] as above; scale: fp32 [blocks·16]. Returns fp32
// [M, out_features], or with like_x x's dtype (ops.h's LinearOutput). path: 0 the best present, 1 AVX-512 VNNI,
// 2 plain C++, 3 AMX, 4 AVX2 (tests force each).
at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& cells, const c10::optional<at::Tensor>& scale,
                       const c10::optional<at::Tensor>& bias, int64_t out_features, int64_t path, bool like_x,
                       int64_t split) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "kev::w8a8_linear: x must be a contiguous [rows, K] matrix");
  const int64_t k = x.size(1), kt = (k + kTileK - 1) / kTileK;
  TORCH_CHECK(cells.scalar_type() == at::kByte && cells.is_contiguous() && is_w8a8_cells(cells) &&
                  cells.size(1) == kt && cells.size(0) * kCols >= out_features,
              "kev::w8a8_linear: cells must be uint8 [column blocks, ceil(K/64), 1024]");
  TORCH_CHECK(scale && scale->defined() && scale->scalar_type() == at::kFloat &&
                  scale->numel() == cells.size(0) * kCols,
              "kev::w8a8_linear: one fp32 scale per (padded) output column");
  const bool has_bias = bias && bias->defined();
  TORCH_CHECK(!has_bias || (bias->scalar_type() == at::kFloat && bias->numel() == cells.size(0) * kCols),
              "kev::w8a8_linear: the bias must be fp32, one per (padded) output column");
  const Path chosen = path == kAuto ? best_path(x.size(0)) : static_cast<Path>(path);
  TORCH_CHECK(path_present(chosen), "kev::w8a8_linear: path ", path, " is not present on this CPU");
  TORCH_CHECK(split == 0 || (split > 0 && split < kt && (chosen == kVnni || chosen == kPlain)),
              "kev::w8a8_linear: split must be 0, or 1 .. ceil(K/64) - 1 on the avx512-vnni or plain path");
  const int64_t rows = x.size(0);
  const LinearOutput result = LinearOutput::make(x, out_features, like_x, /*kernel_rounds=*/true);
  if (rows == 0) return result.done();
  const Weights w{cells.data_ptr<uint8_t>(), scale->data_ptr<float>(), has_bias ? bias->data_ptr<float>() : nullptr,
                  kt, cells.size(0), out_features};
  const Acts a = quantize(x, kt, chosen != kPlain, chosen == kAvx2, split);
  const Out op{result.fp32, result.rounded};
  // Column blocks split over threads in pairs (AMX's two B tiles); a thread gets enough weight bytes to pay for
  // waking it.
  const int64_t pairs = (w.blocks + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 19) / (2 * kt * kCellBytes * (1 + rows / 16)));
  const auto chunk = [&](int64_t b0, int64_t b1) {
#if KEV_W8_AMX
    if (chosen == kAmx) return amx_chunk(w, a, b0, b1, op);
#endif
#if KEV_W8_VNNI
    if (chosen == kVnni) return vnni_chunk(w, a, b0, b1, op);
#endif
#if KEV_AVX2
    if (chosen == kAvx2) return avx2_chunk(w, a, b0, b1, op);
#endif
    plain_chunk(w, a, b0, b1, op);
  };
  at::parallel_for(0, pairs, grain, [&](int64_t begin, int64_t end) {
    chunk(2 * begin, std::min(2 * end, w.blocks));
  });
  return result.done();
}

// The paths present here, best first: "amx", "avx512-vnni", "avx2", "plain".
std::vector<std::string> w8a8_paths() {
  std::vector<std::string> names;
  if (path_present(kAmx)) names.emplace_back("amx");
  if (path_present(kVnni)) names.emplace_back("avx512-vnni");
  if (path_present(kAvx2)) names.emplace_back("avx2");
  names.emplace_back("plain");
  return names;
}

// The activation quantization alone (tests): (q int8 [M, K], dx fp32 [M]).
std::tuple<at::Tensor, at::Tensor> w8a8_quantize(const at::Tensor& x, bool vector) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "kev::w8a8_quantize: x must be a contiguous [rows, K] matrix");
  const int64_t k = x.size(1);
  const Acts a = quantize(x, (k + kTileK - 1) / kTileK, vector && (path_present(kVnni) || path_present(kAvx2)));
  auto q = at::empty({x.size(0), k}, x.options().dtype(at::kChar));
  auto dx = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
  for (int64_t m = 0; m < a.rows; ++m) {
    for (int64_t i = 0; i < k; ++i) q.data_ptr<int8_t>()[m * k + i] = a.row(m)[i / kTileK * a.tile_stride() + i % kTileK];
    dx.data_ptr<float>()[m] = a.dx[m];
  }
  return {q, dx};
}

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("w8a8_linear(Tensor x, Tensor cells, Tensor? scale, Tensor? bias, int out_features, int path=0, bool like_x=False, int split=0) -> Tensor");
  m.def("w8a8_paths() -> str[]", &kev::w8a8_paths);
  m.def("w8a8_quantize(Tensor x, bool vector=True) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kev, CPU, m) {
  m.impl("w8a8_linear", &kev::w8a8_linear);
  m.impl("w8a8_quantize", &kev::w8a8_quantize);
}
