// Kev's linear layer for CPUs with AVX-512 (fp32, bf16 and int8 weights) or AVX2 + FMA (fp32 x; fp32 or int8 weights):
// y = x Wᵀ + b, every row's bits independent of the others.
//
// Weights are packed once at load into blocks of 16 output columns, k-major inside a block, so one
// 512-bit load holds 16 outputs' weights for one k (fp32) or one k pair (bf16). Each output element
// (row m, column n) is one fp32 accumulator lane that adds k (or k pairs) strictly in order with the
// same instruction (vfmadd / vdpbf16ps); row and column blocking only decide which elements share a
// loop, never the order of an element's sum. So a row's result is the same for every M, every thread
// count and every split of the columns: row invariance by construction, at M=1 too, with no tiles.
//
// Register blocking: MR rows × NB column blocks of accumulators (≤ 24 of the 32 zmm registers); with
// one or two rows (decode of a lone question) eight column blocks keep more loads in flight, since
// that case only streams weights from memory.
//
// int8 (weight-only, core.precision: int8): weights are stored as int8 in the bf16 pair layout (32
// bytes per block and k pair) with one fp32 scale per output column. An int8 is exactly a bf16, so
// the kernel widens each pair to bf16 (two byte-table lookups) and runs the very vdpbf16ps sum the bf16
// weights run; the scale multiplies the finished fp32 sum. One or two rows widen in registers;
// more rows widen a panel of columns once into a per-thread buffer and reuse it for every row group. Both give one element the same sum of the same bf16 values in the same order, so int8 is
// row-invariant exactly as bf16 is.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define KEV_HAS_GEMM 1
#define KEV_GEMM_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KEV_HAS_GEMM 0
#define KEV_GEMM_AVX2 1
#else
#define KEV_HAS_GEMM 0
#define KEV_GEMM_AVX2 0
#endif

namespace kev {

constexpr int kBlock = 16;  // output columns per packed block (one zmm of fp32, two ymm)
constexpr int64_t kMinThreadWork = int64_t{2} << 20;  // bytes-equivalent per thread, see linear()

#if KEV_HAS_GEMM

constexpr int kMaxRows = 6;

// Weight loaders: `load` gives the weights of one block for kGroup consecutive k steps. bf16: x rows are read
// as int32 pairs (x[2k], x[2k+1]); packed weights [blocks][K/2][16] pairs.
struct Bf16 {
  using In = at::BFloat16;
  using Step = int32_t;  // one k step: a pair of bf16
  using W = int32_t;
  using Vec = __m512bh;
  static constexpr int64_t kWStep = kBlock;  // W elements per block and k step
  static constexpr int kGroup = 1;
  static Vec broadcast(Step x) { return (__m512bh)_mm512_set1_epi32(x); }
  void load(const W* w, Vec* out) const { out[0] = (__m512bh)_mm512_loadu_si512(w); }
  static __m512 madd(__m512 acc, Vec x, Vec w) { return _mm512_dpbf16_ps(acc, x, w); }
  static void store(at::BFloat16* out, __m512 v, __mmask16 mask) {
    const __m256i packed = (__m256i)_mm512_cvtneps_pbh(v);
    _mm256_mask_storeu_epi16(out, mask, packed);
  }
};

// int8 weights, bf16 x: 64 bytes per block and two k steps (pairs), each byte sign-magnitude (sign << 7 |
// |w|, |w| <= 127), placed so that byte-interleaving two table lookups gives the bf16 pair layout:
// byte (lane L, half h, i) is column (8L + i) / 2, k parity i % 2, of pair 2g + h (model/linear.py packs it).
// A bf16 is two bytes of a 128-entry table indexed by |w| (vpermi2b), the sign ORed into the high byte.
struct Int8 : Bf16 {
  using W = int8_t;
  static constexpr int64_t kWStep = 2 * kBlock;
  static constexpr int kGroup = 2;
  __m512i low0, low1, high0, high1;  // bf16 bits of 0..127: low bytes, high bytes (two 64-entry halves each)
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));

  Int8() {
    alignas(64) uint8_t low[128], high[128];
    for (int m = 0; m < 128; ++m) {
      const float f = static_cast<float>(m);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      low[m] = static_cast<uint8_t>(bits >> 16);  // exact: m has at most 7 significant bits
      high[m] = static_cast<uint8_t>(bits >> 24);
    }
    low0 = _mm512_load_si512(low), low1 = _mm512_load_si512(low + 64);
    high0 = _mm512_load_si512(high), high1 = _mm512_load_si512(high + 64);
  }
  void load(const W* w, Vec* out) const {
    const __m512i bytes = _mm512_loadu_si512(w);
    const __m512i lo = _mm512_permutex2var_epi8(low0, bytes, low1);  // index bit 7 (the sign) is ignored
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, bytes, high1), bytes, sign, 0xF8);
    out[0] = (__m512bh)_mm512_unpacklo_epi8(lo, hi);
    out[1] = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
  }
};

