// Internal interface of the int8-group kernel (int8_gemv.cpp) for the other native ops built
// into the same library (decoder_layer.cpp), and the dispatch over both quantised layouts
// (int4: int4_gemv.h), so that each projection of a fused layer may use either.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

#include "int4_gemv.h"

namespace specserve_native {

// out[M, N] = x[M, K] @ w.T for an int8-group weight (bits 8 or 6), x contiguous bf16; out bf16
// (or fp32 when out_f32), row stride N. Splits N over torch's intra-op threads; the
// arithmetic of a row never depends on M or the split.
void int8_matmul(const uint16_t* x, int64_t M, const PackedWeight& w, void* out, bool out_f32);

// Whether this CPU runs the int8-group kernel (AVX2 + FMA + F16C).
bool int8_cpu_supported();

// The code width of an int8-group qweight: 6 when it is four- or five-dimensional (six-bit
// units, see int8_gemv.cpp; five dimensions: their quad order), else 8.
inline int int8_code_bits(const torch::stable::Tensor& qweight) {
  return qweight.dim() >= 4 ? 6 : 8;
}

// tile_packed_weight with bits 4 for a uint8 qweight (int4 layout), 8 or 6 for an int8 one.
PackedWeight quant_packed_weight(const torch::stable::Tensor& qweight,
                                 const torch::stable::Tensor& scales,
                                 const torch::stable::Tensor& row_scale, int64_t out_features,
                                 int64_t group_size, const char* what);

// int4_matmul or int8_matmul, by w.bits.
void quant_matmul(const uint16_t* x, int64_t M, const PackedWeight& w, void* out, bool out_f32);

}  // namespace specserve_native
