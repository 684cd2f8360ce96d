// Paged attention for the CPU: decode rows and short prefill chunks, keys read in place from the paged
// cache through the channel's own slot list. Each (channel, kv head) is one task computed start to
// end by one thread in a fixed order, so a channel's bits depend only on its own query and keys:
// never on which channels share the call, how many threads run, or where the row sits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "vec_avx2.h"
#if KEV_AVX2 && !defined(__AVX512F__)
#define KEV_ATTENTION_AVX2 1  // the AVX-512 kernels where there are, else the 8-lane ones
#else
#define KEV_ATTENTION_AVX2 0
#endif

#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace kev {

constexpr int kLanes = 16;
constexpr int64_t kMinParallelKeyReads = 8192;  // (query head, key) pairs; below: one thread

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const at::BFloat16* p, int64_t i) {
  uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[i]) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline float load(const at::Half* p, int64_t i) { return static_cast<float>(p[i]); }


// One row of dim values as fp32 (dim a multiple of 16 takes the vector path).
template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] = load(src, d);
}
#if defined(__AVX512F__)
template <>
inline void to_float<at::BFloat16>(const at::BFloat16* src, float* dst, int64_t n) {
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + d));
    _mm512_storeu_ps(dst + d, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16)));
  }
  for (; d < n; ++d) dst[d] = load(src, d);
}

inline float dot(const float* a, const float* b, int64_t n) {
  if (n % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
    return _mm512_reduce_add_ps(acc);
  }
  float lanes[kLanes] = {0.0f};
#else
inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {0.0f};
#endif
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[d + l] * b[d + l];
  for (; d < n; ++d) lanes[d % kLanes] += a[d] * b[d];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}


// Each row of scores [rows, length] becomes exp(s - max) in place (normalised later by its sum).
inline void softmax_rows(float* scores, int64_t rows, int64_t length) {
  for (int64_t g = 0; g < rows; ++g) {
    float* s = scores + g * length;
    float top = s[0];
    int64_t t = 1;
#if defined(__AVX512F__)
    __m512 tops = _mm512_set1_ps(top);  // a maximum is exact in any order: 16 lanes, then across them
    for (; t + 16 <= length; t += 16) tops = _mm512_max_ps(tops, _mm512_loadu_ps(s + t));
    top = _mm512_reduce_max_ps(tops);
#endif
    for (; t < length; ++t) top = s[t] > top ? s[t] : top;
    for (t = 0; t < length; ++t) s[t] = kev::exp_approx(s[t] - top);
  }
}

// Keys asked for ahead of their use (a prefetch: it changes no arithmetic, so no bits), and the call to ask for one
// row's cache lines. Into L2, not L1 (locality 2: prefetcht1): L1's few miss buffers dropped most of a tile's
// requests, so the loads still waited on memory; into L2 the 64 channels x 100 keys x 30 layers decode call
// (bench/decode_attention_speed.py, one thread, Zen 4) went from 25.8 to 13.8 ms.
constexpr int64_t kAhead = 16;
inline void fetch_row(const void* row, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(static_cast<const char*>(row) + at, 0, 2);
}

// The same task for any dim and dtype, through fp32 row buffers.
template <typename T>
void task_scalar(const float* query, const T* k_ptr, const T* v_ptr, const int64_t* slots, int64_t length,
                 int64_t kv_heads, int64_t kv_head, int64_t group, int64_t dim, float scale, float* scores, float* acc,
                 float* row) {
  for (int64_t t = 0; t < length; ++t) {
    to_float(k_ptr + (slots[t] * kv_heads + kv_head) * dim, row, dim);
    for (int64_t g = 0; g < group; ++g) scores[g * length + t] = dot(query + g * dim, row, dim) * scale;
  }
  softmax_rows(scores, group, length);
  for (int64_t i = 0; i < group * dim; ++i) acc[i] = 0.0f;
  for (int64_t t = 0; t < length; ++t) {
    to_float(v_ptr + (slots[t] * kv_heads + kv_head) * dim, row, dim);
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * length + t];
      for (int64_t d = 0; d < dim; ++d) acc[g * dim + d] += p * row[d];
    }
  }
}

