// Batch-invariant bf16 GEMV/GEMM for decode and verify steps (AVX2 + FMA): y = x @ w.T (+ b)
// for bf16 activations x [M, K] and bf16 weights w [N, K] in the model's own layout (no
// repacking, no second copy). Registered as torch.ops.specserve.bf16_gemm; the decoder layer
// op (decoder_layer.cpp) calls bf16_matmul directly.
//
// Why: at batch 1 a decode step is bound by reading the weights, and PyTorch's bf16 linear
// reads them at about 60 % of this machine's bandwidth for one row; for the 2 to 16 rows of a
// speculative verify it is several times slower than for one row (oneDNN's small-M path), so
// a verify cost far more than the step it replaces. Here one pass over the weights serves up
// to 6 rows, and a verify of k + 1 rows costs little more than one decode step.
//
// Per output (m, n) the arithmetic is fixed, whatever M, the other rows or the thread split:
//   acc = 0 (8 fp32 lanes)
//   for each chunk c of 16 inputs:            // w and x as fp32, exact
//     acc = fma(w_even[c], x_even[c], acc)    // lane j: inputs 16c + 2j
//     acc = fma(w_odd[c],  x_odd[c],  acc)    // lane j: inputs 16c + 2j + 1
//   y = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))  (+ bias[n])
//   out = bf16(y) or y
// so a row of a k + 1-row verify is bit-identical to the same row decoded alone. The kernels
// below differ only in how many outputs they interleave.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bf16_gemm.h"
#include "int4_gemv.h"
#include "simd.h"

namespace {

using specserve_native::DenseWeight;

constexpr int64_t kChunk = 16;           // inputs per step: one 32-byte load of a weight row
constexpr int64_t kMaxRows = 6;          // rows of x per register block (with 2 weight rows)
constexpr int64_t kTaskRows = 16;        // weight rows per unit of the thread split
constexpr int64_t kPrefetchBytes = 512;  // ahead in each weight row's stream

struct Job {
  const uint16_t* w;     // [N, K]
  const float* xd;       // [M, K]: per chunk, its 8 even then its 8 odd inputs (fp32)
  const uint16_t* bias;  // [N] or null
  void* out;             // element (m, n) at out + m * ldo + n
  int64_t ldo, K, M;
  bool out_f32;
};

// x rows (bf16) -> the even/odd split fp32 layout of Job::xd.
void split_pairs(const uint16_t* x, float* xd, int64_t M, int64_t K) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t i = 0; i < M * K; i += kChunk) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm256_storeu_ps(xd + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    _mm256_storeu_ps(xd + i + 8, _mm256_castsi256_ps(_mm256_and_si256(v, high)));
  }
}