// fp32: packed weights [blocks][K][16].
struct Fp32 {
  using In = float;
  using Step = float;
  using W = float;
  using Vec = __m512;
  static constexpr int64_t kWStep = kBlock;
  static constexpr int kGroup = 1;
  static Vec broadcast(Step x) { return _mm512_set1_ps(x); }
  void load(const W* w, Vec* out) const { out[0] = _mm512_loadu_ps(w); }
  static __m512 madd(__m512 acc, Vec x, Vec w) { return _mm512_fmadd_ps(x, w, acc); }
  static void store(float* out, __m512 v, __mmask16 mask) { _mm512_mask_storeu_ps(out, mask, v); }
};

// Int8 that also leaves what it widened in a bf16 panel ([blocks][steps][16] int32 pairs, from `base`), so the
// next row groups of the same columns read bf16 (the first row group's loads overlap its arithmetic, as bf16's).
struct Int8Widening : Int8 {
  const int8_t* base;
  int32_t* panel;
  Int8Widening(const int8_t* base, int32_t* panel) : base(base), panel(panel) {}
  void load(const W* w, Vec* out) const {
    Int8::load(w, out);
    int32_t* at = panel + (w - base) / kWStep * kBlock;
    _mm512_storeu_si512(at, (__m512i)out[0]);
    _mm512_storeu_si512(at + kBlock, (__m512i)out[1]);
  }
};

// Output columns of one tile: fp32 sums, then × scale (int8 only), + bias, rounded once to the output type.
struct Epilogue {
  const float* bias;   // padded to whole blocks, or null
  const float* scale;  // int8: one per output column, padded; else null
  int64_t valid;       // columns of the tile that exist (the last block may be a tail)
};

template <typename T, int NB, int MR>
void tile(const T& loader, const typename T::Step* const* x, const typename T::W* w, int64_t steps, Epilogue e,
          typename T::In* const* out) {
  constexpr int G = T::kGroup;
  __m512 acc[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < steps; k += G) {
    typename T::Vec xk[MR][G];
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < G; ++g) xk[m][g] = T::broadcast(x[m][k + g]);
    for (int j = 0; j < NB; ++j) {
      typename T::Vec wk[G];
      loader.load(w + (j * steps + k) * T::kWStep, wk);
      for (int g = 0; g < G; ++g)  // k strictly in order for every element, whatever G is
        for (int m = 0; m < MR; ++m) acc[m][j] = T::madd(acc[m][j], xk[m][g], wk[g]);
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int64_t left = e.valid - j * kBlock;
    if (left <= 0) break;
    const __mmask16 mask = left >= kBlock ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    const __m512 b = e.bias ? _mm512_loadu_ps(e.bias + j * kBlock) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) {
      const __m512 sum = e.scale ? _mm512_mul_ps(acc[m][j], _mm512_loadu_ps(e.scale + j * kBlock)) : acc[m][j];
      T::store(out[m] + j * kBlock, _mm512_add_ps(sum, b), mask);
    }
  }
}

