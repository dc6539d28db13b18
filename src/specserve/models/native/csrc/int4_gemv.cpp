// Int4 weight-only GEMV/GEMM for x86 CPUs: AVX-512 BF16 + GFNI (Zen 4, Sapphire Rapids, ...),
// or AVX2 + FMA + F16C (Haswell, Zen 1-3, ...). One variant is compiled, chosen by the
// -march=native macros; cpu_supported() checks at run time the features of that variant.
//
// Computes y = x @ w.T for bf16 (or fp32) activations x [M, K] and int4 weights
// w[n, k] = q[n, k] * scale[n, g] + minimum[n, g], g = k / G, packed by
// specserve/models/native/int4_native.py. Registered as torch.ops.specserve.int4_gemm through
// PyTorch's stable C++ ABI (STABLE_TORCH_LIBRARY, torch::stable::parallel_for = libtorch's
// at::parallel_for thread pool): its headers compile in ~1 s where <torch/library.h> and
// <ATen/...> take 6-10 s, and no OpenMP flags are needed here.
//
// Packed layout (see int4_native.py for the Python side):
//   qweight   uint8   [Np / 16, K / 8 + K / G, 64]  one 64-byte block per (tile of 16 rows,
//             8 inputs), a tile's blocks along K; after each group's G / 8 code blocks one
//             more block holds the group's constants (laid out as in `scales` below), so a
//             tile is one stream of codes and constants. (Without the constants inline:
//             [Np / 16, K / 8, 64] and the constants in `scales`, the earlier layout, kept
//             for A/B benchmarks; the same arithmetic.) In a code block:
//             Byte  L*16 + h*8 + 2t + e  (L, t in 0..3, h, e in 0..1) belongs to row 4L + t:
//             its low nibble is q[row, k0 + 2h + e], its high nibble q[row, k0 + 4 + 2h + e].
//             With lo = byte & 15 and hi = byte >> 4, the four vpunpck{l,h}bw(lo|hi, 0x43)
//             give words 0x4300 | q = bf16(128 + q), laid out so that 32-bit lane i of the
//             c-th vector holds the pair (128 + q[i, k0 + 2c], 128 + q[i, k0 + 2c + 1]):
//             exactly the operand vdpbf16ps wants, one output row per fp32 lane.
//   scales    fp16    [Np / 16, K / G, 2, 16], or empty with the constants inline: per tile
//             and group 16 scales s, then 16 midpoints c = minimum + 7.5 s (w = (q - 7.5) s + c:
//             the midpoint is small for centred groups, so its fp16 rounding costs less than
//             the minimum's would), both divided by the row's power-of-two row_scale (fp16
//             range whatever the weights).
//   row_scale fp32    [Np]
//
//   Or, with superblock constants (super_form 3; superblock.py's pack_int4, the K-quants' own
//   form: Q4_K's constants stored as in the file), qweight uint8 [Np / 16, K / 256, 36, 64]
//   with group_size 32: per tile and superblock of 256 inputs four header blocks, then the
//   eight sub-groups' 4 code blocks each (laid out as above):
//     block 0     d[16] fp16 (bytes 0 - 31), then e[16] fp16: the rows' superblock factors
//     blocks 1-3  one six-bit unit (int8_gemv.cpp's layout, u = the code itself, 0 .. 63) of
//                 the 16 slots of each row: slot j < 8 the scale code sc_j of sub-group j,
//                 slot 8 + j its offset code mo_j
//   w[n, k] = d[n] sc_j[n] q[n, k] + e[n] mo_j[n] for input k of sub-group j: 4.5 bits a
//   weight, the file's Q4_K bytes exactly, where per-group fp16 constants take 5.
//   scales is empty and row_scale all ones.
// Per output (m, n) the arithmetic is fixed (independent of M, of the other rows and of the
// thread split, which is over tiles of N only), so every row is bit-identical to a 1-row call.
// AVX-512 variant (the AVX2 one: see its section below):
//   for each group g:
//     a0 = a1 = 0
//     for each block of 8 inputs:  a0 += pair0; a1 += pair1; a0 += pair2; a1 += pair3
//                                  (each a vdpbf16ps of (128 + q) with x)
//     y = fma(s, a0 + a1, y);  y = fma(c - 135.5 s, xsum[m, g], y)
//   out = y * row_scale
// and with superblock constants, per sub-group j:
//     a0, a1 as above;  s = d * sc_j (exact in fp32);  bias = fma(s, -128, e * mo_j)
//     y = fma(s, a0 + a1, y);  y = fma(bias, xsum[m, j], y)
// where xsum[m, g] (sum of the group's bf16 inputs in fp32) is computed per row in a fixed
// order (the same in both variants). The kernels differ only in how many tiles / rows they
// interleave (for latency).
// With AVX-512 VNNI, the AVX-512 variant multiplies int8 activations instead for superblock
// constants and for per-group ones in groups of a multiple of 32 (int8_activations() in
// int8_x.h: on unless SPECSERVE_INT8_ACTIVATIONS=0): each row's sub-group of 32 inputs is
// xq * step with step = max |x| / 127 and xq = x / step rounded to nearest even (quantise_x8
// in int8_x.h: llama.cpp's Q8_0 rounding), and per sub-group j
//     isum = sum of (q - 8) * xq (vpdpbusd of q, less 8 times the sum of xq: exact in int32)
// then with superblock constants
//     y = fma(s * step[m, j], float(isum), y);  y = fma(fma(s, 8, e * mo_j), xsum[m, j], y)
// (run_block_super_x8), with per-group ones, over the group's sub-groups j in order
//     acc = isum_j * step[m, j] for the first, acc = fma(isum_j, step[m, j], acc) after
//     y = fma(s, acc, y);  y = fma(fma(s, 0.5, c), xsum[m, g], y)
// (run_block_group_x8). Twice the products an instruction of vdpbf16ps, on codes that need no
// conversion: a verify of several rows costs less, and one row no more. The rounding of x
// meets only the centred codes (q - 8), whose products' errors cancel as those of the weights
// themselves do; the offsets' term, 8 s (or 0.5 s) included, keeps the exact sums of x (with
// q itself, every rounding error of a group would add up times 7.5 s: twice the logits' error
// on the 1.5B). Every row's arithmetic is again fixed, so rows stay batch invariant. The AVX2
// variant takes the same int8 activations for per-group constants in groups of a multiple of
// 32 (run_block_x8, vpmaddubsw) with the same arithmetic.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <immintrin.h>

#include "code_pairs.h"
#include "int4_gemv.h"
#include "int8_x.h"
#include "quant_amx.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

// One variant per build (-march=native picks it): the AVX-512 BF16 / GFNI kernel, else the
// AVX2 / FMA / F16C one, else stubs (cpu_supported() false).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512BF16__) && defined(__GFNI__)
#define SPECSERVE_INT4_AVX512 1
#ifdef SPECSERVE_INT8_X
#define SPECSERVE_INT4_X8 1  // int8 activations (vpdpbusd; int8_x_applies)
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECSERVE_INT4_AVX2 1
#else
#define SPECSERVE_INT4_NO_ISA 1
#endif

namespace {

constexpr int64_t kTile = 16;       // output rows per tile (one per fp32 lane)
constexpr int64_t kBlockK = 8;      // inputs per 64-byte block
constexpr int64_t kBlockBytes = 64;
constexpr int64_t kTileGroup = 4;   // tiles interleaved for 1-row inputs (the unit of a task)
// Superblock constants (super_form 3): superblocks of 256 inputs, sub-groups of 32, 36 blocks
// (4 header blocks, 32 of codes) per tile and superblock.
constexpr int64_t kSuperSize = 256;
constexpr int64_t kSuperGroupSize = 32;
constexpr int64_t kSuperGroups = kSuperSize / kSuperGroupSize;  // sub-groups a superblock
constexpr int64_t kSuperHeader = 4;  // d / e, then one six-bit unit of codes
constexpr int64_t kSuperBlocks = kSuperHeader + kSuperSize / kBlockK;
#ifdef SPECSERVE_INT4_AVX2
constexpr int64_t kMaxRows = 5;     // rows of x per register block
// Bytes ahead in each tile's stream of the kernels on int8 activations (run_block_x8): 2048
// when two tiles are read at once (one row), kPrefetchOneTile when one is (several rows), as
// the int8-group kernel's AVX2 path prefetches; SPECSERVE_AVX2_PREFETCH=0 turns it off.
constexpr int64_t kPrefetch = 2048;
constexpr int64_t kPrefetchOneTile = 6144;
#else
constexpr int64_t kMaxRows = 8;     // rows of x per register block
constexpr int64_t kPrefetch = 1024; // bytes ahead in each tile's stream (several tiles at once)
// Bytes ahead when one tile is read at a time (4 or more rows): the lines in flight bound what
// memory delivers, and 1024 bytes (16 lines) left these compute-heavy kernels up to 1.5x
// slower on a Zen 5 host (matmuls of 4 - 8 rows from memory, docs/benchmarks.md; 6144 was
// chosen from trial builds at 3 - 8 KiB, where exactly 4096 was much slower in the int8
// kernel). SPECSERVE_ONE_TILE_PREFETCH=0 restores kPrefetch (one_tile_prefetch in simd.h).
constexpr int64_t kPrefetchOneTile = 6144;
#endif

#ifndef SPECSERVE_INT4_NO_ISA

#ifdef SPECSERVE_INT4_AVX512
constexpr const char* kVariant = "AVX-512 BF16 / GFNI";
#else
constexpr const char* kVariant = "AVX2 / FMA / F16C";
#endif

struct Problem {
  const uint8_t* qweight;  // [ntiles, K / 8 (+ ngroups), 64]
  const uint16_t* scales;  // fp16 bits [ntiles, ngroups, 2, 16]; nullptr when inline
  const float* row_scale;  // [ntiles * 16]
  const uint32_t* xi;      // pairs of x, row-block interleaved (interleave_pairs): AVX-512
                           // bf16 pairs; AVX2 int16 pairs of x in steps of dx (quantise_rows)
  const float* dx;         // AVX2: [M, ngroups] each row's group step (a power of two)
  const float* xsum;       // [M, ngroups]
  void* out;               // [M, N], bf16 or fp32
  bool out_f32;
  bool sweep;              // AVX-512: the sweep prefetch (sweep_start in simd.h)
  bool l2;                 // prefetch into L2, not L1 (prefetch_l2 in simd.h)
  int64_t one_tile_distance;  // prefetch distance of one-tile runs (one_tile_prefetch)
  int64_t tiles_distance = 0; // AVX2: of runs over several tiles (0: no prefetch)
  bool inline_constants;   // each group's constants follow its code blocks in qweight
  bool super_constants;    // superblock constants (super_form 3), 8 groups a superblock
  int64_t M, N, K, ngroups, blocks_per_group;
  int64_t tile_bytes;      // bytes of one tile in qweight
  // Int8 activations (run_block_super_x8, run_block_group_x8): each row's inputs as int8 per
  // sub-group of 32 (quantise_x8 in int8_x.h, in the int4 blocks' input order), their steps
  // and their sums.
  const int8_t* xq = nullptr;  // [M, K]
  const float* xstep = nullptr;  // [M, K / 32]
  const int32_t* qsum = nullptr;  // [M, K / 16]: sums of xq per 16 inputs
  // AVX2 (run_block_x8): the same rounding of x (quantise_rows_x8), each row's xq as the
  // operands of vpmaddubsw, 32 bytes per block of 8 inputs [M, K / 8, 32], xstep as above, and
  // 8 times the sum of xq per 32 inputs [M, K / 32].
  const uint8_t* xops = nullptr;
  const int32_t* xcentre = nullptr;
};

// Rows are processed in blocks of at most kMaxRows (balanced sizes); block i starts at row
// block_start(M, i). Only which rows share a register block depends on M, never the
// arithmetic of a row.
inline int64_t num_row_blocks(int64_t M) { return specserve_native::num_row_blocks(M, kMaxRows); }
inline int64_t block_start(int64_t M, int64_t i) {
  return specserve_native::row_block_start(M, kMaxRows, i);
}

// Where a weight's constants live: apart (in p.scales), inline after each group's code
// blocks, or per superblock (run_block_super).
enum Form { kApart = 0, kInlineForm = 1, kSuperForm = 2, kSuperX8Form = 3,
           kInlineX8Form = 4, kApartX8Form = 5 };

#ifdef SPECSERVE_INT4_AVX512

using specserve_native::dot_pair;

// Tiles [tile0, tile0 + NT) for the MR rows of the row block at m0: the canonical arithmetic
// above. Each tile's stream is prefetched kPrefetch bytes ahead (kPrefetchOneTile when one tile
// is read at a time): the multi-row kernels are compute-bound enough that the hardware
// prefetcher falls behind, and on a Zen 5 host the 1-row kernel gained from it too (decode
// steps with and without it alternating in one process; on the Intel hosts measured before,
// it made no difference for 1 row).
// The 2- and 3-row kernels prefetch the next two tiles in one sweep instead (sweep_start in
// simd.h). kInline: each group's constants are the block after its codes in the tile's stream,
// else in p.scales.
// What a kernel over tiles [tile0, tile0 + NT) and the MR rows at m0 reads and sums: each
// tile's stream (w, prefetched pf bytes ahead, or from `ahead` in a sweep), the rows' group
// sums and bf16 pairs, and the outputs' accumulators (zero).
template <int NT, int MR>
struct Streams {
  const uint8_t* w[NT];
  const char* ahead;
  int64_t pf;
  const float* xs[MR];
  const uint32_t* xk;  // pair c of row m at xk[c * MR + m]
  __m512 y[NT][MR];

