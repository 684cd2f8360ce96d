// Small math shared by Kev's CPU kernels.
#pragma once

#include <cstdint>
#include <cstring>

namespace kev {

// exp on [-87, 88] by range reduction and a polynomial: plain arithmetic the compiler vectorizes.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Rows × columns [c0, c1) of an fp32 matrix (row stride ld) rounded to bf16 as torch's .to(torch.bfloat16) rounds
// (nearest, ties to even; a NaN becomes c10's 0x7FC0), into dst of the same shape: a linear that rounds its own output
// gives the bits its caller's separate copy gave. Plain integer arithmetic the compiler vectorizes.
inline void round_to_bf16(const float* src, uint16_t* dst, int64_t rows, int64_t ld, int64_t c0, int64_t c1) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint16_t* d = dst + r * ld;
    for (int64_t c = c0; c < c1; ++c) {
      uint32_t u;
      std::memcpy(&u, s + c, sizeof u);
      const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
      d[c] = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
    }
  }
}

}  // namespace kev
