// Int8 activations for the quantised matmuls on AVX-512 VNNI (int4_gemv.cpp's kernels for
// Q4_K and for the int4 format's groups, int8_gemv.cpp's Q6_K one): each row of x rounded per
// 32 inputs to int8 steps, so that a weight's integer codes multiply it with vpdpbusd (64 byte
// products an instruction, summed exactly in int32; vdpbf16ps takes 32 bf16 ones). The AVX2
// int4 kernel rounds x the same way for its groups (its own quantiser, int4_gemv.cpp), and so
// does the AVX2 kernel of Q6_K's superblocks in quad order (quantise_x8_rows below).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace specserve_native {

constexpr int64_t kInt8XGroup = 32;  // inputs sharing one step

// Whether weights with superblock constants (the K-quants' Q4_K and Q6_K) and int4 weights
// with per-group constants in groups of a multiple of 32 multiply int8 activations (the
// default where the build has AVX-512 VNNI, or AVX2 for the int4 kernel's groups) or bf16
// ones (SPECSERVE_INT8_ACTIVATIONS=0). Not read by the quad-order kernel (int8_gemv.cpp),
// whose weights are packed for int8 activations (the switch read at load, superblock.py).
// Read on every call, like sweep_prefetch() in simd.h, so that a benchmark can alternate both
// in one process; unlike it, the switch changes the outputs (each row's the same way whatever
// the batch).
inline bool int8_activations() {
  const char* v = std::getenv("SPECSERVE_INT8_ACTIVATIONS");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace specserve_native

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define SPECSERVE_INT8_X 1

namespace specserve_native {

// Each row of x [M, K] (bf16) as int8 per group of 32 inputs: step = max |x| / 127 (0 for an
// all-zero group, NaN where the group holds a NaN or an infinity), xq = x / step rounded to
// nearest even (llama.cpp's Q8_0 rounding, with an fp32 step) into xq [M, K]: in input order,
// or with q4_order per block of 8 inputs in the order (0, 4, 1, 5, 2, 6, 3, 7) that the int4
// kernel's code blocks pair with. With qsum16 non-null, the int32 sums of xq per 16 inputs
// [M, K / 16]. Row by row: the same arithmetic whatever M.
inline void quantise_x8(const uint16_t* x, int64_t M, int64_t K, bool q4_order, int8_t* xq,
                        float* step, int32_t* qsum16) {
  const int64_t ngroups = K / kInt8XGroup;
  const __m128i order = q4_order
                            ? _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15)
                            : _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 largest = _mm512_set1_ps(std::numeric_limits<float>::max());
  const auto load16 = [](const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  };
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < ngroups; ++g) {
      const int64_t at = m * K + g * kInt8XGroup;
      const __m512 v0 = load16(x + at), v1 = load16(x + at + 16);
      const __m512 a0 = _mm512_and_ps(v0, abs_mask), a1 = _mm512_and_ps(v1, abs_mask);
      // a NaN or an infinity fails the comparison
      const bool finite = _mm512_cmp_ps_mask(a0, largest, _CMP_LE_OQ) == 0xFFFF &&
                          _mm512_cmp_ps_mask(a1, largest, _CMP_LE_OQ) == 0xFFFF;
      const float top = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
      int32_t* sums = qsum16 != nullptr ? qsum16 + (at / 16) : nullptr;
      if (!finite || top == 0.0f) {
        step[m * ngroups + g] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        std::memset(xq + at, 0, kInt8XGroup);
        if (sums != nullptr) sums[0] = sums[1] = 0;
        continue;
      }
      step[m * ngroups + g] = top / 127.0f;
      const __m512 inv = _mm512_set1_ps(127.0f / top);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));  // nearest even
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + at),
                       _mm_shuffle_epi8(_mm512_cvtsepi32_epi8(q0), order));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + at + 16),
                       _mm_shuffle_epi8(_mm512_cvtsepi32_epi8(q1), order));
      if (sums != nullptr) {
        sums[0] = _mm512_reduce_add_epi32(q0);
        sums[1] = _mm512_reduce_add_epi32(q1);
      }
    }
  }
}

}  // namespace specserve_native

#endif  // SPECSERVE_INT8_X

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "simd.h"

namespace specserve_native {

// The 32 bf16 inputs at x as fp32 into v, their largest magnitude into top; whether all are
// finite (a NaN or an infinity fails the comparison). The AVX2 quantisers' scan of a group.
inline bool load_x32(const uint16_t* x, __m256 (&v)[4], float& top) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 largest = _mm256_set1_ps(std::numeric_limits<float>::max());
  __m256 t = _mm256_setzero_ps();
  bool finite = true;
  for (int i = 0; i < 4; ++i) {
    v[i] = load_bf16x8(x + 8 * i);
    const __m256 a = _mm256_and_ps(v[i], abs_mask);
    finite = finite && _mm256_movemask_ps(_mm256_cmp_ps(a, largest, _CMP_LE_OQ)) == 0xFF;
    t = _mm256_max_ps(t, a);
  }
  top = reduce_max(t);
  return finite;
}

// quantise_x8's rounding in input order, eight lanes a vector (every build from AVX2 on): for
// the AVX2 kernel of six-bit codes in quad order (int8_gemv.cpp's run_block_quads). Each row
// of x [M, K] (bf16) per group of 32 inputs: step = max |x| / 127 (0 for an all-zero group,
// NaN where the group holds a NaN or an infinity), xq = x / step rounded to nearest even into
// xq [M, K], and the int32 sums of xq per 16 inputs into qsum16 [M, K / 16]. Row by row: the
// same arithmetic whatever M.
inline void quantise_x8_rows(const uint16_t* x, int64_t M, int64_t K, int8_t* xq, float* step,
                             int32_t* qsum16) {
  const int64_t ngroups = K / kInt8XGroup;
  // packs_epi32 then packs_epi16 leave the four vectors' 4-lane runs interleaved per 128 bits
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const auto sum8 = [](__m256i v) {
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
  };
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < ngroups; ++g) {
      const int64_t at = m * K + g * kInt8XGroup;
      __m256 v[4];
      float t;
      const bool finite = load_x32(x + at, v, t);
      int32_t* sums = qsum16 + at / 16;
      if (!finite || t == 0.0f) {
        step[m * ngroups + g] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        std::memset(xq + at, 0, kInt8XGroup);
        sums[0] = sums[1] = 0;
        continue;
      }
      step[m * ngroups + g] = t / 127.0f;
      const __m256 inv = _mm256_set1_ps(127.0f / t);
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // even
      sums[0] = sum8(_mm256_add_epi32(q[0], q[1]));
      sums[1] = sum8(_mm256_add_epi32(q[2], q[3]));
      // |xq| <= 127: the packs are exact
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                               _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + at),
                          _mm256_permutevar8x32_epi32(bytes, order));
    }
  }
}

}  // namespace specserve_native

#endif  // AVX2
