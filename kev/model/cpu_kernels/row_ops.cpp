// Row-wise ops of a decoder layer fused into one pass each (RMSNorm, rotary embedding, SiLU·mul).
// Every row is computed on its own in a fixed order, so its bits never depend on the other rows;
// math is fp32 with one rounding to the model dtype at the end.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vec_avx2.h"
#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kev {

// Rows per task: a decode step's rows run on one thread (waking another costs ~40 us under
// OMP_WAIT_POLICY=PASSIVE, about what 64 rows take); prefill rows split.
constexpr int64_t kRowGrain = 64;
constexpr int64_t kMaxHalf = 256;  // rotary: half a head's dim, at most
#if defined(__AVX512F__)
inline __mmask16 lanes_left(int64_t left) {  // the first min(left, 16) lanes
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}
#endif

template <typename T>
inline float to_f(T v) { return static_cast<float>(v); }
inline float to_f(at::BFloat16 v) {  // the bf16 bits are the top half of the fp32's
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// fp32 -> T with one rounding. bf16: round to nearest even on the bits, NaN kept quiet: the same value as
// c10::BFloat16(float), written without branches so the compiler vectorizes the loops that use it.
template <typename T>
inline T from_f(float f) { return static_cast<T>(f); }
template <>
inline at::BFloat16 from_f<at::BFloat16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint16_t rounded = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  return at::BFloat16(f != f ? static_cast<uint16_t>(0x7FC0) : rounded, at::BFloat16::from_bits());
}


// lanes[i % 16] += x[i]² for every i in order (with -march=native's FMA the compiler fuses each into one
// multiply-add): 16 lanes at a time where the CPU has them (the scalar loop's lanes went through memory, a store and a load
// an element); the same bits, since lane l takes the same elements in the same order.
template <typename T>
inline void sum_squares16(const T* x, int64_t n, float* lanes) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, at::BFloat16>) {
    __m512 acc = _mm512_loadu_ps(lanes);
    for (; i < n; i += 16) {  // a tail's missing lanes load 0: fma(0, 0, s) = s (s >= 0, never -0)
      const __mmask16 in = lanes_left(n - i);
      __m512 v;
      if constexpr (std::is_same_v<T, float>) {
        v = _mm512_maskz_loadu_ps(in, x + i);
      } else {
        v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(in, x + i)), 16));
      }
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    _mm512_storeu_ps(lanes, acc);
    return;
  }
#endif
  for (; i < n; ++i) lanes[i % 16] += to_f(x[i]) * to_f(x[i]);
}

template <typename T>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out, double eps) {
  const int64_t rows = x.size(0), width = x.size(1);
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = xp + r * width;
      float lanes[16] = {0.0f};
      sum_squares16(row, width, lanes);
      for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
      const float inverse = 1.0f / std::sqrt(lanes[0] / static_cast<float>(width) + static_cast<float>(eps));
      T* o = op + r * width;
      // As Hugging Face: normalise in fp32, round to the model dtype, then scale by the weight.
      for (int64_t i = 0; i < width; ++i) o[i] = from_f<T>(to_f(wp[i]) * to_f(from_f<T>(to_f(row[i]) * inverse)));
    }
  });
}

// residual += x (rounded to the model dtype, as torch's add), then RMSNorm of the new residual.
template <typename T>
void add_rows(const at::Tensor& x, at::Tensor& residual) {
  const int64_t rows = x.size(0), width = x.size(1);
  const T* xp = x.data_ptr<T>();
  T* rp = residual.data_ptr<T>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * width; i < end * width; ++i) rp[i] = from_f<T>(to_f(rp[i]) + to_f(xp[i]));
  });
}

at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor residual, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.sizes() == residual.sizes() && x.is_contiguous() && residual.is_contiguous(), "add_rms_norm: same shape");
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    add_rows<scalar_t>(x, residual);
    rms_norm_rows<scalar_t>(residual, weight, out, eps);
  });
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && weight.is_contiguous(), "rms_norm: contiguous [rows, width]");
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm",
                                  [&] { rms_norm_rows<scalar_t>(x, weight, out, eps); });
  return out;
}

