// Block-quantized weights × per-row int8 activations (core.precision gguf and w8a8): y = x Wᵀ (+ b), every row's
// bits independent of the other rows, of the thread count and of the instruction set used.
//
// Weights (model/quant_weight.py packs them): cells of 16 output columns × 32 k, as GGUF's Q8_0 / Q4_0 / Q4_1
// blocks hold them: quants (Q8: int8; Q4: 0..15, two per byte), one fp16 scale d per column and block (Q4_1: and
// an fp16 min m; w8a8: no d, one fp32 scale per column applied to the finished sum), Q8: each block's quant sum.
// Inside a cell the quants are laid out as vpdpbusd reads them: 16 columns × 4 consecutive k per 64 bytes (Q4: the
// low nibbles of 64 bytes are one such step, the high nibbles the next).
//
// Activations: each row is quantized on its own, in blocks of 32 (as llama.cpp's q8_0 / q8_1): dx = max|x| / 127,
// q = round-to-nearest-even(x · (1 / dx)), and the block's sum of q. So a row's quantization depends on that row
// alone.
//
// One output element (row m, column n) is, with isum the exact int32 dot product of block b:
//   acc = 0; for b in order: acc = acc + (float(isum_b) · d[n,b]) · dx[m,b];  Q4_1: acc = acc + m[n,b] · sx[m,b]
// (sx = dx · float(sum q); each · and + a separately rounded fp32 operation, never fused), then · scale[n] (w8a8),
// + bias[n]. isum is an integer, so whichever instructions produce it (vpdpbusd on 512 or 256 bits, vpmaddubsw +
// vpmaddwd on AVX2, float64 matmul in torch's fallback) it is the same number, and the fp32 steps are the same
// operations in the same order: the same bits on every path, at every M and thread count, by construction.
//
// This file is compiled with the other kernels under -march=native; #pragma GCC optimize keeps the compiler from
// contracting the mul + add above into an FMA (which would round once instead of twice).
#pragma GCC optimize("fp-contract=off")

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"
#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define KEV_QUANT_AVX2 1
#else
#define KEV_QUANT_AVX2 0
#endif
#if KEV_QUANT_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define KEV_QUANT_AVX512 1
#else
#define KEV_QUANT_AVX512 0
#endif

namespace kev {
namespace {

constexpr int kCols = 16;     // output columns per packed block
constexpr int kBlockK = 32;   // k per quant block
constexpr int kMaxRows = 6;   // rows per AVX2 register tile
constexpr int kMaxBlocks = 4; // column blocks per AVX2 register tile
constexpr int kRows512 = 8;   // rows per AVX-512 register tile (one column block)
constexpr int kBlocks512 = 8; // column blocks per AVX-512 tile of one or two rows

// Q4: q - 8 (Q4_0); Q4Min: d·q + m (Q4_1); K-quants (model/kquant.py): Q4K / Q5K d·sc·q - dmin·m with q 0..15 /
// 0..31, Q6K d·sc·(q - 32) with q 0..63 and one int8 sc per 16 k.
enum Kind : int64_t { kQ8 = 0, kQ4 = 1, kQ4Min = 2, kQ4K = 3, kQ5K = 4, kQ6K = 5 };
enum Path : int64_t { kAuto = 0, kAvx512 = 1, kAvx2 = 2 };

// The rows quantized. Rows come in groups of kRows512 (a register tile's rows), each group block by block: a block's
// values of the group's rows lie side by side, so a tile reads them at fixed offsets from one pointer. Per row and
// block (at slot(m, b)): q (int8) and q + 128 (as bytes, for Q8 weights where the activation is vpdpbusd's unsigned
// side), the scale dx, the sum of q (exact, and as fp32), sx = dx · float(Σq), the sums of each 16-k half (Q6K's
// sub-blocks), and the integer sums' starting values -8·Σq (Q4) and -32·Σq per half (Q6K).
// A buffer left uninitialised (every slot a tile reads is written first; zeroing it cost a tenth of a call).
template <class T>
struct Buffer {
  std::unique_ptr<T[]> p;
  void allocate(int64_t n) { p.reset(new T[n]); }
  T* data() const { return p.get(); }
  T& operator[](int64_t i) const { return p[i]; }
};

struct RowsQ {
  int64_t kblocks = 0;
  Buffer<int8_t> q;
  Buffer<uint8_t> u;
  Buffer<float> dx, sx, fsum;
  Buffer<int32_t> qsum, qsum16, q4start, q6start;
  int64_t slot(int64_t m, int64_t b) const { return ((m / kRows512) * kblocks + b) * kRows512 + m % kRows512; }
  const int8_t* quants(int64_t m, int64_t b) const { return q.data() + slot(m, b) * kBlockK; }