#if defined(__AVX512F__)
inline __m512 load16(const at::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

// One (channel, kv head) task with the key/value rows held in registers (dim = 16 * kVec, kVec <= 8).
template <typename T, int kVec>
void task_vector(const float* query, const T* k_ptr, const T* v_ptr, const int64_t* slots, int64_t length,
                 int64_t kv_heads, int64_t kv_head, int64_t group, float scale, float* scores, float* acc) {
  constexpr int64_t dim = 16 * kVec;
  for (int64_t t = 0; t < length; ++t) {
    const T* key = k_ptr + (slots[t] * kv_heads + kv_head) * dim;
    __m512 k[kVec];
    for (int v = 0; v < kVec; ++v) k[v] = load16(key + 16 * v);
    for (int64_t g = 0; g < group; ++g) {
      __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(query + g * dim), k[0]);
      for (int v = 1; v < kVec; ++v) sum = _mm512_fmadd_ps(_mm512_loadu_ps(query + g * dim + 16 * v), k[v], sum);
      scores[g * length + t] = _mm512_reduce_add_ps(sum) * scale;
    }
  }
  softmax_rows(scores, group, length);
  for (int64_t i = 0; i < group * dim; ++i) acc[i] = 0.0f;
  for (int64_t t = 0; t < length; ++t) {
    const T* value = v_ptr + (slots[t] * kv_heads + kv_head) * dim;
    __m512 x[kVec];
    for (int v = 0; v < kVec; ++v) x[v] = load16(value + 16 * v);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * length + t]);
      for (int v = 0; v < kVec; ++v) {
        float* a = acc + g * dim + 16 * v;
        _mm512_storeu_ps(a, _mm512_fmadd_ps(p, x[v], _mm512_loadu_ps(a)));
      }
    }
  }
}


