// The multiply-add peaks of this CPU, the yardstick every GEMM figure is a fraction of: register-only loops of
// independent accumulators (enough to hide each instruction's latency), on one thread and on two, for each
// instruction the compiler's -march=native has (an AVX2-only CPU such as Zen 3 gets the ymm rows only):
//   vfmadd231ps zmm   16 fp32 multiply-adds          vdpbf16ps zmm   32 bf16 multiply-adds (fp32 sums)
//   vpdpbusd zmm      64 int8 multiply-adds (u8·s8, int32 sums)
//   vfmadd231ps ymm    8 fp32 multiply-adds          vpdpbusd ymm (AVX-VNNI)  32 int8 multiply-adds
//   vpmaddubsw ymm    32 int8 multiply-adds (u8·s8, pairs summed into int16, saturating: llama.cpp's AVX2 q8 dot)
//   vpmaddwd ymm      16 int16 multiply-adds (pairs summed into int32, exact: Kev's AVX2 block kernels take int8
//                     sign-extended to int16, so this is their integer peak)
// and, where the CPU has AMX (amx_tile, amx_bf16, amx_int8 in /proc/cpuinfo), the tile instructions on full 16 × 64-byte
// tiles (4 independent accumulator tiles, 2 A and 2 B tiles):
//   tdpbf16ps  16·16·32 = 8,192 bf16 multiply-adds      tdpbssd / tdpbusd  16·16·64 = 16,384 int8 multiply-adds.
// Linux hands a process AMX's tile state only after arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
// Prints the processor, instructions a second and GMAC/s per row, and the clock (a dependent imul chain: 3 cycles a
// link).
//   g++ -O2 -march=native -pthread bench/cpu_peak.cpp -o /tmp/cpu_peak && /tmp/cpu_peak
// (results: bench/results/cpu_peak.md)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define KEEP(v) asm volatile("" : "+v"(v));

using Clock = std::chrono::steady_clock;

// One thread's loop: `n` instructions (12 independent accumulators), the sink keeps the compiler honest.
#if defined(__AVX512F__)
long fma_loop(long n) {
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
#define INIT(i) __m512 f##i = _mm512_set1_ps(i);
  R8(INIT)
#define FMA(i) f##i = _mm512_fmadd_ps(f##i, a, b); KEEP(f##i)
  for (long k = 0; k < n / 12; ++k) { R8(FMA) }
  float s = 0;
#define SUMF(i) s += _mm512_reduce_add_ps(f##i);
  R8(SUMF)
  return static_cast<long>(s) & 1;
}

#endif

#if defined(__AVX512BF16__)
long bf16_loop(long n) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f80);
  R8(INIT)
#define BF(i) f##i = _mm512_dpbf16_ps(f##i, a, b); KEEP(f##i)
  for (long k = 0; k < n / 12; ++k) { R8(BF) }
  float s = 0;
  R8(SUMF)
  return static_cast<long>(s) & 1;
}

#endif

#if defined(__AVX512VNNI__)
long vnni_loop(long n) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
#define INITI(i) __m512i z##i = _mm512_set1_epi32(i);
  R8(INITI)
#define DOT(i) z##i = _mm512_dpbusd_epi32(z##i, a, b); KEEP(z##i)
  for (long k = 0; k < n / 12; ++k) { R8(DOT) }
  long s = 0;
#define SUMI(i) s += _mm512_reduce_add_epi32(z##i);
  R8(SUMI)
  return s & 1;
}
#endif

// The ymm loops (AVX2, FMA; AVX-VNNI where built): the same 12 independent accumulators.
#define INITY(i) __m256 y##i = _mm256_set1_ps(i);
#define INITYI(i) __m256i w##i = _mm256_set1_epi32(i);
long fma_ymm_loop(long n) {
  const __m256 a = _mm256_set1_ps(1.0001f), b = _mm256_set1_ps(0.9999f);
  R8(INITY)
#define FMAY(i) y##i = _mm256_fmadd_ps(y##i, a, b); KEEP(y##i)
  for (long k = 0; k < n / 12; ++k) { R8(FMAY) }
  alignas(32) float out[8];
  float s = 0;
#define SUMY(i) _mm256_store_ps(out, y##i); s += out[0];
  R8(SUMY)
  return static_cast<long>(s) & 1;
}

long sum_ymm_int(const __m256i* v, int count) {
  alignas(32) int32_t out[8];
  long s = 0;
  for (int i = 0; i < count; ++i) _mm256_store_si256(reinterpret_cast<__m256i*>(out), v[i]), s += out[0];
  return s & 1;
}

// Each accumulator feeds its own next instruction (12 independent chains): an input that never changes would let the
// compiler hoist the instruction out of the loop.
long maddubs_loop(long n) {
  const __m256i b = _mm256_set1_epi8(5);
  R8(INITYI)
#define MUBS(i) w##i = _mm256_maddubs_epi16(w##i, b); KEEP(w##i)
  for (long k = 0; k < n / 12; ++k) { R8(MUBS) }
#define LISTW(i) w##i,
  const __m256i all[] = {R8(LISTW)};
  return sum_ymm_int(all, 12);
}

long maddwd_loop(long n) {
  const __m256i b = _mm256_set1_epi16(5);
  R8(INITYI)
#define MWD(i) w##i = _mm256_madd_epi16(w##i, b); KEEP(w##i)
  for (long k = 0; k < n / 12; ++k) { R8(MWD) }
  const __m256i all[] = {R8(LISTW)};
  return sum_ymm_int(all, 12);
}

