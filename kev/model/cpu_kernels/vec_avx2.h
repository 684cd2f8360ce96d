// 8-lane helpers for the kernels' AVX2 + FMA paths (KEV_AVX2: built where -march=native has AVX2, FMA and F16C).
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KEV_AVX2 1
#include <ATen/ATen.h>
#include <immintrin.h>

namespace kev {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {  // the bf16 bits are the top half of the fp32's
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline __m256 load8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// One rounding to the dtype, the same value as its scalar conversion: fp16 and bf16 round to nearest even (bf16 on
// the bits, NaN kept quiet, as row_ops.cpp's from_f).
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(at::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store8(at::BFloat16* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);  // 8 x 16 bits, in order
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// exp_approx (vec_math.h) on 8 lanes: the same range reduction and polynomial, each step a separate mul or add.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 shifter = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), shifter),
                                 shifter);
  const __m256 r = _mm256_add_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.3981999507e-3f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace kev
#else
#define KEV_AVX2 0
#endif
