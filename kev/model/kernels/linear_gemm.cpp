// Kev's linear layer for CPUs with AVX-512: y = x Wᵀ + b, every row's bits independent of the others.
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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define KEV_HAS_GEMM 1
#else
#define KEV_HAS_GEMM 0
#endif

namespace kev {

#if KEV_HAS_GEMM

constexpr int kBlock = 16;  // output columns per packed block (one zmm of fp32)
constexpr int kMaxRows = 6;
constexpr int64_t kMinThreadWork = int64_t{2} << 20;  // bytes-equivalent per thread, see linear()

// bf16: x rows are read as int32 pairs (x[2k], x[2k+1]); packed weights [blocks][K/2][16] pairs.
struct Bf16 {
  using In = at::BFloat16;
  using Step = int32_t;  // one k step: a pair of bf16
  static __m512 madd(__m512 acc, Step x, const Step* w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(x), (__m512bh)_mm512_loadu_si512(w));
  }
  static void store(at::BFloat16* out, __m512 v, __mmask16 mask) {
    const __m256i packed = (__m256i)_mm512_cvtneps_pbh(v);
    _mm256_mask_storeu_epi16(out, mask, packed);
  }
};

// fp32: packed weights [blocks][K][16].
struct Fp32 {
  using In = float;
  using Step = float;
  static __m512 madd(__m512 acc, Step x, const Step* w) {
    return _mm512_fmadd_ps(_mm512_set1_ps(x), _mm512_loadu_ps(w), acc);
  }
  static void store(float* out, __m512 v, __mmask16 mask) { _mm512_mask_storeu_ps(out, mask, v); }
};

template <typename T, int NB, int MR>
void tile(const typename T::Step* const* x, const typename T::Step* w, int64_t steps, const float* bias,
          typename T::In* const* out, int64_t valid) {
  __m512 acc[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < steps; ++k) {
    for (int m = 0; m < MR; ++m) {
      const typename T::Step xk = x[m][k];
      for (int j = 0; j < NB; ++j) acc[m][j] = T::madd(acc[m][j], xk, w + (j * steps + k) * kBlock);
    }
  }
  for (int j = 0; j < NB; ++j) {
    const int64_t left = valid - j * kBlock;
    if (left <= 0) break;
    const __mmask16 mask = left >= kBlock ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    const __m512 b = bias ? _mm512_loadu_ps(bias + j * kBlock) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) T::store(out[m] + j * kBlock, _mm512_add_ps(acc[m][j], b), mask);
  }
}

template <typename T, int NB>
void rows_tile(int rows, const typename T::Step* const* x, const typename T::Step* w, int64_t steps,
               const float* bias, typename T::In* const* out, int64_t valid) {
  switch (rows) {
    case 1: tile<T, NB, 1>(x, w, steps, bias, out, valid); break;
    case 2: tile<T, NB, 2>(x, w, steps, bias, out, valid); break;
    case 3: tile<T, NB, 3>(x, w, steps, bias, out, valid); break;
    case 4: tile<T, NB, 4>(x, w, steps, bias, out, valid); break;
    case 5: tile<T, NB, 5>(x, w, steps, bias, out, valid); break;
    default: tile<T, NB, 6>(x, w, steps, bias, out, valid); break;
  }
}