  Streams(const Problem& p, int64_t tile0, int64_t m0)
      : ahead(specserve_native::sweep_start<NT>(p.sweep, p.qweight, tile0,
                                                (p.N + kTile - 1) / kTile, p.tile_bytes)),
        pf(NT == 1 ? p.one_tile_distance : kPrefetch),
        xk(p.xi + m0 * (p.K / 2)) {
    for (int t = 0; t < NT; ++t) w[t] = p.qweight + (tile0 + t) * p.tile_bytes;
    for (int m = 0; m < MR; ++m) xs[m] = p.xsum + (m0 + m) * p.ngroups;
    for (int t = 0; t < NT; ++t)
      for (int m = 0; m < MR; ++m) y[t][m] = _mm512_setzero_ps();
  }
};

// One group's code blocks of tiles w[0 .. NT) (advanced past them) against the MR rows' pairs
// at xk (advanced too): a0 and a1 start at zero and take the pairs (0, 2) and (1, 3) of each
// block (vdpbf16ps of 128 + q with x), the arithmetic of every kernel below.
template <int NT, int MR>
__attribute__((always_inline)) inline void group_dots(const Problem& p, const uint8_t* (&w)[NT],
                                                      const char*& ahead, int64_t pf,
                                                      const uint32_t*& xk, __m512 (&a0)[NT][MR],
                                                      __m512 (&a1)[NT][MR]) {
  constexpr bool kMulti = MR > 1;
  for (int t = 0; t < NT; ++t)
    for (int m = 0; m < MR; ++m) {
      a0[t][m] = _mm512_setzero_ps();
      a1[t][m] = _mm512_setzero_ps();
    }
  for (int64_t b = 0; b < p.blocks_per_group; ++b) {
    for (int t = 0; t < NT; ++t) {
      const __m512i raw = _mm512_loadu_si512(w[t]);
      specserve_native::prefetch_line(ahead, w[t], pf, p.l2);
      w[t] += kBlockBytes;
      __m512i z[4];
      specserve_native::int4_block_pairs(raw, z);
      for (int m = 0; m < MR; ++m) {
        a0[t][m] = dot_pair<kMulti>(a0[t][m], z[0], xk + 0 * MR + m);
        a1[t][m] = dot_pair<kMulti>(a1[t][m], z[1], xk + 1 * MR + m);
        a0[t][m] = dot_pair<kMulti>(a0[t][m], z[2], xk + 2 * MR + m);
        a1[t][m] = dot_pair<kMulti>(a1[t][m], z[3], xk + 3 * MR + m);
      }
    }
    xk += 4 * MR;
  }
}

// out[m0 + m, tile's rows] = y[t][m] * row_scale (fp32, or rounded to bf16).
template <int NT, int MR>
void store_tiles(const Problem& p, int64_t tile0, int64_t m0, const __m512 (&y)[NT][MR]) {
  for (int t = 0; t < NT; ++t) {
    const int64_t n0 = (tile0 + t) * kTile;
    const int64_t valid = std::min<int64_t>(kTile, p.N - n0);
    const __mmask16 mask = valid >= kTile ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1u);
    const __m512 r = _mm512_loadu_ps(p.row_scale + n0);
    for (int m = 0; m < MR; ++m) {
      const __m512 v = _mm512_mul_ps(y[t][m], r);
      if (p.out_f32) {
        float* o = static_cast<float*>(p.out) + (m0 + m) * p.N + n0;
        _mm512_mask_storeu_ps(o, mask, v);
      } else {
        uint16_t* o = static_cast<uint16_t*>(p.out) + (m0 + m) * p.N + n0;
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        _mm256_mask_storeu_epi16(o, mask, h);
      }
    }
  }
}

// A group's constants of one tile's rows, s and mid (per-group layouts): with kInline the block
// after the group's codes in the tile's stream (w advanced past it), else the next 2 x 16
// fp16 values at sc (advanced).
template <bool kInline>
__attribute__((always_inline)) inline void group_constants(const Problem& p, const uint8_t*& w,
                                                           const uint16_t*& sc,
                                                           const char*& ahead, int64_t pf,
                                                           __m512& s, __m512& mid) {
  const uint16_t* c = sc;
  if constexpr (kInline) {
    c = reinterpret_cast<const uint16_t*>(w);
    specserve_native::prefetch_line(ahead, w, pf, p.l2);
    w += kBlockBytes;
  } else {
    sc += 2 * kTile;
  }
  s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
  mid = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + kTile)));
}

template <int NT, int MR, bool kInline>
void run_block(const Problem& p, int64_t tile0, int64_t m0) {
  const __m512 offset = _mm512_set1_ps(-135.5f);  // -(128 + 7.5)
  const int64_t tile_scales = p.ngroups * 2 * kTile;

  Streams<NT, MR> st(p, tile0, m0);
  auto& [w, ahead, pf, xs, xk, y] = st;
  const uint16_t* sc[NT];
  for (int t = 0; t < NT; ++t) sc[t] = kInline ? nullptr : p.scales + (tile0 + t) * tile_scales;

  for (int64_t g = 0; g < p.ngroups; ++g) {
    __m512 a0[NT][MR], a1[NT][MR];
    group_dots<NT, MR>(p, w, ahead, pf, xk, a0, a1);
    for (int t = 0; t < NT; ++t) {
      __m512 s, mid;
      group_constants<kInline>(p, w[t], sc[t], ahead, pf, s, mid);
      const __m512 bias = _mm512_fmadd_ps(s, offset, mid);
      for (int m = 0; m < MR; ++m) {
        const __m512 d = _mm512_add_ps(a0[t][m], a1[t][m]);
        y[t][m] = _mm512_fmadd_ps(s, d, y[t][m]);
        y[t][m] = _mm512_fmadd_ps(bias, _mm512_set1_ps(xs[m][g]), y[t][m]);
      }
    }
  }

  store_tiles<NT, MR>(p, tile0, m0, y);
}

// The six-bit unit at u (three blocks) -> its 256 codes u_b[16 c + i] at out[64 b + 16 c + i]:
// out[16 j + i] is row i's scale code of sub-group j, out[128 + 16 j + i] its offset code.
inline void super_codes(const uint8_t* u, uint8_t* out) {
  const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);
  const __m512i l0 = _mm512_loadu_si512(u), l1 = _mm512_loadu_si512(u + kBlockBytes);
  const __m512i hb = _mm512_loadu_si512(u + 2 * kBlockBytes);
  const auto high = [&](int shift) {  // bits shift, shift + 1 of each byte of hb, times 16
    return _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, shift), m2), 4);
  };
  const auto low = [&](__m512i l, int shift) {
    return _mm512_and_si512(_mm512_srli_epi16(l, shift), m4);
  };
  _mm512_storeu_si512(out, _mm512_or_si512(low(l0, 0), high(0)));
  _mm512_storeu_si512(out + 64, _mm512_or_si512(low(l0, 4), high(2)));
  _mm512_storeu_si512(out + 128, _mm512_or_si512(low(l1, 0), high(4)));
  _mm512_storeu_si512(out + 192, _mm512_or_si512(low(l1, 4), high(6)));
}