template <typename T, int NB>
void rows_tile(const T& loader, int rows, const typename T::Step* const* x, const typename T::W* w, int64_t steps,
               Epilogue e, typename T::In* const* out) {
  switch (rows) {
    case 1: tile<T, NB, 1>(loader, x, w, steps, e, out); break;
    case 2: tile<T, NB, 2>(loader, x, w, steps, e, out); break;
    case 3: tile<T, NB, 3>(loader, x, w, steps, e, out); break;
    case 4: tile<T, NB, 4>(loader, x, w, steps, e, out); break;
    case 5: tile<T, NB, 5>(loader, x, w, steps, e, out); break;
    default: tile<T, NB, 6>(loader, x, w, steps, e, out); break;
  }
}

// Every row against nb column blocks starting at `block`, whose packed weights start at w.
template <typename T>
void rows_against_blocks(const T& loader, const typename T::Step* xp, const typename T::W* w, int nb, int64_t block,
                         Epilogue e, typename T::In* op, int64_t rows, int64_t steps, int64_t out_features) {
  const typename T::Step* x[kMaxRows];
  typename T::In* out[kMaxRows];
  for (int64_t m0 = 0; m0 < rows; m0 += kMaxRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, rows - m0));
    for (int r = 0; r < mr; ++r) {
      x[r] = xp + (m0 + r) * steps;
      out[r] = op + (m0 + r) * out_features + block * kBlock;
    }
    switch (nb) {
      case 8:  // only when rows <= 2
        if (mr == 1) tile<T, 8, 1>(loader, x, w, steps, e, out);
        else tile<T, 8, 2>(loader, x, w, steps, e, out);
        break;
      case 7: rows_tile<T, 7>(loader, mr, x, w, steps, e, out); break;
      case 6: rows_tile<T, 6>(loader, mr, x, w, steps, e, out); break;
      case 5: rows_tile<T, 5>(loader, mr, x, w, steps, e, out); break;
      case 4: rows_tile<T, 4>(loader, mr, x, w, steps, e, out); break;
      case 3: rows_tile<T, 3>(loader, mr, x, w, steps, e, out); break;
      case 2: rows_tile<T, 2>(loader, mr, x, w, steps, e, out); break;
      default: rows_tile<T, 1>(loader, mr, x, w, steps, e, out); break;
    }
  }
}

// Columns [first block, end block) of every row. int8 with up to one row group widens in registers (fewer
// column blocks a tile as rows grow, so accumulators, broadcasts and the byte tables fit the 32 registers).
// With more rows, the first row group widens each panel of blocks into a per-thread bf16 buffer as it goes,
// and the other row groups read that buffer.
template <typename T>
void column_range(const typename T::Step* xp, const typename T::W* wp, const float* bp, const float* sp,
                  typename T::In* op, int64_t rows, int64_t steps, int64_t out_features, int64_t first, int64_t end) {
  constexpr bool kInt8 = std::is_same_v<T, Int8>;
  const bool panels = kInt8 && rows > kMaxRows;
  const int wide = rows <= 2 ? 8 : (kInt8 && rows > 4 && !panels) ? 2 : 4;
  const T loader;
  for (int64_t block = first; block < end;) {
    const int nb = static_cast<int>(std::min<int64_t>(wide, end - block));
    const typename T::W* w = wp + block * steps * T::kWStep;
    const auto epilogue = [&](int64_t from) {  // from: the tile's first block
      return Epilogue{bp ? bp + from * kBlock : nullptr, sp ? sp + from * kBlock : nullptr,
                      out_features - from * kBlock};
    };
    if constexpr (kInt8) {
      if (panels) {
        thread_local std::vector<int32_t> panel;
        panel.resize(static_cast<size_t>(nb * steps * kBlock));
        const Int8Widening widening(w, panel.data());
        for (int j = 0; j < nb; j += 2) {  // two blocks a tile: six rows' accumulators and broadcasts fit
          const int pair = std::min(2, nb - j);
          rows_against_blocks<Int8Widening>(widening, xp, w + j * steps * T::kWStep, pair, block + j,
                                            epilogue(block + j), op, kMaxRows, steps, out_features);
        }
        rows_against_blocks<Bf16>(Bf16{}, xp + kMaxRows * steps, panel.data(), nb, block, epilogue(block),
                                  op + kMaxRows * out_features, rows - kMaxRows, steps, out_features);
        block += nb;
        continue;
      }
    }
    rows_against_blocks<T>(loader, xp, w, nb, block, epilogue(block), op, rows, steps, out_features);
    block += nb;
  }
}