  // Block b of row m, from its scale and its 32 quants.
  void store(int64_t m, int64_t b, float d, const int32_t* v) {
    const int64_t at = slot(m, b);
    int32_t half[2] = {0, 0};
    for (int i = 0; i < kBlockK; ++i) {
      q[at * kBlockK + i] = static_cast<int8_t>(v[i]);
      u[at * kBlockK + i] = static_cast<uint8_t>(v[i] + 128);
      half[i / 16] += v[i];
    }
    store_sums(at, d, half);
  }
  // The block's scale and sums, from the sums of its 16-k halves.
  void store_sums(int64_t at, float d, const int32_t (&half)[2]) {
    const int32_t sum = half[0] + half[1];
    dx[at] = d;
    qsum[at] = sum, fsum[at] = static_cast<float>(sum), sx[at] = d * static_cast<float>(sum);
    qsum16[2 * at] = half[0], qsum16[2 * at + 1] = half[1];
    q4start[at] = -8 * sum;
    q6start[2 * at] = -32 * half[0], q6start[2 * at + 1] = -32 * half[1];
  }
};

// Each block of a row: dx = max|x| / 127, q = round-to-nearest-even(x · (1 / dx)). The arithmetic (an exact max, an
// IEEE division, reciprocal and product, rounding under the default round-to-nearest-even mode) is what torch's
// fallback does, so vector and scalar code give the same q and dx.
#if KEV_QUANT_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {  // bf16 to fp32 is exact: the 16 bits above 16 zero bits
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
template <class T>
void quantize_row(RowsQ& r, const T* x, int64_t m) {
  for (int64_t b = 0; b < r.kblocks; ++b) {
    const __m512 x0 = load16(x + b * kBlockK), x1 = load16(x + b * kBlockK + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i v0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), v1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
    const int64_t at = r.slot(m, b);
    const __m256i q = _mm256_set_m128i(_mm512_cvtepi32_epi8(v1), _mm512_cvtepi32_epi8(v0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.q.data() + at * kBlockK), q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.u.data() + at * kBlockK),
                        _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))));  // q + 128 as a byte
    r.store_sums(at, d, {_mm512_reduce_add_epi32(v0), _mm512_reduce_add_epi32(v1)});
  }
}
#else
template <class T>
void quantize_row(RowsQ& r, const T* x, int64_t m) {
  for (int64_t b = 0; b < r.kblocks; ++b) {
    float xb[kBlockK], amax = 0.0f;
    for (int i = 0; i < kBlockK; ++i) xb[i] = static_cast<float>(x[b * kBlockK + i]);
    for (int i = 0; i < kBlockK; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t v[kBlockK];
    for (int i = 0; i < kBlockK; ++i) v[i] = static_cast<int32_t>(std::nearbyint(xb[i] * id));
    r.store(m, b, d, v);
  }
}
#endif

RowsQ quantize_rows(const at::Tensor& x) {
  const int64_t rows = x.size(0), k = x.size(1), blocks = k / kBlockK;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xf = bf16 || x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  RowsQ r;
  r.kblocks = blocks;
  const int64_t slots = (rows + kRows512 - 1) / kRows512 * kRows512 * blocks;  // the last group padded
  r.q.allocate(slots * kBlockK), r.u.allocate(slots * kBlockK);
  r.dx.allocate(slots), r.sx.allocate(slots), r.fsum.allocate(slots), r.qsum.allocate(slots);
  r.q4start.allocate(slots), r.qsum16.allocate(2 * slots), r.q6start.allocate(2 * slots);
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      if (bf16) quantize_row(r, xf.data_ptr<at::BFloat16>() + m * k, m);
      else quantize_row(r, xf.data_ptr<float>() + m * k, m);
    }
  });
  return r;
}

// The packed weight: cells [column blocks][k blocks][cell bytes], each cell 16 columns × 32 k: the quants (512
// bytes Q8, 256 Q4), then 16 fp16 scales d (none under w8a8), 16 fp16 mins (Q4Min), 16 int16 quant sums (Q8).
// K-quants: a cell is 16 columns × 256 k, 8 sub-cells of 32 k (the Q4 quant layout for the low 4 bits, then 64
// bytes of bit 4 (Q5K) or 128 bytes of bits 4-5 (Q6K), several steps to a byte: high_bits_at, then 16 uint8 scales
// and 16 uint8 mins (Q6K: 2 × 16 int8 scales, one per 16-k half)), then the 16 columns' fp16 d (and dmin).
// One stream of bytes per column block, in the order the kernel reads them. The cell size names the layout.
struct Weights {
  const uint8_t* cells;
  int64_t cell_bytes;
  Kind kind;
  bool has_d;
  const float* scale;     // w8a8: per column, padded; else null
  const float* bias;      // padded, or null
  int64_t kblocks, out_features;
  int64_t per_shift;      // log2 of the 32-k blocks per cell: 3 for K-quants (8), else 0 (shifts, not divisions:
                          // these addresses are computed per block in the inner loops)
  int64_t sub_bytes;      // bytes of one 32-k block in a cell
  bool kquant() const { return kind >= kQ4K; }
  int64_t quant_bytes() const { return kind == kQ8 ? 512 : 256; }
  int64_t plane_bytes() const { return kind == kQ5K ? 64 : kind == kQ6K ? 128 : 0; }
  const uint8_t* whole(int64_t block, int64_t b) const {
    return cells + (block * (kblocks >> per_shift) + (b >> per_shift)) * cell_bytes;
  }
  const uint8_t* cell(int64_t block, int64_t b) const {
    return whole(block, b) + (b & ((int64_t{1} << per_shift) - 1)) * sub_bytes;
  }
  int64_t block_stride() const { return (kblocks >> per_shift) * cell_bytes; }  // to the next column block, same k
  const uint16_t* kd(int64_t block, int64_t b) const {  // K-quants: the cell's 16 fp16 d, then 16 dmin
    return reinterpret_cast<const uint16_t*>(whole(block, b) + (sub_bytes << per_shift));
  }
  const uint8_t* ksc(const uint8_t* sub) const { return sub + 256 + plane_bytes(); }  // then mins (Q4K, Q5K)
  const uint16_t* d(const uint8_t* cell) const { return reinterpret_cast<const uint16_t*>(cell + quant_bytes()); }
  const uint16_t* m(const uint8_t* cell) const { return reinterpret_cast<const uint16_t*>(cell + quant_bytes() + 32); }
  const int16_t* wsum(const uint8_t* cell) const { return reinterpret_cast<const int16_t*>(cell + cell_bytes - 32); }
};

