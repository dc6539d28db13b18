// Eight-lane fp32 helpers (AVX2 + FMA + F16C) shared by the native ops: bf16 loads and
// stores with the rounding torch uses, a fixed-order horizontal sum, and e^x; and the prefetch
// switches and sweep of the int4 and int8 group matmuls. Every kernel of
// the library needs at least these instructions (build.py checks the CPU flags before it
// compiles), so the elementwise parts of a layer run the same code on AVX2 and AVX-512 CPUs.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

namespace specserve_native {

// Whether this CPU runs the helpers below (and the bf16 matmul): AVX2, FMA and F16C.
inline bool avx2_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

// Whether the matmul kernels that read two tiles at once (2 and 3 rows) prefetch the next
// tiles in one sweep in address order (the default) or each tile's stream on its own
// (SPECSERVE_SWEEP_PREFETCH=0). Read on every call (a getenv is nothing beside a matmul), so a
// benchmark can alternate both in one process; only the order of reads differs, never the
// outputs.
inline bool sweep_prefetch() {
  const char* v = std::getenv("SPECSERVE_SWEEP_PREFETCH");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Whether kernels reading one tile at a time (4 or more rows) prefetch further ahead than those
// reading several (the default), or as far as those (SPECSERVE_ONE_TILE_PREFETCH=0, the earlier
// distances). Read on every call, like sweep_prefetch(), so that a benchmark can alternate
// both in one process; only reads move, never the outputs.
inline bool one_tile_prefetch() {
  const char* v = std::getenv("SPECSERVE_ONE_TILE_PREFETCH");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Whether the AVX2 int4 kernel on int8 activations prefetches its weights (the default) or
// leaves them to the hardware prefetcher (SPECSERVE_AVX2_PREFETCH=0). Read on every call, like
// sweep_prefetch(); only reads move, never the outputs.
inline bool avx2_prefetch() {
  const char* v = std::getenv("SPECSERVE_AVX2_PREFETCH");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Where a kernel run over the NT tiles from tile0 of a packed weight (ntiles tiles of
// tile_bytes each from qweight, contiguous) prefetches. The 2- and 3-row kernels read two tiles
// at once: two streams a tile apart, which memory serves more slowly than one
// (benchmarks/read_streams.c). With the sweep on they prefetch the next two tiles instead, in
// address order, one line per tile and block step, so that memory sees one stream and the
// loads hit the cache; only reads move, never the arithmetic. nullptr (other tile counts, the
// last tiles, or the sweep off): each tile's own stream is prefetched. The 1-row kernels'
// four tiles keep that: their decode steps were 2 % slower with the sweep
// (docs/benchmarks.md).
template <int NT>
inline const char* sweep_start(bool on, const void* qweight, int64_t tile0, int64_t ntiles,
                               int64_t tile_bytes) {
  if (NT != 2 || !on || tile0 + 2 * NT > ntiles) return nullptr;
  return static_cast<const char*>(qweight) + (tile0 + NT) * tile_bytes;
}

// Whether the int4 and int8 group kernels prefetch into L2 (the default on AVX-512 builds)
// rather than L1 (SPECSERVE_PREFETCH_L2=0, and AVX2 builds, where it was not measured). The
// lines prefetched ahead, the tiles being read and the x rows overflow L1: with the lines in
// L2 a gguf 1.5B step of 1 token took 8 % less time, of 2-3 tokens 11-22 % less, on a Zen 4
// host (docs/benchmarks.md). Read on every call, like sweep_prefetch(); only reads move.
inline bool prefetch_l2() {
#ifdef __AVX512F__
  const char* v = std::getenv("SPECSERVE_PREFETCH_L2");
  return v == nullptr || std::strcmp(v, "0") != 0;
#else
  return false;
#endif
}

// One block step's prefetch for one tile: the sweep's next line (advancing it), or without a
// sweep the line `distance` bytes ahead of the tile's own stream at `own`; into L2 if `l2`.
inline void prefetch_line(const char*& sweep, const void* own, int64_t distance, bool l2) {
  const char* line = sweep != nullptr ? sweep : static_cast<const char*>(own) + distance;
  if (l2)
    _mm_prefetch(line, _MM_HINT_T1);
  else
    _mm_prefetch(line, _MM_HINT_T0);
  if (sweep != nullptr) sweep += 64;
}

// The matmuls process the M rows of x in register blocks of at most max_rows rows, of balanced
// sizes; block i starts at row row_block_start(M, max_rows, i). Only which rows share a block
// depends on M, never the arithmetic of a row.
inline int64_t num_row_blocks(int64_t M, int64_t max_rows) { return (M + max_rows - 1) / max_rows; }
inline int64_t row_block_start(int64_t M, int64_t max_rows, int64_t i) {
  const int64_t n = num_row_blocks(M, max_rows), base = M / n, extra = M % n;
  return i * base + (i < extra ? i : extra);
}

// Calls f(std::integral_constant<int, R>{}) with R = min(rows, kMax), rows >= 1: a row
// block's size, known at run time, as the template argument the kernels are unrolled for.
template <int kMax, class F>
inline void with_rows(int64_t rows, F&& f) {
  const int r = rows < kMax ? static_cast<int>(rows) : kMax;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((r == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }(std::make_integer_sequence<int, kMax>{});
}

// xi: for each row block [m0, m0 + rows), the `pairs` bf16 pairs (one 32-bit word each) of its
// rows interleaved (pair j of row m0 + r at xi[m0 * pairs + j * rows + r]), so one pointer and
// constant offsets reach every row's broadcast operand of vdpbf16ps. A 1-row block is the row.
inline void interleave_pairs(const uint32_t* x, uint32_t* xi, int64_t M, int64_t pairs,
                             int64_t max_rows) {
  for (int64_t i = 0; i < num_row_blocks(M, max_rows); ++i) {
    const int64_t m0 = row_block_start(M, max_rows, i);
    const int64_t rows = row_block_start(M, max_rows, i + 1) - m0;
    uint32_t* dst = xi + m0 * pairs;
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t* src = x + (m0 + r) * pairs;
      for (int64_t j = 0; j < pairs; ++j) dst[j * rows + r] = src[j];
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// acc += dot2(w, broadcast(*p)) per fp32 lane (vdpbf16ps with the bf16 pair at p). Multi-row
// kernels fold the broadcast into the instruction's memory operand (GCC does not; measured
// ~20% faster with 5 rows in the int4 kernel, slower with 1). Same instruction, same operands:
// bit-identical either way.
template <bool kEmbedded>
inline __m512 dot_pair(__m512 acc, __m512i w, const uint32_t* p) {
  if constexpr (kEmbedded) {
    asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
  } else {
    uint32_t v;
    std::memcpy(&v, p, sizeof(v));
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32(static_cast<int>(v)));
  }
}
#endif

// 8 bf16 values -> fp32 (exact: a bf16 is the top half of an fp32).
inline __m256 load_bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The bf16 bit patterns of v in the low 16 bits of each 32-bit lane: round to nearest even,
// NaN -> 0x7FC0, as torch's float -> bfloat16 conversion.
inline __m256i bf16_bits(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
}

// The bf16 value nearest to v, as fp32: what an eager bf16 op hands to the next one.
inline __m256 round_bf16(__m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16));
}

// fp32 -> 8 bf16 values at p (rounded as round_bf16).
inline void store_bf16x8(uint16_t* p, __m256 v) {
  const __m256i b = bf16_bits(v);  // lanes 0..7, each < 2^16
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// One fp32 value -> bf16 bits (the scalar form of bf16_bits).
inline uint16_t bf16_bits_scalar(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}

// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the one summation order of a vector.
inline float reduce_add(__m256 v) {
  const __m128 h = _mm_hadd_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_hadd_ps(h, h);  // [(l0+l1)+(l2+l3), (l4+l5)+(l6+l7), ...]
  return _mm_cvtss_f32(q) + _mm_cvtss_f32(_mm_shuffle_ps(q, q, 1));
}

inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(m);
}

// e^x in fp32 for x clamped to [-86.5, 88.37] (results below 2.8e-38 are not needed here:
// softmax weights and SiLU): x = k ln2 + r, |r| <= ln2 / 2, e^r by the Cephes expf polynomial
// (~1 ulp), times 2^(k-1) and 2 so that k = 128 stays finite.
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.37f)), _mm256_set1_ps(-86.5f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(126)), 23);  // 2^(k-1)
  return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.0f));
}