// A superblock's header blocks of each tile (w advanced past them): the rows' factors d and e,
// and the six-bit scale and offset codes of its sub-groups (super_codes).
template <int NT>
__attribute__((always_inline)) inline void super_header(const Problem& p, const uint8_t* (&w)[NT],
                                                        const char*& ahead, int64_t pf,
                                                        __m512 (&dv)[NT], __m512 (&ev)[NT],
                                                        uint8_t (&codes)[NT][256]) {
  for (int t = 0; t < NT; ++t) {
    dv[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[t])));
    ev[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[t] + 32)));
    super_codes(w[t] + kBlockBytes, codes[t]);
    for (int64_t i = 0; i < kSuperHeader; ++i) {
      specserve_native::prefetch_line(ahead, w[t], pf, p.l2);
      w[t] += kBlockBytes;
    }
  }
}

// Sub-group j's constants of one tile's rows: s = d * sc_j (exact: an fp16 times a six-bit code)
// and offset = e * mo_j, from the rows' factors and the codes super_codes unpacked.
inline void sub_group_constants(__m512 dv, __m512 ev, const uint8_t* codes, int64_t j, __m512& s,
                                __m512& offset) {
  const auto as_ps = [](const uint8_t* c) {
    const __m128i bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(c));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
  };
  s = _mm512_mul_ps(dv, as_ps(codes + 16 * j));
  offset = _mm512_mul_ps(ev, as_ps(codes + 128 + 16 * j));
}

// As run_block for superblock constants (super_form 3, the arithmetic in the header above).
template <int NT, int MR>
void run_block_super(const Problem& p, int64_t tile0, int64_t m0) {
  const __m512 minus128 = _mm512_set1_ps(-128.0f);
  Streams<NT, MR> st(p, tile0, m0);
  auto& [w, ahead, pf, xs, xk, y] = st;
  alignas(64) uint8_t codes[NT][256];

  for (int64_t g0 = 0; g0 < p.ngroups; g0 += kSuperGroups) {
    __m512 dv[NT], ev[NT];
    super_header<NT>(p, w, ahead, pf, dv, ev, codes);
    for (int64_t j = 0; j < kSuperGroups; ++j) {
      __m512 a0[NT][MR], a1[NT][MR];
      group_dots<NT, MR>(p, w, ahead, pf, xk, a0, a1);
      const int64_t g = g0 + j;
      for (int t = 0; t < NT; ++t) {
        __m512 s, offset;  // s exact: an fp16 times a six-bit code
        sub_group_constants(dv[t], ev[t], codes[t], j, s, offset);
        const __m512 bias = _mm512_fmadd_ps(s, minus128, offset);
        for (int m = 0; m < MR; ++m) {
          y[t][m] = _mm512_fmadd_ps(s, _mm512_add_ps(a0[t][m], a1[t][m]), y[t][m]);
          y[t][m] = _mm512_fmadd_ps(bias, _mm512_set1_ps(xs[m][g]), y[t][m]);
        }
      }
    }
  }
  store_tiles<NT, MR>(p, tile0, m0, y);
}

#ifdef SPECSERVE_INT4_X8
// The rows' int8 inputs (quantise_x8's xq, steps and sums of xq per 16) for the int8-activation
// kernels below: row m's 32-bit words of xq, its steps (one per 32 inputs) and its xq sums.
template <int MR>
struct X8Rows {
  const int32_t* xr[MR];
  const float* xd[MR];
  const int32_t* qs[MR];
  int64_t word = 0;  // the next block's first 32-bit word of each row's xq

  X8Rows(const Problem& p, int64_t m0) {
    const int64_t nsub = p.K / specserve_native::kInt8XGroup;
    for (int m = 0; m < MR; ++m) {
      xr[m] = reinterpret_cast<const int32_t*>(p.xq + (m0 + m) * p.K);
      xd[m] = p.xstep + (m0 + m) * nsub;
      qs[m] = p.qsum + (m0 + m) * 2 * nsub;
    }
  }
};