// Columns [first block, +blocks) of every row.
template <typename T>
void column_range(const typename T::Step* xp, const typename T::Step* wp, const float* bp, typename T::In* op,
                  int64_t rows, int64_t steps, int64_t out_features, int64_t first, int64_t end) {
  const typename T::Step* x[kMaxRows];
  typename T::In* out[kMaxRows];
  const int wide = rows <= 2 ? 8 : 4;
  for (int64_t block = first; block < end;) {
    const int nb = static_cast<int>(std::min<int64_t>(wide, end - block));
    const typename T::Step* w = wp + block * steps * kBlock;
    const float* bias = bp ? bp + block * kBlock : nullptr;
    const int64_t valid = out_features - block * kBlock;
    for (int64_t m0 = 0; m0 < rows; m0 += kMaxRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, rows - m0));
      for (int r = 0; r < mr; ++r) {
        x[r] = xp + (m0 + r) * steps;
        out[r] = op + (m0 + r) * out_features + block * kBlock;
      }
      switch (nb) {
        case 8:  // only when rows <= 2
          if (mr == 1) tile<T, 8, 1>(x, w, steps, bias, out, valid);
          else tile<T, 8, 2>(x, w, steps, bias, out, valid);
          break;
        case 7: rows_tile<T, 7>(mr, x, w, steps, bias, out, valid); break;
        case 6: rows_tile<T, 6>(mr, x, w, steps, bias, out, valid); break;
        case 5: rows_tile<T, 5>(mr, x, w, steps, bias, out, valid); break;
        case 4: rows_tile<T, 4>(mr, x, w, steps, bias, out, valid); break;
        case 3: rows_tile<T, 3>(mr, x, w, steps, bias, out, valid); break;
        case 2: rows_tile<T, 2>(mr, x, w, steps, bias, out, valid); break;
        default: rows_tile<T, 1>(mr, x, w, steps, bias, out, valid); break;
      }
    }
    block += nb;
  }
}

#endif  // KEV_HAS_GEMM

// x: [M, K] (bf16 or fp32, contiguous); packed: from pack_linear_weight; bias: fp32 padded to the
// packed width, or none. Returns [M, out_features] in x's dtype.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                  int64_t out_features) {
#if KEV_HAS_GEMM
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "kev::linear: x must be a contiguous [rows, in_features] matrix");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kBlock, "kev::linear: packed weight must be [blocks, k, 16]");
  TORCH_CHECK(packed.size(0) * kBlock >= out_features, "kev::linear: out_features exceeds the packed blocks");
  const int64_t rows = x.size(0), steps = packed.size(1);
  const int64_t blocks = (out_features + kBlock - 1) / kBlock;
  const float* bp = bias && bias->defined() ? bias->data_ptr<float>() : nullptr;
  auto out = at::empty({rows, out_features}, x.options());
  if (rows == 0) return out;
  // Columns split over threads only where each thread gets enough work to pay for waking another: with
  // OMP_WAIT_POLICY=PASSIVE (Kev's default, for busy neighbours) a wake costs ~40 us here, more than a
  // small decode GEMM takes on one thread. Work of a block: its weight bytes, streamed once, plus its
  // multiply-adds (about one byte-equivalent per 4 rows).
  const int64_t block_bytes = kBlock * x.size(1) * x.element_size();
  const int64_t grain = std::max<int64_t>(8, kMinThreadWork / (block_bytes * (1 + rows / 4)));
  if (x.scalar_type() == at::kBFloat16) {
    TORCH_CHECK(packed.scalar_type() == at::kInt && steps * 2 == x.size(1), "kev::linear: bf16 x needs a bf16-packed weight of the same K");
    const auto* xp = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
    const int32_t* wp = packed.data_ptr<int32_t>();
    at::BFloat16* op = out.data_ptr<at::BFloat16>();
    at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
      column_range<Bf16>(xp, wp, bp, op, rows, steps, out_features, begin, end);
    });
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && steps == x.size(1),
                "kev::linear: fp32 x needs an fp32-packed weight of the same K");
    const float* xp = x.data_ptr<float>();
    const float* wp = packed.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
      column_range<Fp32>(xp, wp, bp, op, rows, steps, out_features, begin, end);
    });
  }
  return out;
#else
  TORCH_CHECK(false, "kev::linear needs AVX-512 with BF16 (built without it)");
#endif
}

bool linear_available() { return KEV_HAS_GEMM; }

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  m.def("linear_available() -> bool", &kev::linear_available);
}

TORCH_LIBRARY_IMPL(kev, CPU, m) { m.impl("linear", &kev::linear); }
