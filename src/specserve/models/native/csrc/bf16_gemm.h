// Internal interface of the bf16 matmul (bf16_gemm.cpp) for the other native ops of the
// library (decoder_layer.cpp).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

namespace specserve_native {

// The instruction set bf16_matmul was built for ("AVX-512 BF16" or "AVX2 / FMA / F16C"), and
// whether this CPU has it. A build with AMX BF16 runs weights whose K is a multiple of 32 on
// the AMX tiles instead, unless SPECSERVE_BF16_AMX=0 (see bf16_gemm.cpp).
extern const char* const kBf16Variant;
bool bf16_cpu_supported();

// A bf16 weight as the model stores it: row-major [N, K], K a multiple of 16.
struct DenseWeight {
  const uint16_t* data;
  int64_t N, K;
};

// Checks dtype, shape and contiguity of a bf16 weight (what: its name in the error message).
DenseWeight dense_weight(const torch::stable::Tensor& w, const char* what);

// out[m * ldo + n] = dot(x[m], w[n]) (+ bias[n] when bias is not null), for x contiguous bf16
// [M, K]; out bf16 (round to nearest even) or fp32 when out_f32. Splits N over torch's
// intra-op threads; the arithmetic of an output never depends on M, the other rows or the
// split (see bf16_gemm.cpp).
void bf16_matmul(const uint16_t* x, int64_t M, const DenseWeight& w, const uint16_t* bias,
                 void* out, int64_t ldo, bool out_f32);

// One weight of bf16_matmul_many: its output columns start at out (row stride: ldo).
struct DenseMatmul {
  DenseWeight w;
  const uint16_t* bias;  // [w.N] or null
  void* out;
};

// Several bf16_matmul calls on the same x (weights of equal K, outputs of equal row stride)
// in one parallel region: q/k/v, gate/up. Each output is bit for bit what bf16_matmul gives.
void bf16_matmul_many(const uint16_t* x, int64_t M, const DenseMatmul* parts, int count,
                      int64_t ldo, bool out_f32);

}  // namespace specserve_native