struct Layout {
  int64_t kind;  // -1: no layout has this cell size
  bool has_d;
  int64_t per_shift, sub_bytes;  // log2 of the 32-k blocks per cell; bytes of one
};

// The layout a cell size stands for (model/quant_weight.py's cell_layout, model/kquant.py's cell_bytes).
Layout layout_of(int64_t cell_bytes) {
  switch (cell_bytes) {
    case 576: return {kQ8, true, 0, 576};
    case 544: return {kQ8, false, 0, 544};
    case 288: return {kQ4, true, 0, 288};
    case 320: return {kQ4Min, true, 0, 320};
    case 2368: return {kQ4K, true, 3, 288};
    case 2880: return {kQ5K, true, 3, 352};
    case 3360: return {kQ6K, true, 3, 416};
    default: return {-1, false, 0, 0};
  }
}


// One register tile: rows row0.. × column blocks block0.. (how many: the template's).
using TileFn = void (*)(const Weights& w, const RowsQ& rq, int64_t row0, int64_t block0, float* out);

#if KEV_QUANT_AVX2
// The high quant bits of group g (steps 2g, 2g + 1) at bit 4: Q5K's bit 4 (a byte holds 8 steps of its position, step
// s at bit s) or Q6K's bits 4-5 (4 steps a byte, step s at bits 2s; steps 4..7 in the next 64 bytes), model/kquant.py's
// _high_bits. 16-bit shifts are exact here: a byte's bits reach bit 4 (and 5) from its own byte.
inline const uint8_t* high_bits_at(const uint8_t* sub, int g, bool six) {
  return sub + 256 + (six ? (g / 2) * 64 : 0);
}
inline int high_bit(int g, bool six) { return six ? 4 * (g % 2) : 2 * g; }  // where step 2g's bits start

inline __m512i to_bit4(__m512i v, int bit, bool six) {
  const __m512i moved = bit <= 4 ? _mm512_sll_epi16(v, _mm_cvtsi32_si128(4 - bit))
                                 : _mm512_srl_epi16(v, _mm_cvtsi32_si128(bit - 4));
  return _mm512_and_si512(moved, _mm512_set1_epi8(six ? 0x30 : 0x10));
}
inline __m256i to_bit4(__m256i v, int bit, bool six) {
  const __m256i moved = bit <= 4 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - bit))
                                 : _mm256_srl_epi16(v, _mm_cvtsi32_si128(bit - 4));
  return _mm256_and_si256(moved, _mm256_set1_epi8(six ? 0x30 : 0x10));
}
#endif