// One (channel, kv head) task with the group's G queries and their outputs in registers
// (G * kVec <= 24 of the 32 zmm): scores 16 keys at a time, then values. Every step's order is
// fixed by the channel's own length, never by other channels.
template <typename T, int kVec, int G>
void task_group(const float* query, const T* k_ptr, const T* v_ptr, const int64_t* slots, int64_t length,
                int64_t kv_heads, int64_t kv_head, float scale, float* scores, float* acc) {
  constexpr int64_t dim = 16 * kVec;
  __m512 q[G][kVec];
  for (int g = 0; g < G; ++g)
    for (int v = 0; v < kVec; ++v) q[g][v] = _mm512_loadu_ps(query + g * dim + 16 * v);
  const __m512 scale_v = _mm512_set1_ps(scale);
  const auto row_at = [&](const T* base, int64_t t) { return base + (slots[t] * kv_heads + kv_head) * dim; };
  for (int64_t t = 0; t < std::min<int64_t>(length, kAhead); ++t) fetch_row(row_at(k_ptr, t), dim * sizeof(T));
  // A tile's 16 scores by one fixed tree of in-register shuffles (lane i of the result: the sum of key i's 16 product
  // lanes; instead of one horizontal sum a key), run as the keys arrive: pairs of keys, then pairs of pairs, and so
  // on, so a query holds a few vectors live, not 16 (which spilled).
  const auto pair = [](__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  };
  const auto quad = [](__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  const auto half = [](__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  for (int64_t t0 = 0; t0 < length; t0 += 16) {
    const int n = static_cast<int>(length - t0 < 16 ? length - t0 : 16);
    // The keys kAhead on and this tile's values, asked for now: a decode step's keys come from all over the paged
    // cache (tens of MB at 64 questions), and a load that waits on memory stalled this loop 3/4 of its time.
    for (int64_t t = t0 + kAhead; t < std::min<int64_t>(length, t0 + kAhead + 16); ++t)
      fetch_row(row_at(k_ptr, t), dim * sizeof(T));
    for (int64_t t = t0; t < t0 + n; ++t) fetch_row(row_at(v_ptr, t), dim * sizeof(T));
    const auto partial = [&](int i, __m512* a) {  // a[g]: key t0 + i's products with query g, 16 lanes (0 past n)
      if (i >= n) {
        for (int g = 0; g < G; ++g) a[g] = _mm512_setzero_ps();
        return;
      }
      const T* key = row_at(k_ptr, t0 + i);
      __m512 k[kVec];
      for (int v = 0; v < kVec; ++v) k[v] = load16(key + 16 * v);
      for (int g = 0; g < G; ++g) {
        __m512 sum = _mm512_mul_ps(q[g][0], k[0]);
        for (int v = 1; v < kVec; ++v) sum = _mm512_fmadd_ps(q[g][v], k[v], sum);
        a[g] = sum;
      }
    };
    __m512 y[G][2];
    for (int h = 0; h < 2; ++h) {
      __m512 w[G][2];
      for (int c = 0; c < 2; ++c) {
        __m512 u[G][2];
        for (int p = 0; p < 2; ++p) {
          __m512 a0[G], a1[G];
          const int i = 8 * h + 4 * c + 2 * p;
          partial(i, a0);
          partial(i + 1, a1);
          for (int g = 0; g < G; ++g) u[g][p] = pair(a0[g], a1[g]);
        }
        for (int g = 0; g < G; ++g) w[g][c] = quad(u[g][0], u[g][1]);
      }
      for (int g = 0; g < G; ++g) y[g][h] = half(w[g][0], w[g][1]);
    }
    const __mmask16 mask = static_cast<__mmask16>(n == 16 ? 0xFFFFu : (1u << n) - 1u);
    for (int g = 0; g < G; ++g) {
      const __m512 sums = _mm512_add_ps(_mm512_shuffle_f32x4(y[g][0], y[g][1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_f32x4(y[g][0], y[g][1], _MM_SHUFFLE(3, 1, 3, 1)));
      _mm512_mask_storeu_ps(scores + g * length + t0, mask, _mm512_mul_ps(sums, scale_v));
    }
  }
  softmax_rows(scores, G, length);
  __m512 out[G][kVec];
  for (int g = 0; g < G; ++g)
    for (int v = 0; v < kVec; ++v) out[g][v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < length; ++t) {
    const T* value = row_at(v_ptr, t);
    __m512 x[kVec];
    for (int v = 0; v < kVec; ++v) x[v] = load16(value + 16 * v);
    for (int g = 0; g < G; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * length + t]);
      for (int v = 0; v < kVec; ++v) out[g][v] = _mm512_fmadd_ps(p, x[v], out[g][v]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int v = 0; v < kVec; ++v) _mm512_storeu_ps(acc + g * dim + 16 * v, out[g][v]);
}

// task_group for the group sizes whose queries fit in registers; false where none does.
template <typename T, int kVec>
bool grouped(int64_t group, const float* query, const T* k_ptr, const T* v_ptr, const int64_t* slots, int64_t length,
             int64_t kv_heads, int64_t kv_head, float scale, float* scores, float* acc) {
  switch (group) {
    case 1: task_group<T, kVec, 1>(query, k_ptr, v_ptr, slots, length, kv_heads, kv_head, scale, scores, acc); return true;
    case 2: task_group<T, kVec, 2>(query, k_ptr, v_ptr, slots, length, kv_heads, kv_head, scale, scores, acc); return true;
    case 3: task_group<T, kVec, 3>(query, k_ptr, v_ptr, slots, length, kv_heads, kv_head, scale, scores, acc); return true;
    default: break;
  }
  if constexpr (kVec == 4) {
    switch (group) {
      case 4: task_group<T, 4, 4>(query, k_ptr, v_ptr, slots, length, kv_heads, kv_head, scale, scores, acc); return true;
      case 5: task_group<T, 4, 5>(query, k_ptr, v_ptr, slots, length, kv_heads, kv_head, scale, scores, acc); return true;
      default: break;
    }
  }
  return false;
}
#endif

#if KEV_ATTENTION_AVX2
// The row kernel on AVX2 + FMA (no AVX-512): one (row, kv head) task for any group size and dim a multiple of 64.
// A row's bits depend only on its query, its keys and its length, as on AVX-512: each score is one FMA chain over
// dim in 8-float steps, then one fixed tree across the 8 lanes (sum8); the softmax's maximum, exponentials and sum
// run in 8-key tiles counted from key 0, the sum in 8 lane accumulators closed by the same tree; each output lane
// is one FMA chain over the keys in position order. Keys are read in place (no copy into a row buffer), scored 8 at
// a time for the whole group while the 8 keys sit in L1, and values are taken 64 keys at a time per query head.
// Lane i of the result: the sum of a[i]'s 8 lanes, by one fixed tree of in-register shuffles.
inline __m256 sum8(const __m256* a) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  // s0123 = [a0 a1 a2 a3 | a0 a1 a2 a3] (low-half sums | high-half sums), likewise s4567 for a4..a7
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

inline float total8(__m256 v) {  // the lanes summed by the same tree as sum8 gives lane 0
  const __m256 zero = _mm256_setzero_ps();
  const __m256 a[8] = {v, zero, zero, zero, zero, zero, zero, zero};
  return _mm_cvtss_f32(_mm256_castps256_ps128(sum8(a)));
}

inline float max8(__m256 v) {  // exact whatever the order
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline __m256i tail_mask(int64_t n) {  // lanes 0..n-1 set (n < 8)
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

constexpr int64_t kValueChunk = 64;  // keys per pass over the values (64 x 64 fp32 = 16 KB: stays in L1)
constexpr int64_t kTaskRows = 8;      // rows of one prompt chunk per task: each key and value read once for all

// One task: up to kTaskRows rows that share their channel's key slots (one prompt chunk, each row with its own causal
// length; a decode row alone) × one kv head. Each row's arithmetic is exactly the single row's whatever rows share the
// task: the rows only share the loads (a tile of 8 keys, a chunk of 64 values, while they sit in L1), which is what
// cuts the traffic of a long document's keys by the rows. Writes acc [rows][group][dim] (unnormalised) and total
// [rows][group] (the probabilities' sums); scores: [rows][group][length of the longest row].
template <typename T>
void rows_avx2(const float* const* queries, const int64_t* lengths, int64_t nrows, const T* k_ptr, const T* v_ptr,
               const int64_t* slots, int64_t kv_heads, int64_t kv_head, int64_t group, int64_t dim, float scale,
               float* scores, float* acc, float* total) {
  const __m256 scale_v = _mm256_set1_ps(scale);
  const auto key_row = [&](const T* base, int64_t t) { return base + (slots[t] * kv_heads + kv_head) * dim; };
  int64_t longest = 0;
  for (int64_t r = 0; r < nrows; ++r) longest = std::max(longest, lengths[r]);
  for (int64_t t0 = 0; t0 < longest; t0 += 8) {
    const T* keys[8];
    for (int i = 0; i < 8; ++i) keys[i] = key_row(k_ptr, std::min<int64_t>(t0 + i, longest - 1));
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t n = std::min<int64_t>(8, lengths[r] - t0);  // this row's keys in the tile; the rest are dropped
      if (n <= 0) continue;
      for (int64_t g = 0; g < group; ++g) {
        __m256 part[8];
        for (int i = 0; i < 8; ++i) part[i] = _mm256_setzero_ps();
        const float* qg = queries[r] + g * dim;
        for (int64_t d = 0; d < dim; d += 8) {
          const __m256 qd = _mm256_loadu_ps(qg + d);
          for (int i = 0; i < 8; ++i) part[i] = _mm256_fmadd_ps(qd, load8(keys[i] + d), part[i]);
        }
        float* out = scores + (r * group + g) * longest + t0;
        const __m256 sv = _mm256_mul_ps(sum8(part), scale_v);
        if (n == 8) _mm256_storeu_ps(out, sv);
        else _mm256_maskstore_ps(out, tail_mask(n), sv);
      }
    }
  }
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t length = lengths[r];
    for (int64_t g = 0; g < group; ++g) {
      float* s = scores + (r * group + g) * longest;
      __m256 top = _mm256_set1_ps(-INFINITY);
      for (int64_t t0 = 0; t0 < length; t0 += 8) {
        const int64_t n = std::min<int64_t>(8, length - t0);
        const __m256 v = n == 8 ? _mm256_loadu_ps(s + t0)
                                : _mm256_blendv_ps(top, _mm256_maskload_ps(s + t0, tail_mask(n)),
                                                   _mm256_castsi256_ps(tail_mask(n)));
        top = _mm256_max_ps(top, v);
      }
      const __m256 m = _mm256_set1_ps(max8(top));
      __m256 sum = _mm256_setzero_ps();
      for (int64_t t0 = 0; t0 < length; t0 += 8) {
        const int64_t n = std::min<int64_t>(8, length - t0);
        if (n == 8) {
          const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t0), m));
          _mm256_storeu_ps(s + t0, e);
          sum = _mm256_add_ps(sum, e);
        } else {
          const __m256i mask = tail_mask(n);
          const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(s + t0, mask), m)),
                                         _mm256_castsi256_ps(mask));
          _mm256_maskstore_ps(s + t0, mask, e);
          sum = _mm256_add_ps(sum, e);
        }
      }
      total[r * group + g] = total8(sum);
    }
  }
  for (int64_t d0 = 0; d0 < dim; d0 += 64) {
    for (int64_t t0 = 0; t0 < longest; t0 += kValueChunk) {  // the chunk's values stay in L1 across rows and group
      for (int64_t r = 0; r < nrows; ++r) {
        const int64_t end = std::min(lengths[r], t0 + kValueChunk);
        if (end <= t0) continue;
        for (int64_t g = 0; g < group; ++g) {
          float* a = acc + (r * group + g) * dim + d0;
          const float* p = scores + (r * group + g) * longest;
          __m256 out[8];
          for (int v = 0; v < 8; ++v) out[v] = t0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(a + 8 * v);
          for (int64_t t = t0; t < end; ++t) {
            const T* value = key_row(v_ptr, t) + d0;
            const __m256 pt = _mm256_set1_ps(p[t]);
            for (int v = 0; v < 8; ++v) out[v] = _mm256_fmadd_ps(pt, load8(value + 8 * v), out[v]);
          }
          for (int v = 0; v < 8; ++v) _mm256_storeu_ps(a + 8 * v, out[v]);
        }
      }
    }
  }
}

