// Kev's C++ ops as functions, so one op (decoder_layers.cpp) can chain them without the dispatcher.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace kev {

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                  const c10::optional<at::Tensor>& scale, int64_t out_features);
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& cells, const c10::optional<at::Tensor>& scale,
                        const c10::optional<at::Tensor>& bias, int64_t out_features, int64_t path, bool like_x);
at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& cells, const c10::optional<at::Tensor>& scale,
                       const c10::optional<at::Tensor>& bias, int64_t out_features, int64_t path, bool like_x,
                       int64_t split = 0);
// The output of the quantized linears: fp32, or (like_x) x's dtype. A bf16 output is rounded with torch's .to() bits
// (vec_math.h's round_to_bf16), without .to()'s pass over memory: by the kernel as it stores (kernel_rounds: then
// no fp32 sums exist), or by each thread as it finishes a few column blocks, while their sums are in cache.
struct LinearOutput {
  at::Tensor sums;           // the fp32 results (none where the kernel rounds)
  at::Tensor rounded_out;    // their bf16 rounding, or undefined
  float* fp32;               // sums' data, or null
  uint16_t* rounded;         // rounded_out's data, or null
  at::ScalarType dtype;      // what done() returns
  static LinearOutput make(const at::Tensor& x, int64_t out_features, bool like_x, bool kernel_rounds = false);
  void finish_columns(int64_t c0, int64_t c1) const;  // columns [c0, c1) of every row summed: round them
  at::Tensor done() const { return rounded ? rounded_out : sums.to(dtype); }
};
bool is_w8a8_cells(const at::Tensor& cells);
bool int8_blocks_row(const at::BFloat16* x, const int8_t* packed, const float* scale, int64_t steps,
                     const int64_t* blocks, int64_t count, int64_t out_features, float* out);  // linear_gemm.cpp
void paged_attention(const at::Tensor& q, const at::Tensor& kv, at::Tensor out, const at::Tensor& rows,
                     const at::Tensor& slots, const at::Tensor& starts, const at::Tensor& lengths, double scale);
void prefill_attention(const at::Tensor& q, const at::Tensor& kv, at::Tensor out, const at::Tensor& spans,
                       const at::Tensor& slots, double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor residual, const at::Tensor& weight, double eps);
void rope_store_kv_(at::Tensor qkv, at::Tensor kv, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& positions, const at::Tensor& token_rows, const at::Tensor& slot_mapping,
                    int64_t heads, int64_t kv_heads, int64_t dim);
at::Tensor silu_mul(const at::Tensor& gate_up);

}  // namespace kev