#if KEV_QUANT_AVX512
inline __m512 half16(const uint16_t* p) {  // 16 fp16 values as fp32
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 widen16(const uint8_t* p) {  // 16 uint8 values as fp32
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;
inline __m512i bcast4(const void* p) {  // 4 bytes at p in every lane (vpdpbusd's broadcast operand)
  return _mm512_set1_epi32(*static_cast<const unaligned_i32*>(p));
}

// Group g (k steps 2g, 2g + 1) of a 4-bit or K-quant sub-cell: each weight as one unsigned byte (K-quants: with its
// high bits at 4 and 5), the 16 columns × 4 k of step 2g in lo, of step 2g + 1 in hi.
template <Kind K>
inline void unpack_group(const uint8_t* sub, int g, __m512i& lo, __m512i& hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i raw = _mm512_loadu_si512(sub + g * 64);
  lo = _mm512_and_si512(raw, low4);
  hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
  if constexpr (K == kQ5K || K == kQ6K) {
    constexpr bool six = K == kQ6K;
    const __m512i v = _mm512_loadu_si512(high_bits_at(sub, g, six));
    const int bit = high_bit(g, six);
    lo = _mm512_or_si512(lo, to_bit4(v, bit, six));
    hi = _mm512_or_si512(hi, to_bit4(v, bit + (six ? 2 : 1), six));
  }
}

// The activation operand of block_sums: dword i (k 4i..4i + 3) of row r's block, broadcast (Q8 weights: q + 128,
// else q). Held: loaded once for a tile's several column blocks; else a load at each use.
template <Kind K, int MR, bool Held>
struct BlockActs {
  const uint8_t* p;
  __m512i held[Held ? MR : 1][Held ? 8 : 1];
  BlockActs(const RowsQ& rq, int64_t at)
      : p(K == kQ8 ? rq.u.data() + at * kBlockK : reinterpret_cast<const uint8_t*>(rq.q.data()) + at * kBlockK) {
    if constexpr (Held)
      for (int r = 0; r < MR; ++r)
        for (int i = 0; i < 8; ++i) held[r][i] = bcast4(p + r * kBlockK + 4 * i);
  }
  __m512i operator()(int r, int i) const {
    if constexpr (Held) return held[r][i];
    return bcast4(p + r * kBlockK + 4 * i);
  }
  // acc += u · (signed) dword i of row r. Not held, the dword is vpdpbusd's own broadcast operand ({1to16}): GCC
  // does not fold the intrinsic's broadcast into it, and the separate vpbroadcastd costs 3-6% at 16-64 rows.
  void dot(__m512i& acc, __m512i u, int r, int i) const {
    if constexpr (Held) {
      acc = _mm512_dpbusd_epi32(acc, u, held[r][i]);
    } else {
      const auto* at = static_cast<const unaligned_i32*>(static_cast<const void*>(p + r * kBlockK + 4 * i));
      asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*at));
    }
  }
};

// The MR rows' exact int32 dot products with one column block's 32-k sub-cell `qs` (k block b): Q8 (q + 128)·w -
// 128·Σw; Q4 q·x - 8·Σx; Q4Min and Q4K / Q5K q·x; Q6K sc₀(isum₀ - 32·Σx₀) + sc₁(isum₁ - 32·Σx₁) over its 16-k halves.
// Integer sums are exact, so where a correction enters (as the starting value here) cannot change them.
template <Kind K, int MR, class Acts512>
inline void block_sums(const Weights& w, const RowsQ& rq, const uint8_t* qs, int64_t at, const Acts512& x,
                       __m512i (&isum)[MR]) {
  if constexpr (K == kQ8) {
    const __m512i ws = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.wsum(qs))));
    const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(ws, 7));
    for (int r = 0; r < MR; ++r) isum[r] = start;
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      const __m512i wv = _mm512_loadu_si512(qs + s * 64);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) isum[r] = _mm512_dpbusd_epi32(isum[r], x(r, s), wv);
    }
  } else {
    __m512i half0[K == kQ6K ? MR : 1];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      isum[r] = K == kQ4 ? _mm512_set1_epi32(rq.q4start[at + r])
                         : K == kQ6K ? _mm512_set1_epi32(rq.q6start[2 * (at + r)]) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      if (K == kQ6K && g == 2) {  // the first 16-k half is complete: scale it, start the second
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.ksc(qs))));
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          half0[r] = _mm512_mullo_epi32(isum[r], sc);
          isum[r] = _mm512_set1_epi32(rq.q6start[2 * (at + r) + 1]);
        }
      }
      __m512i lo, hi;
      unpack_group<K>(qs, g, lo, hi);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        x.dot(isum[r], lo, r, 2 * g);
        x.dot(isum[r], hi, r, 2 * g + 1);
      }
    }
    if constexpr (K == kQ6K) {
      const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.ksc(qs) + 16)));
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) isum[r] = _mm512_add_epi32(_mm512_mullo_epi32(isum[r], sc), half0[r]);
    }
  }
}

// The fp32 steps of k block b for column block `block`, per element in the fixed order of the file's head comment:
// acc += (float(isum)·d)·dx (Q4Min: then += m·sx); Q4K / Q5K acc += ((float(isum)·D) - (float(Σx)·M))·dx with D =
// d·sc and M = dmin·m exact (model/kquant.py); Q6K acc += (float(isum)·d)·dx.
template <Kind K, int MR>
inline void block_steps(const Weights& w, const RowsQ& rq, const uint8_t* qs, int64_t block, int64_t b, int64_t at,
                        const __m512i (&isum)[MR], __m512 (&acc)[MR]) {
  const float* dx = rq.dx.data() + at;
  if constexpr (K == kQ4K || K == kQ5K || K == kQ6K) {
    const uint16_t* dd = w.kd(block, b);
    const __m512 d = half16(dd);
    if constexpr (K == kQ6K) {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r]), d);
        acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(f, _mm512_set1_ps(dx[r])));
      }
    } else {
      const uint8_t* sc = w.ksc(qs);
      const __m512 dsc = _mm512_mul_ps(widen16(sc), d), mmin = _mm512_mul_ps(widen16(sc + 16), half16(dd + 16));
      const float* fsum = rq.fsum.data() + at;
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 sums = _mm512_mul_ps(_mm512_set1_ps(fsum[r]), mmin);
        const __m512 f = _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum[r]), dsc), sums);
        acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(f, _mm512_set1_ps(dx[r])));
      }
    }
  } else {
    const __m512 dw = w.has_d ? half16(w.d(qs)) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      __m512 f = _mm512_cvtepi32_ps(isum[r]);
      if (w.has_d) f = _mm512_mul_ps(f, dw);
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(f, _mm512_set1_ps(dx[r])));
    }
    if constexpr (K == kQ4Min) {
      const __m512 mw = half16(w.m(qs));
      const float* sx = rq.sx.data() + at;
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(mw, _mm512_set1_ps(sx[r])));
    }
  }
}