// Weight rows [n0, n0 + NR) against the MR rows of x from m0.
template <int NR, int MR>
void run_block(const Job& j, int64_t n0, int64_t m0) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t K = j.K;
  const uint16_t* w[NR];
  for (int r = 0; r < NR; ++r) w[r] = j.w + (n0 + r) * K;
  const float* x = j.xd + m0 * K;
  __m256 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += kChunk) {
    if constexpr (MR == 1) {  // one x row: its two vectors stay in registers
      const __m256 xe = _mm256_loadu_ps(x + k), xo = _mm256_loadu_ps(x + k + 8);
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
        acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), xe, acc[r][0]);
        acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), xo, acc[r][0]);
      }
    } else {  // the weight vectors stay in registers, each x vector is loaded once
      __m256 we[NR], wo[NR];
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
        we[r] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        wo[r] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      }
      for (int m = 0; m < MR; ++m) {
        const __m256 xe = _mm256_loadu_ps(x + m * K + k);
        for (int r = 0; r < NR; ++r) acc[r][m] = _mm256_fmadd_ps(we[r], xe, acc[r][m]);
        const __m256 xo = _mm256_loadu_ps(x + m * K + k + 8);
        for (int r = 0; r < NR; ++r) acc[r][m] = _mm256_fmadd_ps(wo[r], xo, acc[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    const int64_t n = n0 + r;
    const float b = j.bias != nullptr ? specserve_native::bf16_to_float(j.bias[n]) : 0.0f;
    for (int m = 0; m < MR; ++m) {
      float y = specserve_native::reduce_add(acc[r][m]);
      if (j.bias != nullptr) y = y + b;
      const int64_t at = (m0 + m) * j.ldo + n;
      if (j.out_f32)
        static_cast<float*>(j.out)[at] = y;
      else
        static_cast<uint16_t*>(j.out)[at] = specserve_native::bf16_bits_scalar(y);
    }
  }
}

template <int NR>
void run_rows(const Job& j, int64_t n0, int64_t m0, int64_t rows) {
  switch (rows) {
    case 1: run_block<NR, 1>(j, n0, m0); break;
    case 2: run_block<NR, 2>(j, n0, m0); break;
    case 3: run_block<NR, 3>(j, n0, m0); break;
    case 4: run_block<NR, 4>(j, n0, m0); break;
    case 5: run_block<NR, 5>(j, n0, m0); break;
    default: run_block<NR, 6>(j, n0, m0); break;
  }
}

// Row blocks of at most kMaxRows rows, balanced; block i starts at row block_start(M, i).
inline int64_t num_row_blocks(int64_t M) { return (M + kMaxRows - 1) / kMaxRows; }
inline int64_t block_start(int64_t M, int64_t i) {
  const int64_t n = num_row_blocks(M), base = M / n, extra = M % n;
  return i * base + std::min(i, extra);
}

// Weight rows [begin, end), all rows of x: several weight rows at a time when x has few rows
// (independent FMA chains to cover the latency), else 2 weight rows per row block.
void run_range(const Job& j, int64_t begin, int64_t end) {
  int64_t n = begin;
  if (j.M == 1) {
    for (; n + 8 <= end; n += 8) run_block<8, 1>(j, n, 0);
  } else if (j.M == 2) {
    for (; n + 4 <= end; n += 4) run_block<4, 2>(j, n, 0);
  } else if (j.M == 3) {
    for (; n + 4 <= end; n += 4) run_block<4, 3>(j, n, 0);
  } else {
    for (; n + 2 <= end; n += 2)
      for (int64_t i = 0; i < num_row_blocks(j.M); ++i) {
        const int64_t m0 = block_start(j.M, i);
        run_rows<2>(j, n, m0, block_start(j.M, i + 1) - m0);
      }
  }
  for (; n < end; ++n)
    for (int64_t i = 0; i < num_row_blocks(j.M); ++i) {
      const int64_t m0 = block_start(j.M, i);
      run_rows<1>(j, n, m0, block_start(j.M, i + 1) - m0);
    }
}

}  // namespace

