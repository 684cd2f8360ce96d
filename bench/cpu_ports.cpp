// Which 512-bit instructions the quantized GEMM (kev/model/cpu_kernels/quant_gemm.cpp) can issue side by side on this
// CPU: each line runs 8 independent chains of `vpdpbusd` alone or paired 1:1 with another instruction, and prints
// the vpdpbusd rate (billions a second a core; 64 int8 multiply-adds each). A pair that leaves the rate as it was
// runs on other pipes; one that lowers it competes for vpdpbusd's.
//   g++ -O3 -march=native bench/cpu_ports.cpp -o /tmp/cpu_ports && /tmp/cpu_ports   (results: bench/results/cpu_ports.md)
#include <immintrin.h>

#include <chrono>
#include <cstdio>

#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

template <class F>
double rate(F f, long n) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}

alignas(64) int mem[64];

int main() {
  const long n = 400000000;
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  __m512 fa = _mm512_set1_ps(1.0001f);
  __m512bh ba = (__m512bh)_mm512_set1_epi16(0x3f80);
#define INIT(i) __m512i z##i = _mm512_set1_epi32(i), t##i = _mm512_set1_epi32(i); __m512 f##i = _mm512_set1_ps(i);
  R8(INIT)
#define DOT(i) z##i = _mm512_dpbusd_epi32(z##i, a, b); asm volatile("" : "+v"(z##i));
#define KEEP(v) asm volatile("" : "+v"(v));
#define PAIR(name, op) \
  printf("%-34s %.2f G/s\n", name, rate([&] { for (long k = 0; k < n / 8; ++k) { R8(op) } }, n));
#define ALONE(i) DOT(i)
#define WITH_AND(i) DOT(i) t##i = _mm512_and_si512(t##i, b); KEEP(t##i)
#define WITH_SHIFT(i) DOT(i) t##i = _mm512_srli_epi16(t##i, 1); KEEP(t##i)
#define WITH_BCAST(i) DOT(i) t##i = _mm512_set1_epi32(mem[i]); KEEP(t##i)
#define WITH_LOAD(i) DOT(i) t##i = _mm512_load_si512(mem); KEEP(t##i)
#define WITH_CVT(i) DOT(i) f##i = _mm512_cvtepi32_ps(t##i); KEEP(f##i)
#define WITH_ADD(i) DOT(i) f##i = _mm512_add_ps(f##i, fa); KEEP(f##i)
#define WITH_MUL(i) DOT(i) f##i = _mm512_mul_ps(f##i, fa); KEEP(f##i)
#define EMBEDDED(i) asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(z##i) : "v"(a), "m"(mem[i]));
#define BF16(i) f##i = _mm512_dpbf16_ps(f##i, ba, ba); KEEP(f##i)
  PAIR("vpdpbusd alone", ALONE)
  PAIR("vpdpbusd {1to16} memory operand", EMBEDDED)
  PAIR("vpdpbusd + vpbroadcastd (memory)", WITH_BCAST)
  PAIR("vpdpbusd + 512-bit load", WITH_LOAD)
  PAIR("vpdpbusd + vcvtdq2ps", WITH_CVT)
  PAIR("vpdpbusd + vaddps", WITH_ADD)
  PAIR("vpdpbusd + vmulps", WITH_MUL)
  PAIR("vpdpbusd + vpandd", WITH_AND)
  PAIR("vpdpbusd + vpsrlw", WITH_SHIFT)
  printf("%-34s %.2f G/s (32 bf16 multiply-adds each)\n", "vdpbf16ps alone",
         rate([&] { for (long k = 0; k < n / 8; ++k) { R8(BF16) } }, n));
  int sink = 0;
#define SINK(i) sink += _mm512_reduce_add_epi32(z##i) + _mm512_reduce_add_epi32(t##i) + (int)_mm512_reduce_add_ps(f##i);
  R8(SINK)
  return sink == 42;
}