// Every vector of an accumulator array of the 8-lane kernels ([tiles][halves][rows]) set to
// zero.
template <class V, int NT, int NH, int MR>
inline void set_zero(V (&v)[NT][NH][MR]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
    for (int h = 0; h < NH; ++h)
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) v[t][h][m] = V{};
}

// The 8-lane kernels' outputs: for tiles [tile0, tile0 + NT) of 16 rows, halves [h0, h0 + NH)
// of 8 rows each, and the MR rows of x at m0, y times the rows' p.row_scale, written by the
// kernel's own store_half(p, m, n0, valid, v) (found by argument-dependent lookup: each kernel
// file has its Problem and store_half); rows past p.N are not written.
template <int NT, int NH, int MR, class P>
inline void store_halves(const P& p, int64_t tile0, int h0, int64_t m0,
                         const __m256 (&y)[NT][NH][MR]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 2
    for (int h = 0; h < NH; ++h) {
      const int64_t n0 = (tile0 + t) * 16 + 8 * (h0 + h);
      const int64_t valid = p.N - n0 < 8 ? p.N - n0 : 8;
      if (valid <= 0) continue;
      const __m256 r = _mm256_loadu_ps(p.row_scale + n0);
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) store_half(p, m0 + m, n0, valid, _mm256_mul_ps(y[t][h][m], r));
    }
  }
}

// Lanes i < n (0 <= n <= 8) all ones, the others zero: the mask of a tail of n values.
inline __m256 tail_mask(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx));
}

}  // namespace specserve_native