// run() on AVX2 (dim a multiple of 64): consecutive entries with the same key slots (one prompt chunk's rows) go to
// one task, up to kTaskRows of them.
template <typename T>
void run_avx2(const T* q_ptr, int64_t q_row_stride, const T* k_ptr, const T* v_ptr, T* out_ptr, const int64_t* row_ptr,
              const int64_t* slot_ptr, const int64_t* start_ptr, const int64_t* length_ptr, int64_t num_channels,
              int64_t heads, int64_t kv_heads, int64_t dim, float scale, bool one_thread) {
  const int64_t group = heads / kv_heads;
  std::vector<int64_t> firsts;  // first entry of each task's rows
  for (int64_t i = 0; i < num_channels; ++i)
    if (firsts.empty() || start_ptr[i] != start_ptr[firsts.back()] || i - firsts.back() == kTaskRows) firsts.push_back(i);
  const int64_t tasks = static_cast<int64_t>(firsts.size());
  firsts.push_back(num_channels);
  at::parallel_for(0, tasks * kv_heads, one_thread ? tasks * kv_heads : 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(kTaskRows * group * dim), acc(kTaskRows * group * dim), scores, total(kTaskRows * group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first = firsts[task / kv_heads], nrows = firsts[task / kv_heads + 1] - first;
      const int64_t kv_head = task % kv_heads;
      const float* queries[kTaskRows];
      int64_t longest = 0;
      for (int64_t r = 0; r < nrows; ++r) {
        to_float(q_ptr + row_ptr[first + r] * q_row_stride + kv_head * group * dim, query.data() + r * group * dim,
                 group * dim);
        queries[r] = query.data() + r * group * dim;
        longest = std::max(longest, length_ptr[first + r]);
      }
      scores.resize(nrows * group * longest);
      rows_avx2(queries, length_ptr + first, nrows, k_ptr, v_ptr, slot_ptr + start_ptr[first], kv_heads, kv_head,
                group, dim, scale, scores.data(), acc.data(), total.data());
      for (int64_t r = 0; r < nrows; ++r)
        for (int64_t g = 0; g < group; ++g) {
          T* o = out_ptr + (row_ptr[first + r] * heads + kv_head * group + g) * dim;
          const float inverse = 1.0f / total[r * group + g];
          const float* a = acc.data() + (r * group + g) * dim;
          for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(a[d] * inverse);
        }
    }
  });
}
#endif