// Sub-group j's (32 inputs: 4 code blocks of tiles w[0 .. NT), advanced past them) integer
// sums against the rows' xq: d[t][m] = float(sum of q * xq (vpdpbusd: unsigned codes times
// signed inputs, exact in int32) less 8 times the sum of xq), exact. A code block's nibbles,
// interleaved bytewise (vpunpck{l,h}bw(lo, hi)), give in 32-bit lane i the codes of row i at
// inputs (k0, k0 + 4, k0 + 1, k0 + 5) and (k0 + 2, k0 + 6, k0 + 3, k0 + 7): quantise_x8 stores
// each block's 8 inputs in that order, so one broadcast 32-bit word of xq is the other operand.
template <int NT, int MR>
__attribute__((always_inline)) inline void sub_group_sums(const Problem& p,
                                                          const uint8_t* (&w)[NT],
                                                          const char*& ahead, int64_t pf,
                                                          X8Rows<MR>& x, int64_t j,
                                                          __m512 (&d)[NT][MR]) {
  // Two accumulators a row and tile where there are few of them (latency), one otherwise
  // (registers): the integer sums are exact, so the bits are the same either way.
  constexpr bool kTwo = NT * MR <= 4;
  __m512i a0[NT][MR], a1[NT][MR];
  for (int t = 0; t < NT; ++t)
    for (int m = 0; m < MR; ++m) {
      a0[t][m] = _mm512_setzero_si512();
      a1[t][m] = _mm512_setzero_si512();
    }
  constexpr int64_t kBlocks = specserve_native::kInt8XGroup / kBlockK;
  for (int64_t b = 0; b < kBlocks; ++b, x.word += 2) {
    for (int t = 0; t < NT; ++t) {
      const __m512i raw = _mm512_loadu_si512(w[t]);
      specserve_native::prefetch_line(ahead, w[t], pf, p.l2);
      w[t] += kBlockBytes;
      __m512i lo, hi;
      specserve_native::int4_block_nibbles(raw, lo, hi);
      const __m512i c0 = _mm512_unpacklo_epi8(lo, hi), c1 = _mm512_unpackhi_epi8(lo, hi);
      for (int m = 0; m < MR; ++m) {
        const int64_t word = x.word;
        a0[t][m] = _mm512_dpbusd_epi32(a0[t][m], c0, _mm512_set1_epi32(x.xr[m][word]));
        if constexpr (kTwo) {
          a1[t][m] = _mm512_dpbusd_epi32(a1[t][m], c1, _mm512_set1_epi32(x.xr[m][word + 1]));
        } else {
          a0[t][m] = _mm512_dpbusd_epi32(a0[t][m], c1, _mm512_set1_epi32(x.xr[m][word + 1]));
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    const __m512i centre = _mm512_set1_epi32(8 * (x.qs[m][2 * j] + x.qs[m][2 * j + 1]));
    for (int t = 0; t < NT; ++t) {
      const __m512i sum = kTwo ? _mm512_add_epi32(a0[t][m], a1[t][m]) : a0[t][m];
      d[t][m] = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, centre));
    }
  }
}

// As run_block_super on int8 activations (the arithmetic in the header's last paragraph): per
// sub-group j and row m, d = sub_group_sums' centred integer sum, then
//     y = fma(s * xstep[m, j], d, y);  y = fma(fma(s, 8, e * mo_j), xsum[m, j], y)
template <int NT, int MR>
void run_block_super_x8(const Problem& p, int64_t tile0, int64_t m0) {
  Streams<NT, MR> st(p, tile0, m0);
  auto& [w, ahead, pf, xs, xk, y] = st;
  (void)xk;
  const __m512 eight = _mm512_set1_ps(8.0f);
  X8Rows<MR> x(p, m0);
  alignas(64) uint8_t codes[NT][256];

  for (int64_t g0 = 0; g0 < p.ngroups; g0 += kSuperGroups) {
    __m512 dv[NT], ev[NT];
    super_header<NT>(p, w, ahead, pf, dv, ev, codes);
    for (int64_t j = 0; j < kSuperGroups; ++j) {
      const int64_t g = g0 + j;
      __m512 d[NT][MR];
      sub_group_sums<NT, MR>(p, w, ahead, pf, x, g, d);
      for (int t = 0; t < NT; ++t) {
        __m512 s, offset;  // s exact: an fp16 times a six-bit code
        sub_group_constants(dv[t], ev[t], codes[t], j, s, offset);
        // the codes centred on 8: the offsets' term takes 8 s on the exact sums of x
        const __m512 bias = _mm512_fmadd_ps(s, eight, offset);
        for (int m = 0; m < MR; ++m) {
          const __m512 sx = _mm512_mul_ps(s, _mm512_set1_ps(x.xd[m][g]));
          y[t][m] = _mm512_fmadd_ps(sx, d[t][m], y[t][m]);
          y[t][m] = _mm512_fmadd_ps(bias, _mm512_set1_ps(xs[m][g]), y[t][m]);
        }
      }
    }
  }
  store_tiles<NT, MR>(p, tile0, m0, y);
}

// As run_block (per-group constants, inline or apart; groups of G, a multiple of 32) on int8
// activations (the header's last paragraph): per group g and row m, with the G / 32 sub-groups
// j of the group in order,
//     acc = d_0 * xstep[m, j_0];  acc = fma(d_j, xstep[m, j], acc) for the others
//     y = fma(s, acc, y);  y = fma(fma(s, 0.5, c), xsum[m, g], y)
// (w = (q - 7.5) s + c = (q - 8) s + c + 0.5 s: the centred codes meet the rounded x, the
// offsets' term the exact sums of x).
template <int NT, int MR, bool kInline>
void run_block_group_x8(const Problem& p, int64_t tile0, int64_t m0) {
  Streams<NT, MR> st(p, tile0, m0);
  auto& [w, ahead, pf, xs, xk, y] = st;
  (void)xk;
  const int64_t tile_scales = p.ngroups * 2 * kTile;
  const uint16_t* sc[NT];
  for (int t = 0; t < NT; ++t) sc[t] = kInline ? nullptr : p.scales + (tile0 + t) * tile_scales;
  const __m512 half = _mm512_set1_ps(0.5f);
  X8Rows<MR> x(p, m0);
  const int64_t subs = p.blocks_per_group * kBlockK / specserve_native::kInt8XGroup;
  int64_t j = 0;  // the next sub-group of 32 inputs

  for (int64_t g = 0; g < p.ngroups; ++g) {
    __m512 acc[NT][MR];
    for (int64_t i = 0; i < subs; ++i, ++j) {
      __m512 d[NT][MR];
      sub_group_sums<NT, MR>(p, w, ahead, pf, x, j, d);
      for (int m = 0; m < MR; ++m) {
        const __m512 step = _mm512_set1_ps(x.xd[m][j]);
        for (int t = 0; t < NT; ++t)
          acc[t][m] = i == 0 ? _mm512_mul_ps(d[t][m], step)
                             : _mm512_fmadd_ps(d[t][m], step, acc[t][m]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      __m512 s, mid;
      group_constants<kInline>(p, w[t], sc[t], ahead, pf, s, mid);
      const __m512 bias = _mm512_fmadd_ps(s, half, mid);
      for (int m = 0; m < MR; ++m) {
        y[t][m] = _mm512_fmadd_ps(s, acc[t][m], y[t][m]);
        y[t][m] = _mm512_fmadd_ps(bias, _mm512_set1_ps(xs[m][g]), y[t][m]);
      }
    }
  }
  store_tiles<NT, MR>(p, tile0, m0, y);
}

#endif  // SPECSERVE_INT4_X8

template <int NT, int MR, int kForm>
void run_form(const Problem& p, int64_t tile0, int64_t m0) {
  if constexpr (kForm == kSuperForm) {
    run_block_super<NT, MR>(p, tile0, m0);
#ifdef SPECSERVE_INT4_X8
  } else if constexpr (kForm == kSuperX8Form) {
    run_block_super_x8<NT, MR>(p, tile0, m0);
  } else if constexpr (kForm == kInlineX8Form || kForm == kApartX8Form) {
    run_block_group_x8<NT, MR, kForm == kInlineX8Form>(p, tile0, m0);
#endif
  } else {
    run_block<NT, MR, kForm == kInlineForm>(p, tile0, m0);
  }
}

// One tile, the row block at m0 with `rows` rows (1 <= rows <= kMaxRows).
template <int kForm>
void run_rows(const Problem& p, int64_t tile0, int64_t m0, int64_t rows) {
  specserve_native::with_rows<kMaxRows>(
      rows, [&](auto mr) { run_form<1, decltype(mr)::value, kForm>(p, tile0, m0); });
}

// Tiles [begin, end), all rows. Interleaves several tiles when there are few rows (to hide the
// vdpbf16ps latency); otherwise one tile at a time, each row block in turn.
template <int kForm>
void run_range(const Problem& p, int64_t begin, int64_t end) {
  int64_t t = begin;
  if (p.M == 1) {
    for (; t + kTileGroup <= end; t += kTileGroup) run_form<kTileGroup, 1, kForm>(p, t, 0);
  } else if (p.M == 2) {
    for (; t + 2 <= end; t += 2) run_form<2, 2, kForm>(p, t, 0);
  } else if (p.M == 3) {
    for (; t + 2 <= end; t += 2) run_form<2, 3, kForm>(p, t, 0);
  }
  const int64_t nblocks = num_row_blocks(p.M);
  for (; t < end; ++t) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t m0 = block_start(p.M, i);
      run_rows<kForm>(p, t, m0, block_start(p.M, i + 1) - m0);
    }
  }
}

#endif  // SPECSERVE_INT4_AVX512

#ifdef SPECSERVE_INT4_AVX2
// ---- AVX2 / FMA / F16C variant ------------------------------------------------------------
//
// Same layout. A ymm register holds 8 32-bit lanes, so a tile of 16 rows is two halves: the
// first 32 bytes of a 64-byte block are rows 0-7 (L = 0, 1), the last 32 rows 8-15 (L = 2, 3).
// In each 128-bit lane of a half, 32-bit element t of vpunpck{l,h}bw(lo|hi, 0) is row 4L + t
// and holds the int16 pair (q[row, k], q[row, k + 1]): with an operand holding the pair
// (xq[k], xq[k + 1]) in every 32-bit lane, one vpmaddwd gives each of 8 rows the exact sum
// q[row, k] xq[k] + q[row, k + 1] xq[k + 1].
//
// Where int8 activations do not apply (groups of other sizes, a GGUF file's Q4_0 / Q4_1
// blocks, SPECSERVE_INT8_ACTIVATIONS=0; else run_block_x8 below), the activations run as
// integers, exactly where it matters: each row's group of G bf16 inputs is written
// xq[k] dx[m, g] with dx a power of two such that the group's largest |x| lies in
// [2^14, 2^15) dx; xq = x / dx rounded to nearest even, an int16 (at most 32640).
// A bf16 input carries 8 significant bits, so every input within 2^7 of its group's largest
// is exact; smaller ones are off by at most 2^-16 of the largest. Per output (m, n):
//   for each group g:
//     isum = sum over k of q[n, k] * xq[m, k]            (int32, exact: at most 15 * 32640 G)
//     y = fma(s * dx[m, g], float(isum), y);  y = fma(fma(s, -7.5, c), xsum[m, g], y)
//   out = y * row_scale          (bf16 outputs: rounded to nearest even)
// (w = (q - 7.5) s + c.) The sum is exact and the same whatever the order, so the kernels
// differ only in how many tiles, halves and rows they interleave; the variants agree to
// rounding (the AVX-512 one multiplies bf16 x as it is). G is at most kMaxGroupI16 (isum below
// 2^31). The earlier form of this loop (codes and inputs as fp32, two FMAs per pair of inputs,
// five instructions per pair and row against three here) was compute bound on a Zen 3 host at
// ~19 GB/s for one row; this one reads 1.3-1.4x faster at one row and 1.1-1.7x at five
// (`python benchmarks/int8_group_kernel.py`, docs/benchmarks.md).

constexpr int64_t kMaxGroupI16 = 4096;  // 4096 * 15 * 32640 < 2^31

// Each row's groups in the integer form above: dx [M, ngroups], and xq as int16 pairs,
// pairs[m * K / 2 + j] = (xq[m, 2j] in the low half, xq[m, 2j + 1] in the high one). A group
// holding a NaN or an infinity gets dx = NaN (its row's outputs are NaN, as an fp32 product's
// would be); one whose scale 2^(15 - e) is not a normal float (|x| below 2^-112) is all zero.
void quantise_rows(const uint16_t* x, uint32_t* pairs, float* dx, int64_t M, int64_t K,
                   int64_t G) {
  const int64_t ngroups = K / G;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < ngroups; ++g) {
      const uint16_t* xg = x + m * K + g * G;
      uint32_t* pg = pairs + (m * K + g * G) / 2;
      __m256 vmax = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
      for (int64_t k = 0; k < G; k += 8) {
        const __m256 v = specserve_native::load_bf16x8(xg + k);
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, vmax);
      const float amax = *std::max_element(lanes, lanes + 8);
      int e = 0;
      std::frexp(amax, &e);  // amax < 2^e (e = 0 for amax = 0)
      const int shift = 15 - e;
      const bool finite = _mm256_movemask_ps(unordered) == 0 && std::isfinite(amax);
      if (!finite || shift > 127) {
        std::fill(pg, pg + G / 2, 0u);
        dx[m * ngroups + g] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      // x * 2^shift is exact; the conversion rounds to nearest even (the default MXCSR mode)
      const __m256 scale = _mm256_set1_ps(std::ldexp(1.0f, shift));
      for (int64_t k = 0; k < G; k += 8) {
        const __m256 v = _mm256_mul_ps(specserve_native::load_bf16x8(xg + k), scale);
        const __m256i q = _mm256_cvtps_epi32(v);
        const __m128i packed =
            _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(pg + k / 2), packed);
      }
      dx[m * ngroups + g] = std::ldexp(1.0f, -shift);
    }
  }
}

// fp32 -> bf16, round to nearest even (NaN -> 0x7FC0, as c10::BFloat16).
inline __m128i to_bf16(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb);
  r = _mm256_srli_epi32(r, 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// Output rows [n0, n0 + 8) of x row m (only the first `valid` columns exist).
inline void store_half(const Problem& p, int64_t m, int64_t n0, int64_t valid, __m256 v) {
  if (p.out_f32) {
    float* o = static_cast<float*>(p.out) + m * p.N + n0;
    if (valid >= 8) {
      _mm256_storeu_ps(o, v);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, v);
      std::memcpy(o, tmp, static_cast<size_t>(valid) * sizeof(float));
    }
  } else {
    uint16_t* o = static_cast<uint16_t*>(p.out) + m * p.N + n0;
    const __m128i h = to_bf16(v);
    if (valid >= 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), h);
    } else {
      alignas(16) uint16_t tmp[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), h);
      std::memcpy(o, tmp, static_cast<size_t>(valid) * sizeof(uint16_t));
    }
  }
}

// A group's constants for half h of a tile's [h0, h0 + NH) (s and the midpoint c, fp32): inline,
// the block after the group's codes (w, at its tile's stream, is 32 * h0 into it), or at sc.
template <bool kInline>
inline void half_constants(const uint8_t* w, const uint16_t* sc, int h0, int h, __m256& s,
                           __m256& mid) {
  const uint16_t* c = kInline ? reinterpret_cast<const uint16_t*>(w - 32 * h0) + 8 * h0 : sc;
  s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 8 * h)));
  mid = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + kTile + 8 * h)));
}

// Past a group's constants: the inline block, or the tile's constants apart.
template <bool kInline>
inline void next_group(const uint8_t*& w, const uint16_t*& sc) {
  if constexpr (kInline) {
    w += kBlockBytes;
  } else {
    sc += 2 * kTile;
  }
}