#endif  // KEV_HAS_GEMM

#if KEV_GEMM_AVX2
// fp32 x on AVX2 + FMA, weights [blocks][K][16] fp32 or int8 (weight-only, with a per-column scale). fp32: the
// AVX-512 Fp32 path's arithmetic on two 8-lane halves of each 16-column block (one vfmadd per element and k, k in
// order), so the same bits as there. int8: each weight widened exactly to fp32 (vpmovsxbd, vcvtdq2ps) and the same
// vfmadd sum, times the column's scale once at the end. MR rows × NB blocks: 2 · MR · NB accumulators of the 16 ymm
// registers.

inline void load_weights(const float* w, __m256& w0, __m256& w1) { w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8); }
inline void load_weights(const int8_t* w, __m256& w0, __m256& w1) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(bytes, bytes)));
}

template <typename W, int NB, int MR>
void tile_avx2(const float* const* x, const W* w, int64_t steps, const float* bias, const float* scale, int64_t valid,
               float* const* out) {
  __m256 acc[MR][NB][2];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[m][j][0] = acc[m][j][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < steps; ++k) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      __m256 w0, w1;
      load_weights(w + (j * steps + k) * kBlock, w0, w1);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m256 xb = _mm256_broadcast_ss(x[m] + k);
        acc[m][j][0] = _mm256_fmadd_ps(xb, w0, acc[m][j][0]);
        acc[m][j][1] = _mm256_fmadd_ps(xb, w1, acc[m][j][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const int64_t left = valid - j * kBlock - h * 8, at = j * kBlock + h * 8;
      if (left <= 0) continue;
      const __m256 b = bias ? _mm256_loadu_ps(bias + at) : _mm256_setzero_ps();
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m256 sum = scale ? _mm256_mul_ps(acc[m][j][h], _mm256_loadu_ps(scale + at)) : acc[m][j][h];
        const __m256 v = _mm256_add_ps(sum, b);
        if (left >= 8) {
          _mm256_storeu_ps(out[m] + at, v);
        } else {
          alignas(32) float lanes[8];
          _mm256_store_ps(lanes, v);
          std::memcpy(out[m] + at, lanes, static_cast<size_t>(left) * sizeof(float));
        }
      }
    }
}

// Columns [first block, end block) of every row: 6 rows × 1 block (12 accumulators; int8 widens a k step's 16
// weights once for 6 rows), or 1-2 rows × 3 blocks streaming the weights of a lone question's decode. (Measured on
// a Zen 3, one thread, fp32 576 → 49,152 at M = 64: ~27 GMAC/s with 6 × 1, 3 × 2 or 2 × 3 tiles alike, as oneDNN's
// 30; 2 × 3 halved int8's rate.)
template <typename W>
void column_range_avx2(const float* xp, const W* wp, const float* bp, const float* sp, float* op, int64_t rows,
                       int64_t steps, int64_t out_features, int64_t first, int64_t end) {
  constexpr int kRows = 6;
  using Tile = void (*)(const float* const*, const W*, int64_t, const float*, const float*, int64_t, float* const*);
  static const Tile one[kRows] = {tile_avx2<W, 1, 1>, tile_avx2<W, 1, 2>, tile_avx2<W, 1, 3>,
                                  tile_avx2<W, 1, 4>, tile_avx2<W, 1, 5>, tile_avx2<W, 1, 6>};
  const float* x[kRows];
  float* out[kRows];
  for (int64_t block = first; block < end;) {
    const int nb = rows <= 2 && end - block >= 3 ? 3 : 1;
    const W* w = wp + block * steps * kBlock;
    const float* bias = bp ? bp + block * kBlock : nullptr;
    const float* scale = sp ? sp + block * kBlock : nullptr;
    for (int64_t m0 = 0; m0 < rows; m0 += kRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kRows, rows - m0));
      for (int r = 0; r < mr; ++r) x[r] = xp + (m0 + r) * steps, out[r] = op + (m0 + r) * out_features + block * kBlock;
      const Tile fn = nb == 3 ? (mr == 1 ? tile_avx2<W, 3, 1> : tile_avx2<W, 3, 2>) : one[mr - 1];
      fn(x, w, steps, bias, scale, out_features - block * kBlock, out);
    }
    block += nb;
  }
}
#endif  // KEV_GEMM_AVX2