#if defined(__AVXVNNI__)
long avx_vnni_loop(long n) {
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
  R8(INITYI)
#define DOTY(i) w##i = _mm256_dpbusd_avx_epi32(w##i, a, b); KEEP(w##i)
  for (long k = 0; k < n / 12; ++k) { R8(DOTY) }
  const __m256i all[] = {R8(LISTW)};
  return sum_ymm_int(all, 12);
}
#endif

// A dependent chain of 64-bit imul (3 cycles each on every x86 core of this project; a chain of `add $1` is no clock:
// Golden Cove's renamer folds it to more than one a cycle). Returns the chain's links, so GHz = 3 × rate.
long clock_loop(long n) {
  long x = 3, m = 1;
  for (long k = 0; k < n / 4; ++k) {
    asm volatile("imul %1, %0" : "+r"(x) : "r"(m));
    asm volatile("imul %1, %0" : "+r"(x) : "r"(m));
    asm volatile("imul %1, %0" : "+r"(x) : "r"(m));
    asm volatile("imul %1, %0" : "+r"(x) : "r"(m));
  }
  return x & 1;
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
#define KEV_AMX 1
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool amx_permitted() {
  constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
}

alignas(64) uint8_t tile_data[16 * 64];

// kind 0: tdpbf16ps, 1: tdpbssd, 2: tdpbusd. Four accumulators (tmm0-3), A in tmm4-5, B in tmm6-7: no tile
// instruction waits on the one before it.
long amx_loop(long n, int kind) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  for (int i = 0; i < 16 * 64; i += 2) tile_data[i] = 0, tile_data[i + 1] = 0x3f;  // small values (bf16 ~0.5)
  // (the tile intrinsics are asm statements: one per statement)
  _tile_loadd(4, tile_data, 64);
  _tile_loadd(5, tile_data, 64);
  _tile_loadd(6, tile_data, 64);
  _tile_loadd(7, tile_data, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long k = 0; k < n / 4; ++k) {
    if (kind == 0) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    } else if (kind == 1) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
  }
  alignas(64) int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0] & 1;
}
#else
#define KEV_AMX 0
#endif

// Instructions a second (billions) with `threads` threads each running `per_thread` instructions at once: the best
// of kTries runs (a shared machine's load only ever slows a run down).
constexpr int kTries = 7;
template <class F>
double rate_once(int threads, long per_thread, F loop);
template <class F>
double rate(int threads, long per_thread, F loop) {
  double best = 0;
  for (int i = 0; i < kTries; ++i) best = std::max(best, rate_once(threads, per_thread, loop));
  return best;
}
template <class F>
double rate_once(int threads, long per_thread, F loop) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<long> sink{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      ++ready;
      while (!go) {
      }
      sink += loop(per_thread);
    });
  while (ready < threads) {
  }
  const auto t0 = Clock::now();
  go = true;
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return threads * per_thread / s / 1e9 + 0 * sink;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, name, family, model;
  while (std::getline(f, line)) {
    const auto value = line.substr(line.find(':') + 2 > line.size() ? line.size() : line.find(':') + 2);
    if (name.empty() && line.rfind("model name", 0) == 0) name = value;
    if (family.empty() && line.rfind("cpu family", 0) == 0) family = value;
    if (model.empty() && line.rfind("model\t", 0) == 0) model = value;
  }
  return name + " (family " + family + ", model " + model + ")";
}

int main() {
  const long n = 120000000;  // vector instructions per thread per measurement (a fraction of a second)
  const long tiles = 1600000;
  std::printf("# %s; hardware threads %u; best of %d runs each\n", cpu_name().c_str(), std::thread::hardware_concurrency(), kTries);
  std::printf("%-28s %8s %10s %12s %12s\n", "instruction", "threads", "G instr/s", "MAC/instr", "GMAC/s");
  for (int threads : {1, 2}) {
    const double ghz = 3 * rate(threads, n / 4, clock_loop) / threads;
    std::printf("%-28s %8d %10.2f %12s %12s\n", "imul chain (GHz a thread)", threads, ghz, "-", "-");
    const auto row = [&](const char* name, double g, long macs) {
      std::printf("%-28s %8d %10.3f %12ld %12.1f\n", name, threads, g, macs, g * macs);
    };
#if defined(__AVX512F__)
    row("vfmadd231ps zmm (fp32)", rate(threads, n, fma_loop), 16);
#endif
#if defined(__AVX512BF16__)
    row("vdpbf16ps zmm (bf16)", rate(threads, n, bf16_loop), 32);
#endif
#if defined(__AVX512VNNI__)
    row("vpdpbusd zmm (int8)", rate(threads, n, vnni_loop), 64);
#endif
    row("vfmadd231ps ymm (fp32)", rate(threads, n, fma_ymm_loop), 8);
#if defined(__AVXVNNI__)
    row("vpdpbusd ymm (AVX-VNNI int8)", rate(threads, n, avx_vnni_loop), 32);
#endif
    row("vpmaddubsw ymm (int8->int16)", rate(threads, n, maddubs_loop), 32);
    row("vpmaddwd ymm (int16->int32)", rate(threads, n, maddwd_loop), 16);
#if KEV_AMX
    if (threads == 1 && !amx_permitted()) {
      std::printf("AMX: the kernel refused ARCH_REQ_XCOMP_PERM; no tile rates\n");
      continue;
    }
    row("tdpbf16ps (AMX bf16)", rate(threads, tiles, [](long k) { return amx_loop(k, 0); }), 16 * 16 * 32);
    row("tdpbssd (AMX int8 s8·s8)", rate(threads, tiles, [](long k) { return amx_loop(k, 1); }), 16 * 16 * 64);
    row("tdpbusd (AMX int8 u8·s8)", rate(threads, tiles, [](long k) { return amx_loop(k, 2); }), 16 * 16 * 64);
#endif
  }
  return 0;
}