template <typename T>
void run(const at::Tensor& q, const at::Tensor& kv, at::Tensor& out, const at::Tensor& rows,
         const at::Tensor& slots, const at::Tensor& starts, const at::Tensor& lengths, double scale) {
  const int64_t heads = q.size(1), dim = q.size(2), kv_heads = kv.size(2), num_slots = kv.size(1);
  const int64_t q_row_stride = q.stride(0);
  const int64_t group = heads / kv_heads, num_channels = rows.size(0);
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = kv.data_ptr<T>();
  const T* v_ptr = k_ptr + num_slots * kv_heads * dim;
  T* out_ptr = out.data_ptr<T>();
  const int64_t* row_ptr = rows.data_ptr<int64_t>();
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  const int64_t* start_ptr = starts.data_ptr<int64_t>();
  const int64_t* length_ptr = lengths.data_ptr<int64_t>();
  const float scale_f = static_cast<float>(scale);
  // One thread where the whole call is small (a lone question's decode): waking a second one costs more.
  int64_t key_reads = 0;  // a plain loop: no tensor op per layer on the step's hot path
  for (int64_t i = 0; i < num_channels; ++i) key_reads += length_ptr[i] * heads;
  const int64_t grain = key_reads < kMinParallelKeyReads ? num_channels * kv_heads : 1;
#if KEV_ATTENTION_AVX2
  if (dim % 64 == 0) {
    run_avx2(q_ptr, q_row_stride, k_ptr, v_ptr, out_ptr, row_ptr, slot_ptr, start_ptr, length_ptr, num_channels, heads,
             kv_heads, dim, scale_f, key_reads < kMinParallelKeyReads);
    return;
  }
#endif
  at::parallel_for(0, num_channels * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> query(group * dim), key(dim), acc(group * dim), scores, total(group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t channel = task / kv_heads, kv_head = task % kv_heads;
      const int64_t first = start_ptr[channel], length = length_ptr[channel];
      const int64_t row = row_ptr[channel];
      scores.resize(group * length);
      to_float(q_ptr + row * q_row_stride + kv_head * group * dim, query.data(), group * dim);
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, at::Half>) {
        task_scalar(query.data(), k_ptr, v_ptr, slot_ptr + first, length, kv_heads, kv_head, group, dim, scale_f,
                    scores.data(), acc.data(), key.data());
      } else if (dim == 64 && grouped<T, 4>(group, query.data(), k_ptr, v_ptr, slot_ptr + first, length, kv_heads,
                                            kv_head, scale_f, scores.data(), acc.data())) {
      } else if (dim == 128 && grouped<T, 8>(group, query.data(), k_ptr, v_ptr, slot_ptr + first, length, kv_heads,
                                             kv_head, scale_f, scores.data(), acc.data())) {
      } else if (dim == 64) {
        task_vector<T, 4>(query.data(), k_ptr, v_ptr, slot_ptr + first, length, kv_heads, kv_head, group, scale_f,
                          scores.data(), acc.data());
      } else if (dim == 128) {
        task_vector<T, 8>(query.data(), k_ptr, v_ptr, slot_ptr + first, length, kv_heads, kv_head, group, scale_f,
                          scores.data(), acc.data());
      } else
#endif
      {
        task_scalar(query.data(), k_ptr, v_ptr, slot_ptr + first, length, kv_heads, kv_head, group, dim, scale_f,
                    scores.data(), acc.data(), key.data());
      }
      for (int64_t g = 0; g < group; ++g) {
        float sum = 0.0f;
        for (int64_t t = 0; t < length; ++t) sum += scores[g * length + t];
        total[g] = sum;
      }
      for (int64_t g = 0; g < group; ++g) {
        T* o = out_ptr + (row * heads + kv_head * group + g) * dim;
        const float inverse = 1.0f / total[g];
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(acc[g * dim + d] * inverse);
      }
    }
  });
}