// Tiles [tile0, tile0 + NT), halves [h0, h0 + NH) of each, for the MR rows of the row block at
// m0: the arithmetic above. The loop over the 4 input pairs c of a block is outermost; each
// (tile, half) keeps its code vector of the block's low or high nibbles in a register, and
// the int32 sums are the only other live values besides y. kInline as in the AVX-512 kernel.
template <int NT, int NH, int MR, bool kInline>
void run_block(const Problem& p, int64_t tile0, int h0, int64_t m0) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i zero = _mm256_setzero_si256();
  const __m256 offset = _mm256_set1_ps(-7.5f);
  const int64_t tile_bytes = p.tile_bytes;
  const int64_t tile_scales = p.ngroups * 2 * kTile;

  const uint8_t* w[NT];
  const uint16_t* sc[NT];
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    w[t] = p.qweight + (tile0 + t) * tile_bytes + 32 * h0;
    sc[t] = kInline ? nullptr : p.scales + (tile0 + t) * tile_scales + 8 * h0;
  }
  const float* xs[MR];
  const float* dxs[MR];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) {
    xs[m] = p.xsum + (m0 + m) * p.ngroups;
    dxs[m] = p.dx + (m0 + m) * p.ngroups;
  }
  const int32_t* xk = reinterpret_cast<const int32_t*>(p.xi + m0 * p.K / 2);
  // (xq[m0 + m, k], xq[m0 + m, k + 1]) at xk[k / 2 * MR + m]

  __m256 y[NT][NH][MR];
  specserve_native::set_zero(y);

  for (int64_t g = 0; g < p.ngroups; ++g) {
    __m256i acc[NT][NH][MR];
    specserve_native::set_zero(acc);
    for (int64_t b = 0; b < p.blocks_per_group; ++b) {
#pragma GCC unroll 2
      for (int nib = 0; nib < 2; ++nib) {  // low nibbles: k0 .. k0 + 3, high: k0 + 4 .. k0 + 7
        __m256i v[NT][NH];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
          for (int h = 0; h < NH; ++h) {
            v[t][h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[t] + 32 * h));
            if (nib == 1) v[t][h] = _mm256_srli_epi16(v[t][h], 4);
            v[t][h] = _mm256_and_si256(v[t][h], low_mask);
          }
#pragma GCC unroll 2
        for (int c = 2 * nib; c < 2 * nib + 2; ++c) {  // inputs k0 + 2c, k0 + 2c + 1
          __m256i xp[MR];
#pragma GCC unroll 16
          for (int m = 0; m < MR; ++m) xp[m] = _mm256_set1_epi32(xk[c * MR + m]);
#pragma GCC unroll 16
          for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 2
            for (int h = 0; h < NH; ++h) {
              const __m256i z = c % 2 == 0 ? _mm256_unpacklo_epi8(v[t][h], zero)
                                           : _mm256_unpackhi_epi8(v[t][h], zero);
#pragma GCC unroll 16
              for (int m = 0; m < MR; ++m)
                acc[t][h][m] = _mm256_add_epi32(acc[t][h][m], _mm256_madd_epi16(z, xp[m]));
            }
          }
        }
      }
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) w[t] += kBlockBytes;
      xk += kBlockK / 2 * MR;
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 2
      for (int h = 0; h < NH; ++h) {
        __m256 s, mid;
        half_constants<kInline>(w[t], sc[t], h0, h, s, mid);
        const __m256 bias = _mm256_fmadd_ps(s, offset, mid);
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          const __m256 step = _mm256_mul_ps(s, _mm256_broadcast_ss(dxs[m] + g));
          y[t][h][m] = _mm256_fmadd_ps(step, _mm256_cvtepi32_ps(acc[t][h][m]), y[t][h][m]);
          y[t][h][m] = _mm256_fmadd_ps(bias, _mm256_broadcast_ss(xs[m] + g), y[t][h][m]);
        }
      }
      next_group<kInline>(w[t], sc[t]);
    }
  }

  specserve_native::store_halves<NT, NH, MR>(p, tile0, h0, m0, y);
}

// One tile, the row block at m0 with `rows` rows (1 <= rows <= kMaxRows): both halves at
// once for 1 - 2 rows, else one half at a time (6 - 10 accumulators; 12 would spill).
template <bool kInline>
void run_rows(const Problem& p, int64_t tile0, int64_t m0, int64_t rows) {
  switch (rows) {
    case 1: run_block<1, 2, 1, kInline>(p, tile0, 0, m0); break;
    case 2: run_block<1, 2, 2, kInline>(p, tile0, 0, m0); break;
    case 3:
      for (int h = 0; h < 2; ++h) run_block<1, 1, 3, kInline>(p, tile0, h, m0);
      break;
    case 4:
      for (int h = 0; h < 2; ++h) run_block<1, 1, 4, kInline>(p, tile0, h, m0);
      break;
    default:
      for (int h = 0; h < 2; ++h) run_block<1, 1, 5, kInline>(p, tile0, h, m0);
      break;
  }
}

// Tiles [begin, end), all rows: two tiles at once for 1 row (8 accumulators), else one tile at
// a time, each row block in turn.
// (kForm: kApart or kInlineForm; superblock constants have the AVX-512 kernel only)
template <int kForm>
void run_range(const Problem& p, int64_t begin, int64_t end) {
  constexpr bool kInline = kForm == kInlineForm;
  int64_t t = begin;
  if (p.M == 1) {
    for (; t + 2 <= end; t += 2) run_block<2, 2, 1, kInline>(p, t, 0, 0);
  }
  const int64_t nblocks = num_row_blocks(p.M);
  for (; t < end; ++t) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t m0 = block_start(p.M, i);
      run_rows<kInline>(p, t, m0, block_start(p.M, i + 1) - m0);
    }
  }
}

// ---- AVX2, one row of x quantised to 8 bits (a draft model's one-token calls) ------------
//
// The kernels above keep every input's 16 bits and multiply 16 code-input pairs per
// instruction (vpmaddwd), so one row still reads the weights below what memory delivers. A
// draft model's proposals need neither batch invariance nor the exact arithmetic (the target
// checks every token), so where the caller allows it (PackedWeight::tiles has kQuantisedX) a
// one-row call quantises x to int8 per group, as llama.cpp's AVX2 path does for its dot
// products, and multiplies the codes with vpmaddubsw: 16-bit sums of two code x input
// products, 32 pairs per instruction. Per output n:
//   dx[g] = max |x_g| / 127;  xq[k] = round(x[k] / dx[g])   (int8, |xq| <= 127)
//   for each group g:  isum = sum_k q[n, k] * xq[k] - 8 * sum_k xq[k]   (exact: int16 partial
//                      sums of at most 4 blocks, 4 x 2 x 15 x 127 < 2^15, then int32)
//                      y = fma(s * dx[g], isum, y);  y = fma(c + 0.5 s, xsum[g], y)
//   out = y * row_scale
// w = (q - 8) s + (c + 0.5 s): the offset term takes the exact sum of the group's inputs, and
// the quantisation's error, s * sum (q - 8) (x - xq dx), comes with centred codes (half the
// error of q's own, measured: about 0.6 % of a row's output, test_int4_native.py).
//
// Per block the words a code vector gives (see the layout above: in each 128-bit lane, words
// 0-3 are rows 4L + t, inputs k0 + 2h, k0 + 2h + 1 for h = 0, words 4-7 the same rows for
// h = 1; low nibbles inputs k0 .. k0 + 3, high nibbles k0 + 4 .. k0 + 7) pair with an x
// operand holding (xq[k0], xq[k0 + 1]) in words 0-3 and (xq[k0 + 2], xq[k0 + 3]) in words
// 4-7 of both lanes (low nibbles; the next four inputs for the high ones): two vpshufb of the
// block's 8 codes of x, broadcast (x stays K bytes, in the L1 cache for every tile).

constexpr int64_t kQuantFlushBlocks = 4;  // int16 sums widened to int32 every 4 blocks
constexpr int64_t kQuantPrefetch = 1024;  // bytes ahead in the tile's stream

// xq[K]; per group g, dx[g] and qsum[g] = 8 * the sum of its xq.
void quantise_x(const uint16_t* x, int64_t K, int64_t G, int8_t* q, float* dx, int32_t* qsum) {
  for (int64_t g0 = 0; g0 < K; g0 += G) {
    float amax = 0.0f;
    for (int64_t k = g0; k < g0 + G; ++k)
      amax = std::max(amax, std::fabs(specserve_native::bf16_to_float(x[k])));
    const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    dx[g0 / G] = d;
    int32_t sum = 0;
    for (int64_t k = g0; k < g0 + G; ++k) {
      q[k] = static_cast<int8_t>(std::nearbyint(specserve_native::bf16_to_float(x[k]) * inv));
      sum += q[k];
    }
    qsum[g0 / G] = 8 * sum;
  }
}

// int16 sums (words as in a code vector) -> int32 per row: rows 4L + t at dword t of lane L.
inline __m256i widen_rows(__m256i acc, __m256i order, __m256i ones) {
  return _mm256_madd_epi16(_mm256_shuffle_epi8(acc, order), ones);
}

// Tiles [begin, end), one row of x quantised (xq, dx, qsum from quantise_x).
template <bool kInline>
void run_range_quantised(const Problem& p, const int8_t* xq, const float* dx,
                         const int32_t* qsum, int64_t begin, int64_t end) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  // word t (rows 4L + t, h = 0) and word 4 + t (h = 1) next to each other
  const __m256i order = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  // a block's 8 codes of x (broadcast) -> the low- and high-nibble operands
  const __m256i pairs_lo = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                            0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3);
  const __m256i pairs_hi = _mm256_add_epi8(pairs_lo, _mm256_set1_epi8(4));
  const __m256 half = _mm256_set1_ps(0.5f);
  const int64_t tile_scales = p.ngroups * 2 * kTile;
  for (int64_t t = begin; t < end; ++t) {
    const uint8_t* w = p.qweight + t * p.tile_bytes;
    const uint16_t* sc = kInline ? nullptr : p.scales + t * tile_scales;
    const int8_t* xb = xq;
    __m256 y[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < p.ngroups; ++g) {
      __m256i wide[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int64_t b = 0; b < p.blocks_per_group; ++b) {
        _mm_prefetch(reinterpret_cast<const char*>(w) + kQuantPrefetch, _MM_HINT_T0);
        int64_t codes;
        std::memcpy(&codes, xb, sizeof(codes));
        const __m256i xv = _mm256_set1_epi64x(codes);
        const __m256i xlo = _mm256_shuffle_epi8(xv, pairs_lo);
        const __m256i xhi = _mm256_shuffle_epi8(xv, pairs_hi);
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * h));
          const __m256i lo = _mm256_and_si256(v, low_mask);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
          acc[h] = _mm256_add_epi16(acc[h], _mm256_maddubs_epi16(lo, xlo));
          acc[h] = _mm256_add_epi16(acc[h], _mm256_maddubs_epi16(hi, xhi));
        }
        w += kBlockBytes;
        xb += kBlockK;
        if ((b + 1) % kQuantFlushBlocks == 0 || b + 1 == p.blocks_per_group) {
          for (int h = 0; h < 2; ++h) {
            wide[h] = _mm256_add_epi32(wide[h], widen_rows(acc[h], order, ones));
            acc[h] = _mm256_setzero_si256();
          }
        }
      }
      const uint16_t* c = kInline ? reinterpret_cast<const uint16_t*>(w) : sc;
      const __m256 d = _mm256_set1_ps(dx[g]), xs = _mm256_set1_ps(p.xsum[g]);
      const __m256i centre = _mm256_set1_epi32(qsum[g]);
      for (int h = 0; h < 2; ++h) {
        const __m256 s =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 8 * h)));
        const __m256 mid = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + kTile + 8 * h)));
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_sub_epi32(wide[h], centre));
        y[h] = _mm256_fmadd_ps(_mm256_mul_ps(s, d), isum, y[h]);
        y[h] = _mm256_fmadd_ps(_mm256_fmadd_ps(s, half, mid), xs, y[h]);
      }
      if constexpr (kInline) {
        w += kBlockBytes;
      } else {
        sc += 2 * kTile;
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = t * kTile + 8 * h;
      const int64_t valid = std::min<int64_t>(8, p.N - n0);
      if (valid <= 0) continue;
      store_half(p, 0, n0, valid, _mm256_mul_ps(y[h], _mm256_loadu_ps(p.row_scale + n0)));
    }
  }
}