// x: [M, K] (bf16 or fp32, contiguous); packed: from model/linear.py's GemmWeight (bf16: int32 pairs
// [blocks, K/2, 16]; fp32: [blocks, K, 16]; int8: [blocks, K/2, 32] with bf16 x and a scale; on an AVX2 build fp32 x
// only, int8 k-major [blocks, K, 16]); bias, scale: fp32 padded to the packed width, or none. Returns
// [M, out_features] in x's dtype.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                  const c10::optional<at::Tensor>& scale, int64_t out_features) {
#if KEV_HAS_GEMM || KEV_GEMM_AVX2
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "kev::linear: x must be a contiguous [rows, in_features] matrix");
  const bool int8 = packed.scalar_type() == at::kChar;
#if KEV_HAS_GEMM
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == (int8 ? 2 : 1) * kBlock && (!int8 || packed.size(1) % 2 == 0),
              "kev::linear: packed weight must be [blocks, k, 16] (int8: [blocks, k pairs (even), 32])");
#else
  TORCH_CHECK(x.scalar_type() == at::kFloat && (int8 || packed.scalar_type() == at::kFloat) && packed.dim() == 3 &&
                  packed.size(2) == kBlock && packed.size(1) == x.size(1),
              "kev::linear on AVX2: fp32 x and a weight packed [blocks, K, 16] (fp32 or int8) of the same K");
#endif
  TORCH_CHECK(packed.size(0) * kBlock >= out_features, "kev::linear: out_features exceeds the packed blocks");
  TORCH_CHECK(int8 == (scale && scale->defined()), "kev::linear: int8 weights need a scale, others none");
  const int64_t rows = x.size(0), steps = packed.size(1);
  const int64_t blocks = (out_features + kBlock - 1) / kBlock;
  const float* bp = bias && bias->defined() ? bias->data_ptr<float>() : nullptr;
  const float* sp = int8 ? scale->data_ptr<float>() : nullptr;
  auto out = at::empty({rows, out_features}, x.options());
  if (rows == 0) return out;
  // Columns split over threads only where each thread gets enough work to pay for waking another: with
  // OMP_WAIT_POLICY=PASSIVE (Kev's default, for busy neighbours) a wake costs ~40 us here, more than a
  // small decode GEMM takes on one thread. Work of a block: its weight bytes, streamed once, plus its
  // multiply-adds (about one byte-equivalent per 4 rows). An int8 block counts as its rows' dtype: widening it
  // costs about what streaming the bytes it saves would.
  const int64_t block_bytes = kBlock * x.size(1) * x.element_size();
  const int64_t grain = std::max<int64_t>(8, kMinThreadWork / (block_bytes * (1 + rows / 4)));
#if KEV_HAS_GEMM
  if (x.scalar_type() == at::kBFloat16) {
    TORCH_CHECK((packed.scalar_type() == at::kInt || int8) && steps * 2 == x.size(1),
                "kev::linear: bf16 x needs a bf16- or int8-packed weight of the same K");
    const auto* xp = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
    at::BFloat16* op = out.data_ptr<at::BFloat16>();
    if (int8) {
      const int8_t* wp = packed.data_ptr<int8_t>();
      at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
        column_range<Int8>(xp, wp, bp, sp, op, rows, steps, out_features, begin, end);
      });
    } else {
      const int32_t* wp = packed.data_ptr<int32_t>();
      at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
        column_range<Bf16>(xp, wp, bp, nullptr, op, rows, steps, out_features, begin, end);
      });
    }
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && steps == x.size(1),
                "kev::linear: fp32 x needs an fp32-packed weight of the same K");
    const float* xp = x.data_ptr<float>();
    const float* wp = packed.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
      column_range<Fp32>(xp, wp, bp, nullptr, op, rows, steps, out_features, begin, end);
    });
  }