// q: [rows, heads, dim] (rows may be strided: a view into the fused qkv output); kv: [2, slots, kv_heads, dim];
// out: [rows, heads, dim] contiguous, written at rows[i] only.
// Query i attends to the keys at slots[starts[i] : starts[i] + lengths[i]], in position order (the rows of one
// prefill chunk share their channel's slots, each with its own causal length).
void paged_attention(const at::Tensor& q, const at::Tensor& kv, at::Tensor out, const at::Tensor& rows,
                      const at::Tensor& slots, const at::Tensor& starts, const at::Tensor& lengths, double scale) {
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && kv.is_contiguous() && out.is_contiguous(),
              "paged_attention: heads of a row contiguous, kv and out contiguous");
  TORCH_CHECK(q.scalar_type() == kv.scalar_type() && q.scalar_type() == out.scalar_type(), "paged_attention: one dtype");
  TORCH_CHECK(q.size(1) % kv.size(2) == 0, "paged_attention: heads must be a multiple of kv heads");
  switch (q.scalar_type()) {
    case at::kFloat: run<float>(q, kv, out, rows, slots, starts, lengths, scale); break;
    case at::kBFloat16: run<at::BFloat16>(q, kv, out, rows, slots, starts, lengths, scale); break;
    case at::kHalf: run<at::Half>(q, kv, out, rows, slots, starts, lengths, scale); break;
    default: TORCH_CHECK(false, "paged_attention: unsupported dtype ", q.scalar_type());
  }
}

// Which vector code the row kernels were built with (-march=native decides it): it changes a row's bits, so the
// numerics fingerprint names it.
std::string vector_isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif KEV_ATTENTION_AVX2
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace kev

TORCH_LIBRARY(kev, m) {
  m.def("vector_isa() -> str", &kev::vector_isa);
  m.def("paged_attention(Tensor q, Tensor kv, Tensor(a!) out, Tensor rows, Tensor slots, Tensor starts, Tensor lengths, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(kev, CPU, m) { m.impl("paged_attention", &kev::paged_attention); }