// Register tile: MR rows × NB column blocks (16 columns each), every k block in order. A block's MR integer sums
// live only while they are scaled, so the registers go to the accumulators: each weight block is loaded and unpacked
// once for MR rows, each activation group is a broadcast operand of vpdpbusd. Few rows take several column blocks,
// whose independent sums keep the multiply units busy while one row's weights stream in.
template <Kind K, int MR, int NB>
void tile512(const Weights& w, const RowsQ& rq, int64_t row0, int64_t block0, float* out) {
  __m512 acc[NB][MR];
  for (int j = 0; j < NB; ++j)
    for (int r = 0; r < MR; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < rq.kblocks; ++b) {
    const int64_t at = rq.slot(row0, b);  // the group's rows side by side from here (row0 starts a group)
    const BlockActs<K, MR, (NB > 1)> x(rq, at);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const uint8_t* qs = w.cell(block0 + j, b);
      __m512i isum[MR];
      block_sums<K, MR>(w, rq, qs, at, x, isum);
      block_steps<K, MR>(w, rq, qs, block0 + j, b, at, isum, acc[j]);
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int64_t col = (block0 + j) * kCols, left = w.out_features - col;
    const __mmask16 mask = left >= kCols ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    for (int r = 0; r < MR; ++r) {
      __m512 v = acc[j][r];
      if (w.scale) v = _mm512_mul_ps(v, _mm512_loadu_ps(w.scale + col));
      if (w.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(w.bias + col));
      _mm512_mask_storeu_ps(out + (row0 + r) * w.out_features + col, mask, v);
    }
  }
}
#endif

#if KEV_QUANT_AVX2
// Four signed-byte products summed per int32 lane: vpdpbusd where AVX-VNNI exists, else vpmaddubsw + vpmaddwd (no
// saturation here: the unsigned side is at most 15 for Q4 and 128 (|w|) for Q8, the signed side at most 127).
inline __m256i dot4(__m256i acc, __m256i u8, __m256i s8) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u8, s8);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
#endif
}

// K-quants on one 8-column half (at: 0 or 8) of a sub-cell: Q6K's scaled half sums, then the fp32 steps as ksteps512.
template <int MR, int NJ>
inline void ksteps256(const Weights& w, const RowsQ& rq, int64_t row0, const uint8_t* cell, const uint16_t* dd,
                      int64_t at, int64_t b, const __m256i (&isum)[MR], __m256 (&acc)[MR][NJ], int j) {
  const int64_t kblocks = w.kblocks;
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dd + at)));
  const uint8_t* sc = w.ksc(cell) + at;
  const auto load8 = [](const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); };
  if (w.kind == kQ6K) {
    for (int r = 0; r < MR; ++r) {
      const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[r]), d);
      acc[r][j] = _mm256_add_ps(acc[r][j], _mm256_mul_ps(f, _mm256_set1_ps(rq.dx[rq.slot(row0 + r, b)])));
    }
    return;
  }
  const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dd + 16 + at)));
  const __m256 dsc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(sc))), d);
  const __m256 mmin = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(sc + 16))), dmin);
  for (int r = 0; r < MR; ++r) {
    const int64_t i = rq.slot(row0 + r, b);
    const __m256 sums = _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(rq.qsum[i])), mmin);
    const __m256 f = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum[r]), dsc), sums);
    acc[r][j] = _mm256_add_ps(acc[r][j], _mm256_mul_ps(f, _mm256_set1_ps(rq.dx[i])));
  }
}

// Q6K on one 8-column half: sc·(isum - 32·qsum16) of 16-k half h.
template <int MR>
inline void half256(const Weights& w, const RowsQ& rq, int64_t row0, const uint8_t* cell, int64_t at, int64_t b,
                    int h, const __m256i (&isum)[MR], __m256i (&into)[MR]) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.ksc(cell) + 16 * h + at));
  const __m256i scale = _mm256_cvtepi8_epi32(raw);
  for (int r = 0; r < MR; ++r) {
    const __m256i c = _mm256_set1_epi32(32 * rq.qsum16[2 * rq.slot(row0 + r, b) + h]);
    into[r] = _mm256_mullo_epi32(_mm256_sub_epi32(isum[r], c), scale);
  }
}