// ---- AVX2 on int8 activations (the int4 format's groups, gguf's Q4_K as groups of 32) ------
//
// Where int8_x_applies (per-group constants in groups of a multiple of 32, not a GGUF file's
// Q4_0 / Q4_1 blocks) and int8_activations(), every call, of one row or many, rounds each
// row's inputs per 32 as the AVX-512 VNNI variant does (step = max |x| / 127, xq = x / step
// to nearest even: llama.cpp's Q8_0 rounding) and multiplies the codes with vpmaddubsw
// (unsigned codes times signed xq, two products summed in a 16-bit lane: 32 products an
// instruction where vpmaddwd takes 16, and the codes need no widening). Per sub-group j of
// 32 inputs (4 blocks; at most 8 products of 2 x 15 x 127 in a lane, below 2^15) the 16-bit
// sums widen to int32 once, and the arithmetic is the AVX-512 variant's (run_block_group_x8):
//     isum = sum of q * xq - 8 * sum of xq     (exact in int32)
//     acc = float(isum_j0) * step[m, j0];  acc = fma(float(isum_j), step[m, j], acc)
//     y = fma(s, acc, y);  y = fma(fma(s, 0.5, c), xsum[m, g], y)
// so both variants give the same fp32 sums. One row takes the same path as many, so rows stay
// batch invariant; only a draft's one-row calls keep their own quantiser (kQuantisedX).

// Each row's inputs rounded per 32 (as quantise_x8 in int8_x.h) into vpmaddubsw operands: per
// block of 8 inputs x0 .. x7, 16 bytes (x0 x1) x 4, (x2 x3) x 4 that pair with the block's
// low nibbles, then 16 bytes (x4 x5) x 4, (x6 x7) x 4 for the high ones (the code layout:
// bytes h * 8 + 2t + e of a 128-bit lane hold inputs k0 + 2h + e and k0 + 4 + 2h + e);
// step [M, K / 32]; centre [M, K / 32] 8 times the sum of xq per 32 inputs.
void quantise_rows_x8(const uint16_t* x, int64_t M, int64_t K, uint8_t* ops, float* step,
                      int32_t* centre) {
  constexpr int64_t kGroup = specserve_native::kInt8XGroup;
  const int64_t nsub = K / kGroup;
  const __m128i pairs_lo = _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3);
  const __m128i pairs_hi = _mm_add_epi8(pairs_lo, _mm_set1_epi8(4));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < nsub; ++j) {
      const int64_t at = m * K + j * kGroup;
      __m256 v[4];
      float t;
      const bool finite = specserve_native::load_x32(x + at, v, t);
      uint8_t* o = ops + at * 4;
      if (!finite || t == 0.0f) {
        step[m * nsub + j] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        std::memset(o, 0, 4 * kGroup);
        centre[m * nsub + j] = 0;
        continue;
      }
      step[m * nsub + j] = t / 127.0f;
      const __m256 inv = _mm256_set1_ps(127.0f / t);
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // even
      const __m256i s =
          _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
      centre[m * nsub + j] = 8 * _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
      for (int i = 0; i < 4; ++i) {  // block i: |xq| <= 127, so the packs are exact
        const __m128i w16 =
            _mm_packs_epi32(_mm256_castsi256_si128(q[i]), _mm256_extracti128_si256(q[i], 1));
        const __m128i b8 = _mm_packs_epi16(w16, w16);  // x0 .. x7 in bytes 0 .. 7
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32 * i), _mm_shuffle_epi8(b8, pairs_lo));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32 * i + 16),
                         _mm_shuffle_epi8(b8, pairs_hi));
      }
    }
  }
}

// Tiles [tile0, tile0 + NT), halves [h0, h0 + NH) of each, for the MR rows of the row block at
// m0, on the rows' int8 operands (quantise_rows_x8): the arithmetic above.
template <int NT, int NH, int MR, bool kInline>
void run_block_x8(const Problem& p, int64_t tile0, int h0, int64_t m0) {
  constexpr int64_t kSubBlocks = specserve_native::kInt8XGroup / kBlockK;
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  // word t (rows 4L + t, inputs k0 + 2h, h = 0) and word 4 + t (h = 1) next to each other
  const __m256i order = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  const __m256 half = _mm256_set1_ps(0.5f);
  const int64_t tile_scales = p.ngroups * 2 * kTile;
  const int64_t nsub = p.K / specserve_native::kInt8XGroup;
  const int64_t subs = p.blocks_per_group / kSubBlocks;

  // Each tile's own stream prefetched pf bytes ahead (0: not at all). Not in a sweep: a
  // gguf 1.5B decode step (two tiles at once) was slower with it, alternating in one process.
  const int64_t pf = NT == 1 ? p.one_tile_distance : p.tiles_distance;
  const char* ahead = nullptr;
  const uint8_t* w[NT];
  const uint16_t* sc[NT];
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    w[t] = p.qweight + (tile0 + t) * p.tile_bytes + 32 * h0;
    sc[t] = kInline ? nullptr : p.scales + (tile0 + t) * tile_scales + 8 * h0;
  }
  const uint8_t* xo[MR];
  const float* xd[MR];
  const int32_t* xc[MR];
  const float* xs[MR];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) {
    xo[m] = p.xops + (m0 + m) * p.K * 4;
    xd[m] = p.xstep + (m0 + m) * nsub;
    xc[m] = p.xcentre + (m0 + m) * nsub;
    xs[m] = p.xsum + (m0 + m) * p.ngroups;
  }

  __m256 y[NT][NH][MR];
  specserve_native::set_zero(y);

  int64_t j = 0;  // the next sub-group of 32 inputs
  for (int64_t g = 0; g < p.ngroups; ++g) {
    __m256 acc[NT][NH][MR];
    for (int64_t i = 0; i < subs; ++i, ++j) {
      __m256i a16[NT][NH][MR];
      specserve_native::set_zero(a16);
#pragma GCC unroll 1
      for (int64_t b = 0; b < kSubBlocks; ++b) {
        __m256i lo[NT][NH], hi[NT][NH];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
          for (int h = 0; h < NH; ++h) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[t] + 32 * h));
            lo[t][h] = _mm256_and_si256(v, low_mask);
            hi[t][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
          }
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          const __m256i xl = _mm256_broadcastsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(xo[m] + 32 * b)));
          const __m256i xh = _mm256_broadcastsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(xo[m] + 32 * b + 16)));
#pragma GCC unroll 16
          for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
            for (int h = 0; h < NH; ++h) {
              a16[t][h][m] = _mm256_add_epi16(a16[t][h][m], _mm256_maddubs_epi16(lo[t][h], xl));
              a16[t][h][m] = _mm256_add_epi16(a16[t][h][m], _mm256_maddubs_epi16(hi[t][h], xh));
            }
        }
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
          if (pf > 0) specserve_native::prefetch_line(ahead, w[t], pf, p.l2);
          w[t] += kBlockBytes;
        }
      }
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) {
        xo[m] += 32 * kSubBlocks;
        const __m256i centre = _mm256_set1_epi32(xc[m][j]);
        const __m256 step = _mm256_set1_ps(xd[m][j]);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
          for (int h = 0; h < NH; ++h) {
            const __m256i wide = _mm256_madd_epi16(_mm256_shuffle_epi8(a16[t][h][m], order), ones);
            const __m256 d = _mm256_cvtepi32_ps(_mm256_sub_epi32(wide, centre));
            acc[t][h][m] = i == 0 ? _mm256_mul_ps(d, step) : _mm256_fmadd_ps(d, step, acc[t][h][m]);
          }
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 2
      for (int h = 0; h < NH; ++h) {
        __m256 s, mid;
        half_constants<kInline>(w[t], sc[t], h0, h, s, mid);
        const __m256 bias = _mm256_fmadd_ps(s, half, mid);
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          y[t][h][m] = _mm256_fmadd_ps(s, acc[t][h][m], y[t][h][m]);
          y[t][h][m] = _mm256_fmadd_ps(bias, _mm256_broadcast_ss(xs[m] + g), y[t][h][m]);
        }
      }
      next_group<kInline>(w[t], sc[t]);
    }
  }

  specserve_native::store_halves<NT, NH, MR>(p, tile0, h0, m0, y);
}

// Tiles [begin, end), all rows, on int8 operands: two tiles at once for 1 row, else one tile
// at a time, each row block of at most kMaxRowsX8 rows over both halves (each x operand read
// once for 16 output rows; blocks of up to 5 rows one half at a time, the int16 kernels'
// blocking, ran at about a third of vpmaddubsw's rate on a Zen 3 host, and blocks of up to 8
// rows one half at a time 0.6-0.9x of these). Exactly 5 rows (a k = 4 verify) run as one
// block of 5: its 10 sums and 4 code vectors take every register, but the codes are unpacked
// once instead of twice (3 + 2 rows), 1.08-1.16x faster on a Zen 3 host; from 10 rows blocks
// of 5 were slower than of at most 4 (0.95-0.97x), so only 5 rows take them.
constexpr int64_t kMaxRowsX8 = 4;  // rows of a register block on int8 operands
constexpr int64_t kFiveRows = 5;

template <bool kInline>
void run_range_x8(const Problem& p, int64_t begin, int64_t end) {
  int64_t t = begin;
  if (p.M == 1) {
    for (; t + 2 <= end; t += 2) run_block_x8<2, 2, 1, kInline>(p, t, 0, 0);
  }
  const int64_t maxr = p.M == kFiveRows ? kFiveRows : kMaxRowsX8;
  const int64_t nblocks = specserve_native::num_row_blocks(p.M, maxr);
  for (; t < end; ++t) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t m0 = specserve_native::row_block_start(p.M, maxr, i);
      const int64_t rows = specserve_native::row_block_start(p.M, maxr, i + 1) - m0;
      specserve_native::with_rows<kFiveRows>(rows, [&](auto mr) {
        run_block_x8<1, 2, decltype(mr)::value, kInline>(p, t, 0, m0);
      });
    }
  }
}