#else
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    if (int8) column_range_avx2(xp, packed.data_ptr<int8_t>(), bp, sp, op, rows, steps, out_features, begin, end);
    else column_range_avx2(xp, packed.data_ptr<float>(), bp, sp, op, rows, steps, out_features, begin, end);
  });
#endif
  return out;
#else
  TORCH_CHECK(false, "kev::linear needs AVX-512 with BF16, or AVX2 with FMA (built without either)");
#endif
}

// One bf16 row x against some column blocks of an int8-packed weight (the head's second pass,
// head_rescore.cpp): out[n] for the 16 columns of each block in `blocks` becomes the fp32 value of the bf16 that
// linear() gives that element, by the same tile (one vdpbf16ps sum per element, k in order, × scale, rounded once).
bool int8_blocks_row(const at::BFloat16* x, const int8_t* packed, const float* scale, int64_t steps,
                     const int64_t* blocks, int64_t count, int64_t out_features, float* out) {
#if KEV_HAS_GEMM
  // Four blocks a tile (four independent sums in flight), their weights and scales gathered side by side.
  constexpr int kNb = 4;
  const Int8 loader;
  const int32_t* xr[1] = {reinterpret_cast<const int32_t*>(x)};
  const int64_t block_bytes = steps * Int8::kWStep;
  thread_local std::vector<int8_t> weights;
  weights.resize(static_cast<size_t>(kNb * block_bytes));
  alignas(64) float scales[kNb * kBlock];
  alignas(64) at::BFloat16 sums[kNb * kBlock];
  at::BFloat16* o[1] = {sums};
  for (int64_t i = 0; i < count; i += kNb) {
    const int nb = static_cast<int>(std::min<int64_t>(kNb, count - i));
    for (int j = 0; j < nb; ++j) {
      std::memcpy(weights.data() + j * block_bytes, packed + blocks[i + j] * block_bytes, block_bytes);
      std::memcpy(scales + j * kBlock, scale + blocks[i + j] * kBlock, sizeof(float) * kBlock);
    }
    if (nb == kNb) {  // (a tail block's padded columns are summed into `sums` too, and not copied out)
      tile<Int8, kNb, 1>(loader, xr, weights.data(), steps, Epilogue{nullptr, scales, kNb * kBlock}, o);
    } else {
      for (int j = 0; j < nb; ++j) {
        at::BFloat16* one[1] = {sums + j * kBlock};
        tile<Int8, 1, 1>(loader, xr, weights.data() + j * block_bytes, steps,
                         Epilogue{nullptr, scales + j * kBlock, kBlock}, one);
      }
    }
    for (int j = 0; j < nb; ++j) {
      const int64_t block = blocks[i + j], valid = std::min<int64_t>(kBlock, out_features - block * kBlock);
      for (int64_t c = 0; c < valid; ++c) out[block * kBlock + c] = static_cast<float>(sums[j * kBlock + c]);
    }
  }
  return true;
#else
  (void)x, (void)packed, (void)scale, (void)steps, (void)blocks, (void)count, (void)out_features, (void)out;
  return false;
#endif
}

bool linear_available() { return KEV_HAS_GEMM || KEV_GEMM_AVX2; }
// Only fp32 x (the AVX2 build), with fp32 or int8 weights packed [blocks, K, 16] (model/linear.py's GemmWeight).
bool linear_fp32_only() { return KEV_GEMM_AVX2; }

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("linear(Tensor x, Tensor packed, Tensor? bias, Tensor? scale, int out_features) -> Tensor");
  m.def("linear_available() -> bool", &kev::linear_available);
  m.def("linear_fp32_only() -> bool", &kev::linear_fp32_only);
}

TORCH_LIBRARY_IMPL(kev, CPU, m) { m.impl("linear", &kev::linear); }