// qkv: [rows, (heads + 2 * kv_heads) * dim]; rotates the q and k heads in place (rotate_half layout).
template <typename T>
void rope_rows(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
               int64_t rotated_heads, int64_t dim) {
  const int64_t rows = qkv.size(0), width = qkv.size(1), half = dim / 2;
  TORCH_CHECK(half <= kMaxHalf, "rope_: head dim above ", 2 * kMaxHalf);
  T* base = qkv.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* c = cp + pos[r] * dim;
      const T* s = sp + pos[r] * dim;
      for (int64_t h = 0; h < rotated_heads; ++h) {
        T* x = base + r * width + h * dim;
        // The head's halves read into buffers first: written in place, the compiler could not tell the halves apart
        // and ran this loop one element at a time (7x slower in bf16); the arithmetic is the same.
        float lo[kMaxHalf], hi[kMaxHalf];
        for (int64_t i = 0; i < half; ++i) lo[i] = to_f(x[i]), hi[i] = to_f(x[i + half]);
        for (int64_t i = 0; i < half; ++i) {
          const float a = lo[i], b = hi[i];
          x[i] = from_f<T>(a * to_f(c[i]) - b * to_f(s[i]));
          x[i + half] = from_f<T>(b * to_f(c[i + half]) + a * to_f(s[i + half]));
        }
      }
    }
  });
}

void rope_(at::Tensor qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
           int64_t rotated_heads, int64_t dim) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous(), "rope_: contiguous");
  TORCH_CHECK(cos.scalar_type() == qkv.scalar_type(), "rope_: cos/sin in the model dtype");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() >= qkv.size(0), "rope_: a position per row");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t i = 0; i < qkv.size(0); ++i)  // the table's rows are all there is: never read past them
    TORCH_CHECK(pos[i] >= 0 && pos[i] < cos.size(0), "rope_: position ", pos[i], " is outside the rotary table (",
                cos.size(0), " positions: core.max_context)");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_",
                                  [&] { rope_rows<scalar_t>(qkv, cos, sin, positions, rotated_heads, dim); });
}

// After rotary: each real token's k and v heads (rows token_rows[i] of qkv) into cache slot slot_mapping[i] of
// kv [2, slots, kv_heads, dim]. One memcpy per token and half: the copy torch did with stack, index_select and
// index_copy_, without the two temporaries.
void store_kv(const at::Tensor& qkv, at::Tensor& kv, const at::Tensor& token_rows, const at::Tensor& slot_mapping,
              int64_t heads, int64_t kv_heads, int64_t dim) {
  const int64_t tokens = token_rows.size(0), width = qkv.size(1), num_slots = kv.size(1);
  const int64_t bytes = kv_heads * dim * qkv.element_size();
  const auto* src = static_cast<const char*>(qkv.data_ptr());
  auto* dst = static_cast<char*>(kv.data_ptr());
  const int64_t* rows = token_rows.data_ptr<int64_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t row_bytes = width * qkv.element_size(), k_offset = heads * dim * qkv.element_size();
  for (int64_t i = 0; i < tokens; ++i) {
    TORCH_CHECK(slots[i] >= 0 && slots[i] < num_slots, "rope_store_kv_: slot out of range");
    const char* row = src + rows[i] * row_bytes + k_offset;
    std::memcpy(dst + slots[i] * bytes, row, bytes);  // K
    std::memcpy(dst + (num_slots + slots[i]) * bytes, row + bytes, bytes);  // V
  }
}