// The same tile on 256 bits: each 16-column block is two halves of 8 columns, each half the same sums, one half at a
// time over all of K (an element's blocks still add in k order). One tile per kind: with the kind a constant, the
// compiler drops the other kinds' branches and layout arithmetic from the inner loops (1.1-1.25x on one Zen 3 thread
// at M >= 8 against one tile reading w.kind at run time).
template <Kind K, int NB, int MR>
void tile256(const Weights& weights, const RowsQ& rq, int64_t row0, int64_t block0, float* out) {
  // 4-bit quants (0..15) times int8 (|x| <= 127): a pair sum is at most 3,810, so a block's 8 pair sums per lane
  // add up exactly in int16 (<= 30,480), widened once per block instead of once per 4 k (without VNNI).
#if defined(__AVXVNNI__)
  constexpr bool kPairSums16 = false;
#else
  constexpr bool kPairSums16 = K == kQ4 || K == kQ4Min || K == kQ4K;
#endif
  Weights w = weights;
  w.kind = K;
  w.per_shift = K >= kQ4K ? 3 : 0;  // as layout_of has it
  __m256 acc[MR][2 * NB];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 2 * NB; ++j) acc[r][j] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < 2 * NB; ++j) {
    for (int64_t b = 0; b < rq.kblocks; ++b) {
      const uint8_t* cell = w.cell(block0 + j / 2, b);
      const uint8_t* qs = cell + (j % 2) * 32;
      __m256i isum[MR];
      for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
      if (w.kind == kQ8) {  // |w| · (x with w's sign): the plain sum x · w
        for (int s = 0; s < 8; ++s) {
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + s * 64));
          const __m256i wabs = _mm256_sign_epi8(wv, wv);
          for (int r = 0; r < MR; ++r) {
            int32_t xs;
            std::memcpy(&xs, rq.quants(row0 + r, b) + s * 4, 4);
            isum[r] = dot4(isum[r], wabs, _mm256_sign_epi8(_mm256_set1_epi32(xs), wv));
          }
        }
      } else {
        __m256i half0[MR], pairs[MR];
        for (int r = 0; r < MR; ++r) pairs[r] = _mm256_setzero_si256();
        for (int g = 0; g < 4; ++g) {
          if (w.kind == kQ6K && g == 2) {
            half256<MR>(w, rq, row0, cell, (j % 2) * 8, b, 0, isum, half0);
            for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
          }
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + g * 64));
          __m256i lo = _mm256_and_si256(raw, low4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
          if (w.plane_bytes()) {  // this half's 32 positions of the 64
            const bool six = w.kind == kQ6K;
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high_bits_at(cell, g, six) +
                                                                                   (j % 2) * 32));
            const int bit = high_bit(g, six);
            lo = _mm256_or_si256(lo, to_bit4(v, bit, six));
            hi = _mm256_or_si256(hi, to_bit4(v, bit + (six ? 2 : 1), six));
          }
          for (int r = 0; r < MR; ++r) {
            int32_t x0, x1;
            const int8_t* xr = rq.quants(row0 + r, b) + g * 8;
            std::memcpy(&x0, xr, 4), std::memcpy(&x1, xr + 4, 4);
            if constexpr (kPairSums16) {
              pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x0)));
              pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x1)));
            } else {
              isum[r] = dot4(isum[r], lo, _mm256_set1_epi32(x0));
              isum[r] = dot4(isum[r], hi, _mm256_set1_epi32(x1));
            }
          }
        }
        if constexpr (kPairSums16)
          for (int r = 0; r < MR; ++r) isum[r] = _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1));
        if (w.kind == kQ4)
          for (int r = 0; r < MR; ++r)
            isum[r] = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(rq.qsum[rq.slot(row0 + r, b)] * 8));
        if (w.kind == kQ6K) {
          half256<MR>(w, rq, row0, cell, (j % 2) * 8, b, 1, isum, isum);
          for (int r = 0; r < MR; ++r) isum[r] = _mm256_add_epi32(isum[r], half0[r]);
        }
      }
      const int64_t at = (j % 2) * 8;
      if (w.kquant()) {
        ksteps256<MR, 2 * NB>(w, rq, row0, cell, w.kd(block0 + j / 2, b), at, b, isum, acc, j);
        continue;
      }
      const __m256 dw = w.has_d ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d(cell) + at)))
                                : _mm256_setzero_ps();
      for (int r = 0; r < MR; ++r) {
        __m256 f = _mm256_cvtepi32_ps(isum[r]);
        if (w.has_d) f = _mm256_mul_ps(f, dw);
        f = _mm256_mul_ps(f, _mm256_set1_ps(rq.dx[rq.slot(row0 + r, b)]));
        acc[r][j] = _mm256_add_ps(acc[r][j], f);
      }
      if (w.kind == kQ4Min) {
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.m(cell) + at)));
        for (int r = 0; r < MR; ++r)
          acc[r][j] = _mm256_add_ps(acc[r][j], _mm256_mul_ps(mw, _mm256_set1_ps(rq.sx[rq.slot(row0 + r, b)])));
      }
    }
  }
  for (int j = 0; j < 2 * NB; ++j) {
    const int64_t col = (block0 + j / 2) * kCols + (j % 2) * 8;
    const int64_t left = std::min<int64_t>(8, w.out_features - col);
    if (left <= 0) break;
    for (int r = 0; r < MR; ++r) {
      __m256 v = acc[r][j];
      if (w.scale) v = _mm256_mul_ps(v, _mm256_loadu_ps(w.scale + col));
      if (w.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(w.bias + col));
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, v);
      std::memcpy(out + (row0 + r) * w.out_features + col, tmp, left * sizeof(float));
    }
  }
}
#endif