#endif  // SPECSERVE_INT4_AVX2

// xsum[m, g] = sum of the group's inputs (bf16 -> fp32), in a fixed order per row.
void group_sums(const uint16_t* x, float* xsum, int64_t M, int64_t K, int64_t G) {
  const int64_t ngroups = K / G;
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* xr = x + m * K;
    for (int64_t g = 0; g < ngroups; ++g) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t j = g * G; j < (g + 1) * G; j += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + j));
        const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        acc = _mm256_add_ps(acc, _mm256_castsi256_ps(wide));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc);
      float a = lanes[0] + lanes[1];
      float b = lanes[2] + lanes[3];
      float c = lanes[4] + lanes[5];
      float d = lanes[6] + lanes[7];
      a = a + b;
      c = c + d;
      xsum[m * ngroups + g] = a + c;
    }
  }
}

// The CPU features the compiled variant needs and this CPU lacks ("" when it has them all).
std::string cpu_missing() {
  __builtin_cpu_init();
  std::string missing;
  const auto need = [&missing](bool has, const char* name) {
    if (has) return;
    if (!missing.empty()) missing += ", ";
    missing += name;
  };
#ifdef SPECSERVE_INT4_AVX512
  need(__builtin_cpu_supports("avx512f"), "avx512f");
  need(__builtin_cpu_supports("avx512bw"), "avx512bw");
  need(__builtin_cpu_supports("avx512vl"), "avx512vl");
  need(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
  need(__builtin_cpu_supports("gfni"), "gfni");
#else
  need(__builtin_cpu_supports("avx2"), "avx2");
  need(__builtin_cpu_supports("fma"), "fma");
  need(__builtin_cpu_supports("f16c"), "f16c");
#endif
  return missing;
}

#endif  // SPECSERVE_INT4_NO_ISA

}  // namespace

namespace specserve_native {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

PackedWeight tile_packed_weight(const Tensor& qweight, const Tensor& scales,
                                const Tensor& row_scale, int64_t out_features, int64_t group_size,
                                const char* what, int bits) {
  STD_TORCH_CHECK(qweight.is_cpu() && scales.is_cpu() && row_scale.is_cpu(), what,
                  ": CPU tensors only");
  // Empty scales: the constants are inline, one block after each group's code blocks.
  const bool inline_constants = scales.numel() == 0;
  int64_t ngroups = 0;
  int super_form = 0;
  bool quad_order = false;
  if (bits == 6) {
    // six-bit int8-group codes: [Np/16, K/G, 3 G/16 + 1, 64], G/16 units of three code blocks
    // a group, then the constants (always inline); or, with superblock constants, G/16 units
    // after H header blocks (1 + G/64 without offsets, 2 + G/32 with them)
    STD_TORCH_CHECK(group_size > 0 && group_size % 16 == 0, what,
                    ": six-bit codes need a group_size that is a positive multiple of 16");
    const int64_t units = 3 * group_size / 16;
    // five dimensions: superblock constants with the units in quad order (int8_gemv.cpp)
    quad_order = qweight.dim() == 5;
    const bool shape_ok =
        qweight.scalar_type() == ScalarType::Char && qweight.is_contiguous() &&
        ((qweight.dim() == 4 && qweight.size(3) == kBlockBytes) ||
         (quad_order && qweight.size(3) == 2 && qweight.size(4) == kBlockBytes / 2));
    if (shape_ok && group_size % 64 == 0 && qweight.size(2) == units + 1 + group_size / 64) {
      super_form = 1;
    } else if (shape_ok && group_size % 64 == 0 &&
               qweight.size(2) == units + 2 + group_size / 32) {
      super_form = 2;
    } else {
      STD_TORCH_CHECK(shape_ok && !quad_order && qweight.size(2) == units + 1, what,
                      ": six-bit qweight must be contiguous int8 [Np/16, K/G, ", units + 1,
                      ", 64] for group_size ", group_size,
                      " (or with superblock constants: ", units + 1 + group_size / 64, " or ",
                      units + 2 + group_size / 32,
                      " blocks a group, G a multiple of 64; in quad order [Np/16, K/G, blocks, 2, "
                      "32])");
    }
    STD_TORCH_CHECK(inline_constants, what,
                    ": six-bit codes keep their constants inline (scales must be empty fp16)");
    ngroups = qweight.size(1);
  } else if (bits == 4 && qweight.dim() == 4) {
    // int4 with superblock constants: [Np/16, K/256, 36, 64], sub-groups of 32
    STD_TORCH_CHECK(qweight.scalar_type() == ScalarType::Byte && qweight.is_contiguous() &&
                        qweight.size(2) == kSuperBlocks && qweight.size(3) == kBlockBytes,
                    what, ": int4 qweight with superblock constants must be contiguous uint8 "
                    "[Np/16, K/256, ", kSuperBlocks, ", 64]");
    STD_TORCH_CHECK(group_size == kSuperGroupSize, what,
                    ": int4 superblock constants need group_size ", kSuperGroupSize, ", got ",
                    group_size);
    STD_TORCH_CHECK(inline_constants, what,
                    ": superblock constants are inline (scales must be empty fp16)");
    super_form = 3;
    ngroups = qweight.size(1) * kSuperGroups;
  } else {
    // int4: uint8 codes, 8 inputs a block; int8 group: int8 codes, 4 inputs a block.
    const int64_t block_k = bits == 4 ? 8 : 4;
    const ScalarType code_type = bits == 4 ? ScalarType::Byte : ScalarType::Char;
    const char* layout =
        bits == 4 ? "uint8 [Np/16, K/8 (+ K/G), 64]" : "int8 [Np/16, K/4 (+ K/G), 64]";
    STD_TORCH_CHECK(qweight.scalar_type() == code_type && qweight.dim() == 3 &&
                        qweight.size(2) == kBlockBytes && qweight.is_contiguous(),
                    what, ": qweight must be contiguous ", layout);
    STD_TORCH_CHECK(group_size > 0 && group_size % block_k == 0, what,
                    ": group_size must be a positive multiple of ", block_k);
    const int64_t per_group = group_size / block_k + (inline_constants ? 1 : 0);
    STD_TORCH_CHECK(qweight.size(1) % per_group == 0, what, ": qweight has ", qweight.size(1),
                    " blocks per tile, not whole groups of ", per_group, " for group_size ",
                    group_size);
    ngroups = qweight.size(1) / per_group;
  }
  const int64_t ntiles = qweight.size(0);
  STD_TORCH_CHECK(out_features > (ntiles - 1) * kTile && out_features <= ntiles * kTile, what,
                  ": out_features does not match the packed rows");
  STD_TORCH_CHECK(scales.scalar_type() == ScalarType::Half &&
                      (inline_constants ||
                       (scales.is_contiguous() && scales.numel() == ntiles * ngroups * 2 * kTile)),
                  what, ": scales must be contiguous fp16 [Np/16, K/G, 2, 16] (or empty: inline)");
  STD_TORCH_CHECK(row_scale.scalar_type() == ScalarType::Float && row_scale.is_contiguous() &&
                      row_scale.numel() == ntiles * kTile,
                  what, ": row_scale must be contiguous fp32 [Np]");
  PackedWeight w{static_cast<const uint8_t*>(qweight.const_data_ptr()),
                 inline_constants ? nullptr : static_cast<const uint16_t*>(scales.const_data_ptr()),
                 static_cast<const float*>(row_scale.const_data_ptr()), out_features,
                 ngroups * group_size, group_size, bits};
  w.inline_constants = inline_constants;
  w.super_form = super_form;
  w.quad_order = quad_order;
  w.tile_bytes = qweight.size(1) * (qweight.dim() >= 4 ? qweight.size(2) : 1) * kBlockBytes;
  return w;
}

#ifdef SPECSERVE_INT4_NO_ISA

bool cpu_supported() { return false; }

void int4_matmul(const uint16_t*, int64_t, const PackedWeight&, void*, bool) {
  STD_TORCH_CHECK(false, "int4 kernel built for a CPU without AVX2 / FMA / F16C");
}

#else

bool cpu_supported() { return cpu_missing().empty(); }

#if defined(SPECSERVE_INT4_X8) || defined(SPECSERVE_INT4_AVX2)
// Whether w takes int8 activations: superblock constants, or per-group constants in groups of
// a multiple of 32 unless the caller keeps x exact (kExactX: a GGUF file's Q4_0 / Q4_1).
bool int8_x_applies(const PackedWeight& w) {
  return w.super_form == 3 ||
         (w.super_form == 0 && w.group_size % specserve_native::kInt8XGroup == 0 &&
          (w.tiles & kExactX) == 0);
}
#endif

void int4_matmul(const uint16_t* x, int64_t M, const PackedWeight& w, void* out, bool out_f32) {
  const int64_t K = w.K, ngroups = K / w.group_size;
  const int64_t ntiles = (w.N + kTile - 1) / kTile;
  if (M == 0 || w.N == 0) return;
  std::vector<float> xsum(static_cast<size_t>(M * ngroups));
  group_sums(x, xsum.data(), M, K, w.group_size);
  if (quant_amx_applies(w)) {  // the AMX tiles (quant_amx.cpp), x read in place
    const QuantTiles tiles{&w, x, xsum.data(), out, out_f32, M, amx_prefetch()};
    torch::stable::parallel_for(0, ntiles, amx_grain(K, M, 4), [&](int64_t begin, int64_t end) {
      quant_amx_range(tiles, begin, end);
    });
    return;
  }
  Problem p;
#ifdef SPECSERVE_INT4_AVX2
  // a draft's one-row calls round x per group (run_range_quantised: the 0.5B's one-token draft
  // step 1.11x faster than on run_block_x8, benchmarks/int4_kernel.py --part draft); every
  // other call takes int8 activations where they apply (run_block_x8). The AVX-512 variant has
  // no one-row-only path: all of a weight's calls take int8 activations (int8_x_applies) or
  // none.
  const bool quantised = M == 1 && (w.tiles & kQuantisedX) != 0;
  const bool x8 = !quantised && int8_x_applies(w) && specserve_native::int8_activations();
#endif
#ifdef SPECSERVE_INT4_AVX512
  std::vector<uint32_t> xi;
  const uint32_t* xip = reinterpret_cast<const uint32_t*>(x);  // 1 row: itself
#ifdef SPECSERVE_INT4_X8
  // superblock constants, or inline per-group ones in groups of a multiple of 32, on int8
  // activations: the rows quantised, no pair interleaving
  const bool x8 = int8_x_applies(w) && specserve_native::int8_activations();
  std::vector<int8_t> x8q(static_cast<size_t>(x8 ? M * K : 0));
  std::vector<float> x8step(static_cast<size_t>(x8 ? M * K / specserve_native::kInt8XGroup : 0));
  std::vector<int32_t> x8sum(static_cast<size_t>(x8 ? M * K / 16 : 0));
  if (x8) {
    specserve_native::quantise_x8(x, M, K, true, x8q.data(), x8step.data(), x8sum.data());
    p.xq = x8q.data();
    p.xstep = x8step.data();
    p.qsum = x8sum.data();
  }
#else
  constexpr bool x8 = false;
#endif
  if (M > 1 && !x8) {
    xi.resize(static_cast<size_t>(M * K / 2));
    specserve_native::interleave_pairs(xip, xi.data(), M, K / 2, kMaxRows);
    xip = xi.data();
  }
  p.xi = xip;
  p.dx = nullptr;
#else
  STD_TORCH_CHECK(w.super_form == 0, "int4 kernel (", kVariant,
                  "): superblock constants need the AVX-512 BF16 / GFNI kernel");
  const bool exact = !quantised && !x8;  // the int16 form (quantise_rows)
  STD_TORCH_CHECK(!exact || w.group_size <= kMaxGroupI16, "int4 kernel (", kVariant,
                  "): group_size ", w.group_size, " is above ", kMaxGroupI16);
  std::vector<uint32_t> pairs(static_cast<size_t>(exact ? M * K / 2 : 0)), xi;
  std::vector<float> dxr(static_cast<size_t>(exact ? M * ngroups : 0));
  if (exact) quantise_rows(x, pairs.data(), dxr.data(), M, K, w.group_size);
  // every byte is written by quantise_rows_x8: no zero-filling on this per-call path
  const size_t x8bytes = static_cast<size_t>(x8 ? M * K * 4 : 0);
  std::unique_ptr<uint8_t[]> x8ops(x8bytes > 0 ? new uint8_t[x8bytes] : nullptr);
  std::vector<float> x8step(static_cast<size_t>(x8 ? M * K / specserve_native::kInt8XGroup : 0));
  std::vector<int32_t> x8centre(x8step.size());
  if (x8) {
    quantise_rows_x8(x, M, K, x8ops.get(), x8step.data(), x8centre.data());
    p.xops = x8ops.get();
    p.xstep = x8step.data();
    p.xcentre = x8centre.data();
  }
  if (exact && M > 1) {  // one row is its own interleaving
    xi.resize(pairs.size());
    specserve_native::interleave_pairs(pairs.data(), xi.data(), M, K / 2, kMaxRows);
  }
  p.xi = M > 1 ? xi.data() : pairs.data();
  p.dx = dxr.data();
  std::vector<int8_t> xq(static_cast<size_t>(quantised ? K : 0));
  std::vector<float> dx(static_cast<size_t>(quantised ? ngroups : 0));
  std::vector<int32_t> qsum(dx.size());
  if (quantised) quantise_x(x, K, w.group_size, xq.data(), dx.data(), qsum.data());
#endif
  p.qweight = w.qweight;
  p.scales = w.scales;
  p.row_scale = w.row_scale;
  p.xsum = xsum.data();
  p.out = out;
  p.out_f32 = out_f32;
  p.sweep = specserve_native::sweep_prefetch();
  p.l2 = specserve_native::prefetch_l2();
#ifdef SPECSERVE_INT4_AVX512
  p.one_tile_distance = specserve_native::one_tile_prefetch() ? kPrefetchOneTile : kPrefetch;
#else  // only the kernels on int8 activations prefetch (run_block_x8)
  const bool fetch = specserve_native::avx2_prefetch();
  p.one_tile_distance =
      fetch ? (specserve_native::one_tile_prefetch() ? kPrefetchOneTile : kPrefetch) : 0;
  p.tiles_distance = fetch ? kPrefetch : 0;
#endif
  p.M = M;
  p.N = w.N;
  p.K = K;
  p.ngroups = ngroups;
  p.blocks_per_group = w.group_size / kBlockK;
  p.inline_constants = w.inline_constants;
  p.super_constants = w.super_form == 3;
  p.tile_bytes = w.tile_bytes;

  // Split over N only: tasks are runs of kTileGroup-tile groups (whole groups for the 1-row
  // kernel) holding at least 128 KiB / (M + 1) of weights, so tiny layers stay on one thread.
  const int64_t tile_group_bytes = K / 2 * kTile * kTileGroup;
  const int64_t ntile_groups = (ntiles + kTileGroup - 1) / kTileGroup;
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{128} << 10) / (tile_group_bytes * std::min<int64_t>(M + 1, 16)));
  torch::stable::parallel_for(0, ntile_groups, grain, [&](int64_t begin, int64_t end) {
#ifdef SPECSERVE_INT4_AVX2
    if (x8) {
      const int64_t first = begin * kTileGroup, last = std::min(ntiles, end * kTileGroup);
      if (p.inline_constants)
        run_range_x8<true>(p, first, last);
      else
        run_range_x8<false>(p, first, last);
      return;
    }
    if (quantised) {
      const int64_t first = begin * kTileGroup, last = std::min(ntiles, end * kTileGroup);
      if (p.inline_constants)
        run_range_quantised<true>(p, xq.data(), dx.data(), qsum.data(), first, last);
      else
        run_range_quantised<false>(p, xq.data(), dx.data(), qsum.data(), first, last);
      return;
    }
#endif
    const int64_t first = begin * kTileGroup, last = std::min(ntiles, end * kTileGroup);
#ifdef SPECSERVE_INT4_AVX512
    if (p.super_constants) {
#ifdef SPECSERVE_INT4_X8
      if (p.xq != nullptr) {
        run_range<kSuperX8Form>(p, first, last);
        return;
      }
#endif
      run_range<kSuperForm>(p, first, last);
      return;
    }
#endif
#ifdef SPECSERVE_INT4_X8
    if (p.xq != nullptr) {
      if (p.inline_constants) {
        run_range<kInlineX8Form>(p, first, last);
      } else {
        run_range<kApartX8Form>(p, first, last);
      }
      return;
    }
#endif
    if (p.inline_constants) {
      run_range<kInlineForm>(p, first, last);
    } else {
      run_range<kApart>(p, first, last);
    }
  });
}