// rope_ on the q and k heads of every row, then the new tokens' k and v into the paged cache.
void rope_store_kv_(at::Tensor qkv, at::Tensor kv, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& positions, const at::Tensor& token_rows, const at::Tensor& slot_mapping,
                    int64_t heads, int64_t kv_heads, int64_t dim) {
  TORCH_CHECK(kv.is_contiguous() && kv.dim() == 4 && kv.size(2) == kv_heads && kv.size(3) == dim,
              "rope_store_kv_: kv must be a contiguous [2, slots, kv_heads, dim] cache");
  TORCH_CHECK(kv.scalar_type() == qkv.scalar_type() && qkv.size(1) == (heads + 2 * kv_heads) * dim,
              "rope_store_kv_: qkv must be [rows, (heads + 2 kv_heads) * dim] in the cache dtype");
  TORCH_CHECK(token_rows.is_contiguous() && slot_mapping.is_contiguous() && token_rows.size(0) == slot_mapping.size(0),
              "rope_store_kv_: one slot per token row");
  rope_(qkv, cos, sin, positions, heads + kv_heads, dim);
  store_kv(qkv, kv, token_rows, slot_mapping, heads, kv_heads, dim);
}

template <typename T>
void silu_mul_rows(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t rows = gate_up.size(0), width = out.size(1);
  const T* gp = gate_up.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gp + r * 2 * width;
      const T* u = g + width;
      T* o = op + r * width;
      int64_t i = 0;
#if KEV_AVX2
      if constexpr (!std::is_same_v<T, double>) {
        for (; i + 8 <= width; i += 8) {  // the same steps on 8 columns (the scalar tail: the same columns every row)
          const __m256 x = load8(g + i);
          const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
          store8(o + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), load8(u + i)));
        }
      }
#endif
      for (; i < width; ++i) {
        const float x = to_f(g[i]);
        o[i] = from_f<T>(x / (1.0f + kev::exp_approx(-x)) * to_f(u[i]));
      }
    }
  });
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, "silu_mul: [rows, 2 * width]");
  at::Tensor out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul",
                                  [&] { silu_mul_rows<scalar_t>(gate_up, out); });
  return out;
}

// Each row's index of its largest value, exactly as torch.argmax(x, -1) picks it: the first of equal maxima, and a NaN
// counts as the largest (its first). Rows in parallel: torch's took 1.5 ms a step for 64 rows of a 49,152-token
// vocabulary on one thread, ~4% of a w8a8 decode step on the Zen 4.
int64_t argmax_row(const float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (; i < n; i += 16) {  // the maximum (exact in any order), stopping at a chunk with a NaN
    const __mmask16 in = lanes_left(n - i);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), in, x + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) break;
    top = _mm512_max_ps(top, v);
  }
  if (i >= n) {
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    for (int64_t j = 0; j < n; j += 16) {  // its first place
      const __mmask16 in = lanes_left(n - j);
      const __mmask16 hit = _mm512_mask_cmp_ps_mask(in, _mm512_maskz_loadu_ps(in, x + j), m, _CMP_EQ_OQ);
      if (hit) return j + __builtin_ctz(hit);
    }
  }
  for (int64_t j = i; j < n; ++j)
    if (x[j] != x[j]) return j;  // the first NaN (in the chunk that stopped the scan: none before it)
  i = 0;
#endif
  int64_t best = 0;
  for (; i < n; ++i) {
    if (x[i] != x[i]) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.size(1) > 0,
              "argmax_rows: a contiguous fp32 [rows, n] with n > 0");
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = argmax_row(xp + r * n, n);
  });
  return out;
}

}  // namespace kev

TORCH_LIBRARY_FRAGMENT(kev, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor");
  m.def("rope_(Tensor(a!) qkv, Tensor cos, Tensor sin, Tensor positions, int rotated_heads, int dim) -> ()");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("rope_store_kv_(Tensor(a!) qkv, Tensor(b!) kv, Tensor cos, Tensor sin, Tensor positions, Tensor token_rows, "
        "Tensor slot_mapping, int heads, int kv_heads, int dim) -> ()");
}

TORCH_LIBRARY_IMPL(kev, CPU, m) {
  m.impl("rms_norm", &kev::rms_norm);
  m.impl("add_rms_norm", &kev::add_rms_norm);
  m.impl("rope_", &kev::rope_);
  m.impl("silu_mul", &kev::silu_mul);
  m.impl("argmax_rows", &kev::argmax_rows);
  m.impl("rope_store_kv_", &kev::rope_store_kv_);
}