// Rows and column blocks per register tile: the accumulators and integer sums must fit the 32 (AVX2: 16) vector
// registers. AVX-512 gives them to rows (tile512). AVX2 walks one 8-column half at a time over all of K (tile256), so
// a tile holds one accumulator and one integer sum per row: 6 rows share each unpacked weight vector (4 rows: 5%
// slower at M = 64 on Zen 3); the blocks (each two halves) only say how many columns a call covers.
struct TileShape {
  int rows, blocks;
};
TileShape tile_shape(Path path, int64_t rows) {
  if (path == kAvx512) return rows < 3 ? TileShape{static_cast<int>(rows), kBlocks512} : TileShape{kRows512, 1};
  return {kMaxRows, rows <= 2 ? 4 : 2};
}

// The tile for (kind, column blocks, rows) on a path; null when the path is not built. AVX-512 has every row count
// with one column block, and one or two rows with kBlocks512 (narrower tails run one block at a time).
TileFn pick_tile(Path path, Kind kind, int nb, int mr) {
#if KEV_QUANT_AVX512
#define KEV_ROWS(K)                                                                                                \
  {tile512<K, 1, 1>, tile512<K, 2, 1>, tile512<K, 3, 1>, tile512<K, 4, 1>, tile512<K, 5, 1>, tile512<K, 6, 1>,    \
   tile512<K, 7, 1>, tile512<K, 8, 1>, tile512<K, 1, kBlocks512>, tile512<K, 2, kBlocks512>}
  static const TileFn table512[6][kRows512 + 2] = {KEV_ROWS(kQ8), KEV_ROWS(kQ4), KEV_ROWS(kQ4Min),
                                                   KEV_ROWS(kQ4K), KEV_ROWS(kQ5K), KEV_ROWS(kQ6K)};
#undef KEV_ROWS
  if (path == kAvx512) {
    if (nb == 1) return table512[kind][mr - 1];
    return nb == kBlocks512 && mr <= 2 ? table512[kind][kRows512 + mr - 1] : nullptr;
  }
#endif
#if KEV_QUANT_AVX2
#define KEV_ROW(K, nb) {tile256<K, nb, 1>, tile256<K, nb, 2>, tile256<K, nb, 3>, tile256<K, nb, 4>, tile256<K, nb, 5>, tile256<K, nb, 6>}
#define KEV_KIND(K) {KEV_ROW(K, 1), KEV_ROW(K, 2), KEV_ROW(K, 3), KEV_ROW(K, 4)}
  static const TileFn table256[6][kMaxBlocks][kMaxRows] = {KEV_KIND(kQ8), KEV_KIND(kQ4), KEV_KIND(kQ4Min),
                                                            KEV_KIND(kQ4K), KEV_KIND(kQ5K), KEV_KIND(kQ6K)};
#undef KEV_KIND
#undef KEV_ROW
  if (path == kAvx2) return table256[kind][nb - 1][mr - 1];
#endif
  (void)kind, (void)nb, (void)mr;
  return nullptr;
}

Path best_path() {
#if KEV_QUANT_AVX512
  return kAvx512;
#elif KEV_QUANT_AVX2
  return kAvx2;
#else
  return kAuto;
#endif
}

}  // namespace

LinearOutput LinearOutput::make(const at::Tensor& x, int64_t out_features, bool like_x, bool kernel_rounds) {
  LinearOutput o;
  o.dtype = like_x ? x.scalar_type() : at::kFloat;
  o.fp32 = nullptr, o.rounded = nullptr;
  if (o.dtype == at::kBFloat16) {
    o.rounded_out = at::empty({x.size(0), out_features}, x.options());
    o.rounded = reinterpret_cast<uint16_t*>(o.rounded_out.data_ptr<at::BFloat16>());
    if (kernel_rounds) return o;
  }
  o.sums = at::empty({x.size(0), out_features}, x.options().dtype(at::kFloat));
  o.fp32 = o.sums.data_ptr<float>();
  return o;
}

void LinearOutput::finish_columns(int64_t c0, int64_t c1) const {
  if (rounded && fp32) round_to_bf16(fp32, rounded, sums.size(0), sums.size(1), c0, std::min(c1, sums.size(1)));
}