#endif  // SPECSERVE_INT4_NO_ISA

// A new CPU tensor [rows, cols], fp32 or bf16 (the C shim: cheaper than a dispatcher call).
Tensor empty_2d(int64_t rows, int64_t cols, bool f32) {
  const int64_t sizes[2] = {rows, cols};
  const int64_t strides[2] = {cols, 1};
  AtenTensorHandle handle = nullptr;
  const int32_t dtype = f32 ? aoti_torch_dtype_float32() : aoti_torch_dtype_bfloat16();
  STD_TORCH_CHECK(aoti_torch_empty_strided(2, sizes, strides, dtype, aoti_torch_device_type_cpu(),
                                           0, &handle) == AOTI_TORCH_SUCCESS,
                  "cannot allocate a ", rows, " x ", cols, " tensor");
  return Tensor(handle);
}

}  // namespace specserve_native

namespace {

using specserve_native::PackedWeight;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Tensor int4_gemm(const Tensor& x_in, const Tensor& qweight, const Tensor& scales,
                 const Tensor& row_scale, int64_t out_features, int64_t group_size, int64_t tiles) {
#ifdef SPECSERVE_INT4_NO_ISA
  STD_TORCH_CHECK(false, "int4_gemm: built for a CPU without AVX2 / FMA / F16C");
#else
  STD_TORCH_CHECK(specserve_native::cpu_supported(), "int4_gemm: this CPU lacks ", cpu_missing(),
                  " (the kernel was built for ", kVariant, ")");
#endif
  STD_TORCH_CHECK(x_in.is_cpu(), "int4_gemm: CPU tensors only");
  STD_TORCH_CHECK(x_in.dim() == 2, "int4_gemm: x must be [M, K]");
  const ScalarType xt = x_in.scalar_type();
  STD_TORCH_CHECK(xt == ScalarType::BFloat16 || xt == ScalarType::Float,
                  "int4_gemm: x must be bf16 or fp32");
  PackedWeight w = specserve_native::tile_packed_weight(qweight, scales, row_scale, out_features,
                                                       group_size, "int4_gemm", 4);
  w.tiles = tiles;
  STD_TORCH_CHECK(x_in.size(1) == w.K, "int4_gemm: x has ", x_in.size(1), " inputs, weight ",
                  w.K);
  Tensor x = xt == ScalarType::BFloat16 ? x_in : torch::stable::to(x_in, ScalarType::BFloat16);
  if (!x.is_contiguous()) x = torch::stable::contiguous(x);
  const bool f32 = xt == ScalarType::Float;
  Tensor out = specserve_native::empty_2d(x.size(0), out_features, f32);
  specserve_native::int4_matmul(static_cast<const uint16_t*>(x.const_data_ptr()), x.size(0), w,
                                out.mutable_data_ptr(), f32);
  return out;
}

// Whether one-row int4 calls whose `tiles` has kQuantisedX quantise x (the AVX2 variant).
bool int4_quantised_x() {
#ifdef SPECSERVE_INT4_AVX2
  return true;
#else
  return false;
#endif
}

// Whether weights with superblock constants, or per-group ones in groups of a multiple of 32,
// multiply int8 activations now (int8_activations).
bool int4_int8_activations() {
#if defined(SPECSERVE_INT4_X8) || defined(SPECSERVE_INT4_AVX2)
  return specserve_native::int8_activations();
#else
  return false;
#endif
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def(
      "int4_gemm(Tensor x, Tensor qweight, Tensor scales, Tensor row_scale, int out_features, "
      "int group_size, int tiles=1) -> Tensor");
  m.def("int4_quantised_x() -> bool");
  m.def("int4_int8_activations() -> bool");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CPU, m) { m.impl("int4_gemm", TORCH_BOX(&int4_gemm)); }

STABLE_TORCH_LIBRARY_IMPL(specserve, CompositeExplicitAutograd, m) {
  m.impl("int4_quantised_x", TORCH_BOX(&int4_quantised_x));
  m.impl("int4_int8_activations", TORCH_BOX(&int4_int8_activations));
}