namespace specserve_native {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

DenseWeight dense_weight(const Tensor& w, const char* what) {
  STD_TORCH_CHECK(w.is_cpu() && w.scalar_type() == ScalarType::BFloat16 && w.dim() == 2 &&
                      w.is_contiguous(),
                  what, ": the weight must be a contiguous CPU bf16 tensor [N, K]");
  STD_TORCH_CHECK(w.size(1) % kChunk == 0, what, ": K = ", w.size(1),
                  " is not a multiple of 16");
  return DenseWeight{static_cast<const uint16_t*>(w.const_data_ptr()), w.size(0), w.size(1)};
}

void bf16_matmul_many(const uint16_t* x, int64_t M, const DenseMatmul* parts, int count,
                      int64_t ldo, bool out_f32) {
  if (M == 0 || count == 0) return;
  const int64_t K = parts[0].w.K;
  for (int i = 0; i < count; ++i)
    STD_TORCH_CHECK(parts[i].w.K == K, "bf16_matmul_many: weights of different widths");
  // Per calling thread, reused: the split inputs are small (M x K fp32).
  thread_local std::vector<float> xd;
  xd.resize(static_cast<size_t>(M * K));
  split_pairs(x, xd.data(), M, K);
  const float* xdp = xd.data();  // the worker threads have thread_locals of their own
  // Units of kTaskRows weight rows, numbered across the parts in order; a task holds at
  // least 128 KiB / (M + 1) of weights, so small matrices stay on one thread.
  std::vector<int64_t> first_unit(count + 1, 0);
  for (int i = 0; i < count; ++i)
    first_unit[i + 1] = first_unit[i] + (parts[i].w.N + kTaskRows - 1) / kTaskRows;
  const int64_t unit_bytes = kTaskRows * K * 2;
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{128} << 10) / (unit_bytes * std::min<int64_t>(M + 1, 16)));
  torch::stable::parallel_for(0, first_unit[count], grain, [&](int64_t b, int64_t e) {
    for (int i = 0; i < count; ++i) {
      const int64_t lo = std::max(b, first_unit[i]), hi = std::min(e, first_unit[i + 1]);
      if (lo >= hi) continue;
      const DenseMatmul& p = parts[i];
      const Job job{p.w.data, xdp, p.bias, p.out, ldo, K, M, out_f32};
      const int64_t u0 = lo - first_unit[i], u1 = hi - first_unit[i];
      run_range(job, u0 * kTaskRows, std::min(p.w.N, u1 * kTaskRows));
    }
  });
}

void bf16_matmul(const uint16_t* x, int64_t M, const DenseWeight& w, const uint16_t* bias,
                 void* out, int64_t ldo, bool out_f32) {
  const DenseMatmul part{w, bias, out};
  bf16_matmul_many(x, M, &part, 1, ldo, out_f32);
}

}  // namespace specserve_native

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Tensor bf16_gemm(const Tensor& x_in, const Tensor& weight, const Tensor& bias) {
  STD_TORCH_CHECK(specserve_native::avx2_supported(), "bf16_gemm: this CPU lacks AVX2 / FMA / F16C");
  STD_TORCH_CHECK(x_in.is_cpu() && x_in.dim() == 2, "bf16_gemm: x must be a CPU tensor [M, K]");
  const ScalarType xt = x_in.scalar_type();
  STD_TORCH_CHECK(xt == ScalarType::BFloat16 || xt == ScalarType::Float,
                  "bf16_gemm: x must be bf16 or fp32");
  const DenseWeight w = specserve_native::dense_weight(weight, "bf16_gemm");
  STD_TORCH_CHECK(x_in.size(1) == w.K, "bf16_gemm: x has ", x_in.size(1), " inputs, weight ",
                  w.K);
  const uint16_t* b = nullptr;
  if (bias.numel() > 0) {
    STD_TORCH_CHECK(bias.is_cpu() && bias.scalar_type() == ScalarType::BFloat16 &&
                        bias.is_contiguous() && bias.numel() == w.N,
                    "bf16_gemm: bias must be a contiguous CPU bf16 tensor of ", w.N, " values");
    b = static_cast<const uint16_t*>(bias.const_data_ptr());
  }
  Tensor x = xt == ScalarType::BFloat16 ? x_in : torch::stable::to(x_in, ScalarType::BFloat16);
  if (!x.is_contiguous()) x = torch::stable::contiguous(x);
  const bool f32 = xt == ScalarType::Float;
  Tensor out = specserve_native::empty_2d(x.size(0), w.N, f32);
  specserve_native::bf16_matmul(static_cast<const uint16_t*>(x.const_data_ptr()), x.size(0), w,
                                b, out.mutable_data_ptr(), w.N, f32);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def("bf16_gemm(Tensor x, Tensor weight, Tensor bias) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CPU, m) { m.impl("bf16_gemm", TORCH_BOX(&bf16_gemm)); }