// x: [M, K] bf16 / fp32 (K a multiple of 32); cells: the packed weight as above. Returns fp32 [M, out_features], or
// with like_x x's dtype (LinearOutput). path: 0 the best built, 1 AVX-512 VNNI, 2 AVX2 (tests force each to compare
// their bits).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& cells, const c10::optional<at::Tensor>& scale,
                        const c10::optional<at::Tensor>& bias, int64_t out_features, int64_t path, bool like_x) {
  TORCH_CHECK(cells.scalar_type() == at::kByte && cells.dim() == 3, "kev::quant_linear: cells must be uint8 3-d");
  if (is_w8a8_cells(cells)) return w8a8_linear(x, cells, scale, bias, out_features, path, like_x);  // w8a8_gemm.cpp
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % kBlockK == 0,
              "kev::quant_linear: x must be a contiguous [rows, K] matrix with K a multiple of 32");
  const int64_t kblocks = x.size(1) / kBlockK;
  const Layout layout = layout_of(cells.size(2));
  const int64_t kind = layout.kind;
  const bool has_d = layout.has_d;
  TORCH_CHECK(kind >= 0, "kev::quant_linear: no layout has ", cells.size(2), "-byte cells");
  const int64_t per_cell = int64_t{1} << layout.per_shift;
  TORCH_CHECK(cells.is_contiguous() && kblocks % per_cell == 0 && cells.size(1) == kblocks / per_cell &&
                  cells.size(0) * kCols >= out_features,
              "kev::quant_linear: packed cells must be uint8 [column blocks, K/32 (K-quants: K/256), cell bytes]");
  const auto ptr = [](const c10::optional<at::Tensor>& t) -> const float* {
    return t && t->defined() ? t->data_ptr<float>() : nullptr;
  };
  TORCH_CHECK(has_d != (ptr(scale) != nullptr), "kev::quant_linear: a per-column scale exactly when cells have no d");
  const Path chosen = path == kAuto ? best_path() : static_cast<Path>(path);
  TORCH_CHECK(pick_tile(chosen, static_cast<Kind>(kind), 1, 1) != nullptr, "kev::quant_linear: path ", path,
              " is not built on this CPU");
  const Weights w{cells.data_ptr<uint8_t>(), cells.size(2), static_cast<Kind>(kind), has_d, ptr(scale), ptr(bias),
                  kblocks, out_features, layout.per_shift, layout.sub_bytes};
  const int64_t rows = x.size(0), blocks = (out_features + kCols - 1) / kCols;
  const LinearOutput result = LinearOutput::make(x, out_features, like_x);
  if (rows == 0) return result.done();
  const RowsQ rq = quantize_rows(x);
  float* op = result.fp32;
  // Column blocks split over threads; a thread gets enough weight bytes to pay for waking it (256 KiB: at 1 MiB
  // every layer of the default model ran on one thread below 4 rows; bench/results/kquant_speed.md).
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 18) / (w.block_stride() * (1 + rows / 4)));
  const TileShape shape = tile_shape(chosen, rows);
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end;) {
      // A tail narrower than the shape runs one block at a time (AVX2 has every width).
      const int nb = end - block >= shape.blocks ? shape.blocks : chosen == kAvx2 ? static_cast<int>(end - block) : 1;
      for (int64_t row0 = 0; row0 < rows; row0 += shape.rows) {
        const int mr = static_cast<int>(std::min<int64_t>(shape.rows, rows - row0));
        pick_tile(chosen, w.kind, nb, mr)(w, rq, row0, block, op);
      }
      result.finish_columns(block * kCols, (block + nb) * kCols);  // while its sums are in cache (ops.h)
      block += nb;
    }
  });
  return result.done();
}

// Names of the paths built here, best first ("avx512-vnni", "avx2" or "avx2-vnni"); empty: torch's fallback.
std::vector<std::string> quant_linear_paths() {
  std::vector<std::string> paths;
#if KEV_QUANT_AVX512
  paths.emplace_back("avx512-vnni");
#endif
#if KEV_QUANT_AVX2
#if defined(__AVXVNNI__)
  paths.emplace_back("avx2-vnni");
#else
  paths.emplace_back("avx2");
#endif
#endif
  return paths;
}

// The activation quantization alone (tests and the torch fallback's check): (q int8 [M, K], dx fp32 [M, K/32]).
std::tuple<at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % kBlockK == 0,
              "kev::quantize_activations: x must be a contiguous [rows, K] matrix with K a multiple of 32");
  const RowsQ rq = quantize_rows(x);
  auto q = at::empty({x.size(0), x.size(1)}, x.options().dtype(at::kChar));
  auto dx = at::empty({x.size(0), x.size(1) / kBlockK}, x.options().dtype(at::kFloat));
  for (int64_t m = 0; m < x.size(0); ++m)
    for (int64_t b = 0; b < rq.kblocks; ++b) {
      std::memcpy(q.data_ptr<int8_t>() + (m * rq.kblocks + b) * kBlockK, rq.quants(m, b), kBlockK);
      dx.data_ptr<float>()[m * rq.kblocks + b] = rq.dx[rq.slot(m, b)];
    }
  return {q, dx};
}

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("quant_linear(Tensor x, Tensor cells, Tensor? scale, Tensor? bias, int out_features, int path=0, bool like_x=False) -> Tensor");
  m.def("quant_linear_paths() -> str[]", &kev::quant_linear_paths);
  m.def("quantize_activations(Tensor x) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kev, CPU, m) {
  m.impl("quant_linear", &kev::quant_linear);
  m.impl("quantize_activations", &kev::quantize_activations);
}
