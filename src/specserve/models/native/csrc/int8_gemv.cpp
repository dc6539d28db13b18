// Int8-group weight-only GEMV/GEMM for x86 CPUs with AVX2 + FMA + F16C (Haswell, Zen 1 and
// later). Where the build has AVX-512F, the same arithmetic runs 16 lanes a vector instead of
// 8 (bit-identical outputs; SPECSERVE_INT8_AVX512=0 keeps the 8-lane kernels).
//
// Computes y = x @ w.T for bf16 (or fp32) activations x [M, K] and weights stored as signed
// byte codes with a (scale, offset) pair per group of G inputs of a row:
// w[n, k] = code[n, k] * scale[n, g] + offset[n, g], g = k / G, packed by
// specserve/models/native/int8_native.py. The codes are used as stored (no re-quantisation),
// so quantised formats with up to 8-bit codes and per-group affine scales run on it exactly.
// Registered as torch.ops.specserve.int8_gemm through PyTorch's stable C++ ABI, like int4_gemm
// (int4_gemv.cpp).
//
// Packed layout (see int8_native.py and tile_stream.py for the Python side):
//   qweight   int8    [Np / 16, K / 4 + K / G, 64]  one 64-byte block per (tile of 16 rows, 4
//             inputs k0 .. k0 + 3); a tile's blocks follow each other along K, and after each
//             group's G / 4 code blocks one more block holds the group's constants (laid out
//             as in `scales` below): one stream per tile. (Without the constants inline:
//             [Np / 16, K / 4, 64] and the constants in `scales`; the same arithmetic.)
//             Byte h*32 + c*8 + r (h in 0..1, c in 0..3, r in 0..7) is code[8h + r, k0 + c]:
//             vpmovsxbd of the 8 bytes at h*32 + c*8 gives input c's codes of the tile's
//             half h (rows 8h .. 8h + 7), one row per 32-bit lane.
//   scales    fp16    [Np / 16, K / G, 2, 16], or empty with the constants inline: per tile
//             and group the 16 rows' scales, then their 16 offsets, both divided by the row's
//             power-of-two row_scale (fp16 range whatever the weights' magnitude).
//   row_scale fp32    [Np]
// Np is N rounded up to 16 (padding rows are zero and never written out); G is a multiple of 4
// dividing K.
//
// Six-bit codes (codes in -32 .. 31, G a multiple of 16, constants inline): qweight is int8
// [Np / 16, K / G, 3 G / 16 + 1, 64]: per tile and group, G / 16 units of three 64-byte blocks,
// then the constants block. A unit holds the 256 codes of 16 rows and 16 inputs k0 .. k0 + 15
// as u = code + 32 in 0 .. 63. With u_b[16 c + i] = u of row i and input k0 + 4 b + c (b, c in
// 0 .. 3; i in 0 .. 15, the tile's row), its blocks are
//   L0[j] = u_0[j] & 15 | (u_1[j] & 15) << 4,    L1[j] = u_2[j] & 15 | (u_3[j] & 15) << 4,
//   H[j]  = u_0[j] >> 4 | (u_1[j] >> 4) << 2 | (u_2[j] >> 4) << 4 | (u_3[j] >> 4) << 6,
// 3 / 4 of the bytes of the same codes as bytes. The fp32 kernels unpack u_b - 32, the byte
// code, and run exactly the arithmetic below on it: outputs bit-identical to the byte
// layout's. Where the build has AVX-512 BF16, VBMI and GFNI, a kernel of their own computes
// six-bit codes as bf16 pairs instead (run_block_dot: fewer instructions, other rounding);
// where it also has VNNI, those with superblock constants multiply x rounded to int8 per 32
// inputs (run_block_super_x8, int8_x.h; SPECSERVE_INT8_ACTIVATIONS=0 keeps bf16 pairs).
// Elsewhere (AVX2) six-bit codes with superblock constants are packed with each unit's bytes
// in quad order and always multiply int8 x (run_block_quads: vpmaddubsw, vpmaddwd).
//
// Per output (m, n) the arithmetic is fixed (independent of M, of the other rows and of the
// thread split, which is over tiles of N only), so every row is bit-identical to a 1-row call:
//   for each group g:
//     acc = 0
//     for each input k of the group, in increasing order:  acc = fma(code[n, k], x[m, k], acc)
//     y = fma(scale, acc, y);  y = fma(offset, xsum[m, g], y)
//   out = y * row_scale          (bf16 outputs: rounded to nearest even)
// A code and a bf16 input are exact in fp32 and so is their product; xsum[m, g] is the fp32
// sum of the group's inputs in a fixed order. The kernels differ only in how many tiles,
// halves and rows they interleave: one FMA chain per (tile, half, row), 6 - 12 of them at a
// time for the 4-cycle FMA latency.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <immintrin.h>

#include "code_pairs.h"
#include "int4_gemv.h"
#include "int8_gemv.h"
#include "int8_x.h"
#include "quant_amx.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECSERVE_INT8_AVX2 1
#endif

namespace {

constexpr int64_t kTile = 16;       // output rows per tile (two 8-lane halves)
constexpr int64_t kBlockK = 4;      // inputs per 64-byte block
constexpr int64_t kBlockBytes = 64;
constexpr int64_t kTileGroup = 4;   // tiles interleaved for 1-row inputs (the unit of a task)
constexpr int64_t kMaxRows = 8;     // rows of x per register block
// Bytes ahead in a tile's stream, prefetched explicitly: on a Zen 5 host the verify and
// decode steps of the gguf 1.5B (its Q6_K tensors run here) were faster with it (steps with
// and without it alternating in one process).
constexpr int64_t kPrefetch = 2048;
// Bytes ahead when one tile is read at a time (4 or more rows, and the last tiles): more lines
// in flight. On the same host, matmuls of 5 - 8 rows from memory ran 9 - 22 % faster with 6144
// than with 2048 (docs/benchmarks.md), and much slower with exactly 4096 in a trial build.
constexpr int64_t kPrefetchOneTile = 6144;

// Where a tile's stream keeps codes and constants: byte codes with the constants apart (in
// `scales`) or inline, or six-bit codes with the constants inline.
enum Layout : int { kApart = 0, kInline = 1, kSixBit = 2 };

// The byte order a kernel reads input c's codes of half h of a tile from: the byte layout's
// 64-byte block, or an unpacked six-bit block (input c's 16 rows in order).
template <int kLayout>
constexpr int64_t code_offset(int c, int64_t h) {
  return kLayout == kSixBit ? 16 * c + 8 * h : 32 * h + 8 * c;
}

#ifdef SPECSERVE_INT8_AVX2

struct Problem {
  const int8_t* qweight;   // [ntiles, K / 4 (+ ngroups), 64]
  const uint16_t* scales;  // fp16 bits [ntiles, ngroups, 2, 16]; nullptr when inline
  const float* row_scale;  // [ntiles * 16]
  const float* xf;         // x in fp32, row-block interleaved (interleave_rows)
  const uint32_t* xi;      // six-bit dot kernel: x's bf16 pairs, row-block interleaved
  const float* xsum;       // [M, ngroups]
  void* out;               // [M, N], bf16 or fp32
  bool out_f32;
  bool sweep;              // the sweep prefetch (sweep_start in simd.h)
  bool l2;                 // prefetch into L2, not L1 (prefetch_l2 in simd.h)
  int64_t one_tile_distance;  // prefetch distance of one-tile runs (one_tile_prefetch)
  int64_t M, N, K, ngroups, blocks_per_group;
  int64_t groups_per_super;  // superblock constants: 16-input sub-groups a superblock
  int64_t tile_bytes;      // bytes of one tile in qweight
  // Superblock constants on int8 activations (run_block_super_x8): each row's inputs as int8
  // per 32 (quantise_x8, int8_x.h), their steps and their sums per 16 inputs.
  const int8_t* xq = nullptr;     // [M, K]
  const float* xstep = nullptr;   // [M, K / 32]
  const int32_t* qsum = nullptr;  // [M, K / 16]
};

// Rows are processed in blocks of at most kMaxRows (balanced sizes); block i starts at row
// block_start(M, i). Only which rows share a register block depends on M, never the
// arithmetic of a row.
inline int64_t num_row_blocks(int64_t M) { return specserve_native::num_row_blocks(M, kMaxRows); }
inline int64_t block_start(int64_t M, int64_t i) {
  return specserve_native::row_block_start(M, kMaxRows, i);
}

// xf: for the row block [m0, m0 + rows), x in fp32 with its rows interleaved (x[m0 + r, k] at
// xf[m0 * K + k * rows + r]), so one pointer and constant offsets reach every row's broadcast
// operand. A 1-row block is the row itself.
void interleave_rows(const uint16_t* x, float* xf, int64_t M, int64_t K) {
  for (int64_t i = 0; i < num_row_blocks(M); ++i) {
    const int64_t m0 = block_start(M, i), rows = block_start(M, i + 1) - m0;
    float* dst = xf + m0 * K;
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* src = x + (m0 + r) * K;
      for (int64_t k = 0; k < K; ++k) dst[k * rows + r] = specserve_native::bf16_to_float(src[k]);
    }
  }
}

// xsum[m, g] = sum of the group's inputs (bf16 -> fp32): four lanes, then
// (l0 + l1) + (l2 + l3); the same order for every row.
void group_sums(const uint16_t* x, float* xsum, int64_t M, int64_t K, int64_t G) {
  const int64_t ngroups = K / G;
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* xr = x + m * K;
    for (int64_t g = 0; g < ngroups; ++g) {
      __m128 acc = _mm_setzero_ps();
      for (int64_t j = g * G; j < (g + 1) * G; j += 4) {
        const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(xr + j));
        acc = _mm_add_ps(acc, _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
      }
      alignas(16) float lanes[4];
      _mm_store_ps(lanes, acc);
      xsum[m * ngroups + g] = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    }
  }
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
    if (valid >= 8) {
      specserve_native::store_bf16x8(o, v);
    } else {
      alignas(16) uint16_t tmp[8];
      specserve_native::store_bf16x8(tmp, v);
      std::memcpy(o, tmp, static_cast<size_t>(valid) * sizeof(uint16_t));
    }
  }
}

// Step each tile's stream to its next 64-byte block, prefetching the sweep's next lines or,
// without one, kPrefetch bytes ahead in each stream (p.one_tile_distance when one tile is read
// at a time; sweep_start and one_tile_prefetch in simd.h).
template <int NT>
inline void next_block(const Problem& p, const int8_t* (&w)[NT], const char*& ahead) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    specserve_native::prefetch_line(ahead, w[t], NT == 1 ? p.one_tile_distance : kPrefetch,
                                    p.l2);
    w[t] += kBlockBytes;
  }
}

// The sweep's cursor of a run over the NT tiles from tile0 (specserve_native::sweep_start).
template <int NT>
inline const char* sweep_start(const Problem& p, int64_t tile0, int64_t tile_bytes) {
  return specserve_native::sweep_start<NT>(p.sweep, p.qweight, tile0, (p.N + kTile - 1) / kTile,
                                           tile_bytes);
}

// The streams of the kernels on int8 activations with superblock constants (run_block_super_x8,
// run_block_quads): tiles [tile0, tile0 + NT) of the weight, and for each of the MR rows of x
// from m0 its xq as words, its steps per 32 inputs, its sums of xq and of x per 16.
template <int NT, int MR>
struct X8Streams {
  const int8_t* w[NT];
  const char* ahead;
  const int32_t* xw[MR];
  const float* xd[MR];
  const int32_t* qs[MR];
  const float* xs[MR];

  X8Streams(const Problem& p, int64_t tile0, int64_t m0) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) w[t] = p.qweight + (tile0 + t) * p.tile_bytes;
    ahead = sweep_start<NT>(p, tile0, p.tile_bytes);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      xw[m] = reinterpret_cast<const int32_t*>(p.xq + (m0 + m) * p.K);
      xd[m] = p.xstep + (m0 + m) * (p.K / specserve_native::kInt8XGroup);
      qs[m] = p.qsum + (m0 + m) * p.ngroups;
      xs[m] = p.xsum + (m0 + m) * p.ngroups;
    }
  }
};

// Input c's codes of one half of a tile's block as fp32 (exact).
inline __m256 codes_f32(const int8_t* block, int64_t offset) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + offset));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

// A six-bit unit's 256 codes (three blocks at src) as bytes, the four 64-byte blocks u_b - 32
// of the layout in the header, at dst.
inline void unpack_six_bit(const int8_t* src, int8_t* dst) {
  const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30);
  const __m256i bias = _mm256_set1_epi8(32);
  for (int i = 0; i < 2; ++i) {  // 32-byte halves of each block
    const auto load = [&](int block) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64 * block + 32 * i));
    };
    const __m256i l0 = load(0), l1 = load(1), hb = load(2);
    // 32-bit shifts: the masks drop what crosses a byte
    const __m256i u[4] = {
        _mm256_or_si256(_mm256_and_si256(l0, low),
                        _mm256_and_si256(_mm256_slli_epi32(hb, 4), high)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(l0, 4), low),
                        _mm256_and_si256(_mm256_slli_epi32(hb, 2), high)),
        _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(hb, high)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(l1, 4), low),
                        _mm256_and_si256(_mm256_srli_epi32(hb, 2), high))};
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * b + 32 * i),
                          _mm256_sub_epi8(u[b], bias));
  }
}

// Tiles [tile0, tile0 + NT), halves [h0, h0 + NH) of each, for the MR rows of the row block at
// m0: the canonical arithmetic above. The loop over the 4 inputs c of a block is outermost, so
// consecutive FMAs of one chain are NT * NH * MR FMAs apart. kLayout: each group's constants
// are the block after its codes in the tile's stream (kInline, kSixBit), else in p.scales;
// six-bit units are unpacked to byte blocks in L1 first.
template <int NT, int NH, int MR, int kLayout>
void run_block(const Problem& p, int64_t tile0, int h0, int64_t m0) {
  constexpr bool kInlineConstants = kLayout != kApart;
  constexpr bool kSix = kLayout == kSixBit;
  const int64_t tile_bytes = p.tile_bytes;
  const int64_t tile_scales = p.ngroups * 2 * kTile;
  // Byte codes: a tile's pointer starts at its half h0; six-bit units are read whole.
  const int64_t half_offset = kSix ? 0 : 32 * h0;

  const int8_t* w[NT];
  const uint16_t* sc[NT];
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    w[t] = p.qweight + (tile0 + t) * tile_bytes + half_offset;
    sc[t] = kInlineConstants ? nullptr : p.scales + (tile0 + t) * tile_scales + 8 * h0;
  }
  const char* ahead = sweep_start<NT>(p, tile0, tile_bytes);
  const float* xs[MR];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) xs[m] = p.xsum + (m0 + m) * p.ngroups;
  const float* xk = p.xf + m0 * p.K;  // x[m0 + m, k] at xk[k * MR + m]

  __m256 y[NT][NH][MR];
  specserve_native::set_zero(y);

  // One block of 4 inputs for every tile: `blocks[t]` is tile t's block (byte codes).
  __m256 acc[NT][NH][MR];
  const auto block_fmas = [&](const auto& blocks) {  // const int8_t* [NT]
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 2
        for (int h = 0; h < NH; ++h) {
          const __m256 wv = codes_f32(blocks[t], code_offset<kLayout>(c, (kSix ? h0 : 0) + h));
#pragma GCC unroll 16
          for (int m = 0; m < MR; ++m)
            acc[t][h][m] =
                _mm256_fmadd_ps(wv, _mm256_broadcast_ss(xk + c * MR + m), acc[t][h][m]);
        }
      }
    }
    xk += kBlockK * MR;
  };

  for (int64_t g = 0; g < p.ngroups; ++g) {
    specserve_native::set_zero(acc);
    if constexpr (kSix) {
      alignas(64) int8_t unpacked[NT][4 * kBlockBytes];
      for (int64_t u = 0; u < p.blocks_per_group / 4; ++u) {
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) unpack_six_bit(w[t], unpacked[t]);
#pragma GCC unroll 3
        for (int i = 0; i < 3; ++i) next_block<NT>(p, w, ahead);
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b) {
          const int8_t* blocks[NT];
#pragma GCC unroll 16
          for (int t = 0; t < NT; ++t) blocks[t] = unpacked[t] + b * kBlockBytes;
          block_fmas(blocks);
        }
      }
    } else {
      for (int64_t b = 0; b < p.blocks_per_group; ++b) {
        block_fmas(w);
        next_block<NT>(p, w, ahead);
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      // the group's constants: inline, the block after its codes (w[t] is half_offset into it)
      const uint16_t* c =
          kInlineConstants ? reinterpret_cast<const uint16_t*>(w[t] - half_offset) + 8 * h0
                           : sc[t];
#pragma GCC unroll 2
      for (int h = 0; h < NH; ++h) {
        const __m256 s =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 8 * h)));
        const __m256 o = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + kTile + 8 * h)));
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          y[t][h][m] = _mm256_fmadd_ps(s, acc[t][h][m], y[t][h][m]);
          y[t][h][m] = _mm256_fmadd_ps(o, _mm256_broadcast_ss(xs[m] + g), y[t][h][m]);
        }
      }
      if constexpr (!kInlineConstants) sc[t] += 2 * kTile;
    }
    if constexpr (kInlineConstants) next_block<NT>(p, w, ahead);  // past the constants block
  }

  specserve_native::store_halves<NT, NH, MR>(p, tile0, h0, m0, y);
}

#ifdef __AVX512F__
// The same arithmetic with both halves of a tile in one 16-lane vector (AVX-512F): lane i is
// row i of the tile, and every lane runs exactly the FMA chain of the 8-lane kernel above, so
// outputs are bit-identical to it; each instruction does twice the work. A 64-byte block holds
// its 8-byte runs in the order (h0 c0, h0 c1, h0 c2, h0 c3, h1 c0, ...); one permute puts the
// two halves of each input c side by side, then input c's 16 codes are widened to fp32.
template <int NT, int MR>
inline void zero(__m512 (&v)[NT][MR]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) v[t][m] = _mm512_setzero_ps();
}

#ifdef __AVX512BW__
constexpr bool kWideSixBit = true;
// A six-bit unit's block b as bytes u_b - 32 (the header's layout), from its three blocks.
template <int b>
inline __m512i unpack_six_bit16(__m512i l0, __m512i l1, __m512i hb) {
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(0x30);
  __m512i u;  // 32-bit shifts: the masks drop what crosses a byte
  if constexpr (b == 0) {
    u = _mm512_or_si512(_mm512_and_si512(l0, low),
                        _mm512_and_si512(_mm512_slli_epi32(hb, 4), high));
  } else if constexpr (b == 1) {
    u = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(l0, 4), low),
                        _mm512_and_si512(_mm512_slli_epi32(hb, 2), high));
  } else if constexpr (b == 2) {
    u = _mm512_or_si512(_mm512_and_si512(l1, low), _mm512_and_si512(hb, high));
  } else {
    u = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(l1, 4), low),
                        _mm512_and_si512(_mm512_srli_epi32(hb, 2), high));
  }
  return _mm512_sub_epi8(u, _mm512_set1_epi8(32));
}
#else
constexpr bool kWideSixBit = false;  // byte arithmetic on 64-byte vectors needs AVX-512BW
#endif

// The three blocks (L0, L1, H) of each tile's next six-bit unit; the streams step past them.
template <int NT>
inline void next_unit(const Problem& p, const int8_t* (&w)[NT], const char*& ahead,
                      __m512i (&l0)[NT], __m512i (&l1)[NT], __m512i (&hb)[NT]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    l0[t] = _mm512_loadu_si512(w[t]);
    l1[t] = _mm512_loadu_si512(w[t] + kBlockBytes);
    hb[t] = _mm512_loadu_si512(w[t] + 2 * kBlockBytes);
  }
#pragma GCC unroll 3
  for (int i = 0; i < 3; ++i) next_block<NT>(p, w, ahead);
}

// Outputs of tiles [tile0, tile0 + NT) for the MR rows of the row block at m0: y times the
// rows' row_scale.
template <int NT, int MR>
inline void store_tiles(const Problem& p, int64_t tile0, int64_t m0, const __m512 (&y)[NT][MR]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    const int64_t n0 = (tile0 + t) * kTile;
    const __m512 r = _mm512_loadu_ps(p.row_scale + n0);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512 v = _mm512_mul_ps(y[t][m], r);
      for (int h = 0; h < 2; ++h) {
        const int64_t valid = std::min<int64_t>(8, p.N - n0 - 8 * h);
        if (valid <= 0) continue;
        const __m256 half = h == 0 ? _mm512_castps512_ps256(v)
                                   : _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                         _mm512_castps_pd(v), 1));
        store_half(p, m0 + m, n0 + 8 * h, valid, half);
      }
    }
  }
}

template <int NT, int MR, int kLayout>
void run_block16(const Problem& p, int64_t tile0, int64_t m0) {
  constexpr bool kInlineConstants = kLayout != kApart;
  const int64_t tile_bytes = p.tile_bytes;
  const int64_t tile_scales = p.ngroups * 2 * kTile;
  const __m512i halves = _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7);

  const int8_t* w[NT];
  const uint16_t* sc[NT];
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    w[t] = p.qweight + (tile0 + t) * tile_bytes;
    sc[t] = kInlineConstants ? nullptr : p.scales + (tile0 + t) * tile_scales;
  }
  const char* ahead = sweep_start<NT>(p, tile0, tile_bytes);
  const float* xs[MR];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) xs[m] = p.xsum + (m0 + m) * p.ngroups;
  const float* xk = p.xf + m0 * p.K;  // x[m0 + m, k] at xk[k * MR + m]

  __m512 y[NT][MR];
  zero(y);

  // One block of 4 inputs for every tile, each input's 16 codes in a 16-byte lane.
  __m512 acc[NT][MR];
  const auto block_fmas = [&](const __m512i (&block)[NT]) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
        __m128i codes;
        switch (c) {  // the lane index of vextracti32x4 must be a constant
          case 0: codes = _mm512_extracti32x4_epi32(block[t], 0); break;
          case 1: codes = _mm512_extracti32x4_epi32(block[t], 1); break;
          case 2: codes = _mm512_extracti32x4_epi32(block[t], 2); break;
          default: codes = _mm512_extracti32x4_epi32(block[t], 3); break;
        }
        const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m)
          acc[t][m] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xk[c * MR + m]), acc[t][m]);
      }
    }
    xk += kBlockK * MR;
  };

  for (int64_t g = 0; g < p.ngroups; ++g) {
    zero(acc);
    if constexpr (kLayout == kSixBit) {
#ifdef __AVX512BW__
      for (int64_t u = 0; u < p.blocks_per_group / 4; ++u) {
        __m512i l0[NT], l1[NT], hb[NT], block[NT];
        next_unit<NT>(p, w, ahead, l0, l1, hb);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) block[t] = unpack_six_bit16<0>(l0[t], l1[t], hb[t]);
        block_fmas(block);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) block[t] = unpack_six_bit16<1>(l0[t], l1[t], hb[t]);
        block_fmas(block);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) block[t] = unpack_six_bit16<2>(l0[t], l1[t], hb[t]);
        block_fmas(block);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) block[t] = unpack_six_bit16<3>(l0[t], l1[t], hb[t]);
        block_fmas(block);
      }
#endif
    } else {
      for (int64_t b = 0; b < p.blocks_per_group; ++b) {
        __m512i block[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
          block[t] = _mm512_permutexvar_epi64(halves, _mm512_loadu_si512(w[t]));
        block_fmas(block);
        next_block<NT>(p, w, ahead);
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      // the group's constants: inline, the block after its codes
      const uint16_t* c = kInlineConstants ? reinterpret_cast<const uint16_t*>(w[t]) : sc[t];
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
      const __m512 o =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + kTile)));
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) {
        y[t][m] = _mm512_fmadd_ps(s, acc[t][m], y[t][m]);
        y[t][m] = _mm512_fmadd_ps(o, _mm512_set1_ps(xs[m][g]), y[t][m]);
      }
      if constexpr (!kInlineConstants) sc[t] += 2 * kTile;
    }
    if constexpr (kInlineConstants) next_block<NT>(p, w, ahead);  // past the constants block
  }

  store_tiles<NT, MR>(p, tile0, m0, y);
}

// One tile, the row block at m0 with `rows` rows (1 <= rows <= kMaxRows), 16 lanes a vector.
template <int kLayout>
void run_rows16(const Problem& p, int64_t tile0, int64_t m0, int64_t rows) {
  specserve_native::with_rows<kMaxRows>(
      rows, [&](auto mr) { run_block16<1, decltype(mr)::value, kLayout>(p, tile0, m0); });
}

// Tiles [begin, end), all rows: kTileGroup tiles at once for 1 row and two for 2 rows, else
// one tile at a time, each row block in turn (the tile's codes stay in L2).
template <int kLayout>
void run_range16(const Problem& p, int64_t begin, int64_t end) {
  int64_t t = begin;
  if (p.M == 1) {
    for (; t + kTileGroup <= end; t += kTileGroup) run_block16<kTileGroup, 1, kLayout>(p, t, 0);
  } else if (p.M == 2) {
    for (; t + 2 <= end; t += 2) run_block16<2, 2, kLayout>(p, t, 0);
  }
  const int64_t nblocks = num_row_blocks(p.M);
  for (; t < end; ++t) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t m0 = block_start(p.M, i);
      run_rows16<kLayout>(p, t, m0, block_start(p.M, i + 1) - m0);
    }
  }
}

// Whether to run the 16-lane kernels: yes unless SPECSERVE_INT8_AVX512=0. Read on every call
// (a getenv is nothing beside a matmul), so a benchmark can alternate both in one process;
// their outputs are identical.
bool wide_vectors() {
  const char* v = std::getenv("SPECSERVE_INT8_AVX512");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

#if defined(__AVX512BW__) && defined(__AVX512VBMI__) && defined(__AVX512BF16__) && \
    defined(__GFNI__)
#define SPECSERVE_INT8_DOT 1
// ---- six-bit codes as bf16 pairs (AVX-512 BF16 + VBMI + GFNI) ------------------------------
//
// Six-bit codes need fewer instructions as bf16 than as fp32: u = code + 32 is in 0 .. 63, so
// the word 0x4300 | u is bf16(128 + u) = bf16(code + 160), exact, and one vdpbf16ps multiplies
// two inputs' weights of 16 rows by a broadcast pair of bf16 inputs and adds both products to
// an fp32 lane. Per unit and tile: GF(2) affine byte maps (vgf2p8affineqb) and masks take the
// four blocks u_b out of L0, L1 and H (the header's layout, input c's 16 rows in byte lane c),
// and one vpermt2b per input pair makes the words (0x4300 | u[row, k], 0x4300 | u[row, k + 1])
// of each row's 32-bit lane. Per output (m, n):
//   for each group g:
//     a0 = a1 = 0
//     for each unit, each block b of it:  a0 += pair (c0, c1); a1 += pair (c2, c3)
//                                          (each a vdpbf16ps of (code + 160) with x)
//     y = fma(s, a0 + a1, y);  y = fma(fma(s, -160, o), xsum[m, g], y)
//   out = y * row_scale
// A different arithmetic from the fp32 kernels (the bf16 products are exact, the pairwise sums
// are vdpbf16ps's), so outputs agree with them only to rounding; rows are batch invariant as
// there (fixed per output, whatever M or the thread split). SPECSERVE_INT8_AVX512=0 runs the
// fp32 8-lane kernels instead.
constexpr bool kSixBitDot = true;

using specserve_native::dot_pair;
using specserve_native::kPairs01;
using specserve_native::kPairs23;
using specserve_native::six_bit_block_pairs;

// Block b of each tile's unit: its two pair vectors into the MR rows' dot products.
template <int b, int NT, int MR>
inline void block_dots(const __m512i (&l0)[NT], const __m512i (&l1)[NT], const __m512i (&hb)[NT],
                       __m512i pairs01, __m512i pairs23, const uint32_t* xk,
                       __m512 (&a0)[NT][MR], __m512 (&a1)[NT][MR]) {
  constexpr bool kMulti = MR > 1;
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    __m512i z0, z1;
    six_bit_block_pairs<b>(l0[t], l1[t], hb[t], pairs01, pairs23, z0, z1);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      a0[t][m] = dot_pair<kMulti>(a0[t][m], z0, xk + (2 * b) * MR + m);
      a1[t][m] = dot_pair<kMulti>(a1[t][m], z1, xk + (2 * b + 1) * MR + m);
    }
  }
}

// The streams of the six-bit bf16-pair kernels: tiles [tile0, tile0 + NT) of the weight and
// the MR rows of x (and their group sums) from row m0.
template <int NT, int MR>
struct DotStreams {
  const __m512i pairs01 = _mm512_load_si512(kPairs01.idx);
  const __m512i pairs23 = _mm512_load_si512(kPairs23.idx);
  const int8_t* w[NT];
  const char* ahead;
  const float* xs[MR];
  const uint32_t* xk;  // pair j of row m0 + m at xk[j * MR + m]

  DotStreams(const Problem& p, int64_t tile0, int64_t m0) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) w[t] = p.qweight + (tile0 + t) * p.tile_bytes;
    ahead = sweep_start<NT>(p, tile0, p.tile_bytes);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) xs[m] = p.xsum + (m0 + m) * p.ngroups;
    xk = p.xi + m0 * (p.K / 2);
  }

  // The next six-bit unit of every tile (16 inputs) into the rows' dot products.
  inline void unit(const Problem& p, __m512 (&a0)[NT][MR], __m512 (&a1)[NT][MR]) {
    __m512i l0[NT], l1[NT], hb[NT];
    next_unit<NT>(p, w, ahead, l0, l1, hb);
    block_dots<0, NT, MR>(l0, l1, hb, pairs01, pairs23, xk, a0, a1);
    block_dots<1, NT, MR>(l0, l1, hb, pairs01, pairs23, xk, a0, a1);
    block_dots<2, NT, MR>(l0, l1, hb, pairs01, pairs23, xk, a0, a1);
    block_dots<3, NT, MR>(l0, l1, hb, pairs01, pairs23, xk, a0, a1);
    xk += 8 * MR;  // 16 inputs: 8 pairs
  }
};

template <int NT, int MR>
void run_block_dot(const Problem& p, int64_t tile0, int64_t m0) {
  const __m512 minus160 = _mm512_set1_ps(-160.0f);
  DotStreams<NT, MR> s(p, tile0, m0);
  const int8_t* (&w)[NT] = s.w;
  const float* const(&xs)[MR] = s.xs;

  __m512 y[NT][MR];
  zero(y);
  for (int64_t g = 0; g < p.ngroups; ++g) {
    __m512 a0[NT][MR], a1[NT][MR];
    zero(a0);
    zero(a1);
    for (int64_t unit = 0; unit < p.blocks_per_group / 4; ++unit) s.unit(p, a0, a1);
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      // the group's constants: the block after its codes
      const uint16_t* c = reinterpret_cast<const uint16_t*>(w[t]);
      const __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
      const __m512 o =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + kTile)));
      const __m512 bias = _mm512_fmadd_ps(sc, minus160, o);
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) {
        y[t][m] = _mm512_fmadd_ps(sc, _mm512_add_ps(a0[t][m], a1[t][m]), y[t][m]);
        y[t][m] = _mm512_fmadd_ps(bias, _mm512_set1_ps(xs[m][g]), y[t][m]);
      }
    }
    next_block<NT>(p, w, s.ahead);  // past the constants block
  }
  store_tiles<NT, MR>(p, tile0, m0, y);
}

// The header blocks of each tile's next superblock (w advanced past them; head: where they
// begin): d (and e), then the sub-groups' scale (and offset) codes.
template <int NT, bool kOffsets>
inline void skip_super_header(const Problem& p, const int8_t* (&w)[NT], const char*& ahead,
                              const int8_t* (&head)[NT]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) head[t] = w[t];
  const int64_t header = (kOffsets ? 2 : 1) * (1 + p.groups_per_super / 4);
  for (int64_t i = 0; i < header; ++i) next_block<NT>(p, w, ahead);
}

// The 16 int8 codes at c (a sub-group's scale or offset codes of a tile's rows) as fp32.
inline __m512 codes_ps(const int8_t* c) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c))));
}

// yo += mo_j * xsum[m, g] for one tile's rows: mo_j the sub-group's offset codes at `mo`.
template <int MR>
inline void offset_term(const int8_t* mo, const float* const (&xs)[MR], int64_t g,
                        __m512 (&yo)[MR]) {
  const __m512 o = codes_ps(mo);
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) yo[m] = _mm512_fmadd_ps(o, _mm512_set1_ps(xs[m][g]), yo[m]);
}

// A superblock's end: y = fma(d, ys, y) (and fma(e, yo, y)), d and e from each tile's header.
template <int NT, int MR, bool kOffsets>
inline void finish_superblock(const int8_t* const (&head)[NT], const __m512 (&ys)[NT][MR],
                              const __m512 (&yo)[NT][MR], __m512 (&y)[NT][MR]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(head[t]));
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) y[t][m] = _mm512_fmadd_ps(d, ys[t][m], y[t][m]);
    if constexpr (kOffsets) {
      const __m512 e = _mm512_loadu_ps(reinterpret_cast<const float*>(head[t] + kBlockBytes));
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) y[t][m] = _mm512_fmadd_ps(e, yo[t][m], y[t][m]);
    }
  }
}

// ---- six-bit codes with superblock constants ------------------------------------------------
//
// The K-quants' own form of the constants (superblock.py): per tile and superblock of S inputs
// (S = group_size, a multiple of 64), H header blocks, then the S / 16 units of codes:
//   block 0            d[16] fp32, the rows' superblock scales
//   (offsets) block 1  e[16] fp32, the rows' superblock offsets
//   S / 64 blocks      int8 scale codes: byte 16 j + i is sub-group j's code of row i
//   (offsets) S / 64   int8 offset codes, laid out alike
// w[n, k] = d[n] sc[n, j] code[n, k] + e[n] mo[n, j] for input k of sub-group j (16 inputs).
// An fp16 d times a code of at most 8 bits is exact in fp32, so these constants hold Q6_K's
// and Q4_K's exactly, in 6.6 - 7.3 bits a weight where per-group fp16 pairs took 8. Per
// output (m, n):
//   for each superblock:
//     ys = yo = 0
//     for each sub-group j:  a0, a1 as in run_block_dot (vdpbf16ps of (code + 160) with x)
//                            ys = fma(sc_j, fma(-160, xsum[m, j], a0 + a1), ys)
//                            yo = fma(mo_j, xsum[m, j], yo)             (offsets)
//     y = fma(d, ys, y);  y = fma(e, yo, y)                             (offsets)
//   out = y * row_scale
// Fixed per output whatever M or the thread split, as every kernel here.
template <int NT, int MR, bool kOffsets>
void run_block_super(const Problem& p, int64_t tile0, int64_t m0) {
  const __m512 minus160 = _mm512_set1_ps(-160.0f);
  const int64_t groups = p.groups_per_super;
  const int64_t code_blocks = groups / 4;  // blocks of one kind of sub-group codes
  DotStreams<NT, MR> s(p, tile0, m0);
  const int8_t* (&w)[NT] = s.w;
  const float* const(&xs)[MR] = s.xs;

  __m512 y[NT][MR];
  zero(y);
  const int64_t nsuper = p.ngroups / groups;
  for (int64_t sb = 0; sb < nsuper; ++sb) {
    const int8_t* head[NT];
    skip_super_header<NT, kOffsets>(p, w, s.ahead, head);
    __m512 ys[NT][MR], yo[NT][MR];
    zero(ys);
    if constexpr (kOffsets) zero(yo);
    for (int64_t j = 0; j < groups; ++j) {
      __m512 a0[NT][MR], a1[NT][MR];
      zero(a0);
      zero(a1);
      s.unit(p, a0, a1);
      const int64_t g = sb * groups + j;
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
        const int8_t* codes = head[t] + (kOffsets ? 2 : 1) * kBlockBytes + 16 * j;
        const __m512 sc = codes_ps(codes);
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          const __m512 xg = _mm512_set1_ps(xs[m][g]);
          const __m512 a = _mm512_fmadd_ps(minus160, xg, _mm512_add_ps(a0[t][m], a1[t][m]));
          ys[t][m] = _mm512_fmadd_ps(sc, a, ys[t][m]);
        }
        if constexpr (kOffsets) offset_term<MR>(codes + code_blocks * kBlockBytes, xs, g, yo[t]);
      }
    }
    finish_superblock<NT, MR, kOffsets>(head, ys, yo, y);
  }
  store_tiles<NT, MR>(p, tile0, m0, y);
}

// The two bf16-pair kernels of six-bit codes, as the dispatch below takes them: per-group
// constants (run_block_dot) and superblock constants (run_block_super).
struct PerGroupConstants {
  template <int NT, int MR>
  static void block(const Problem& p, int64_t tile0, int64_t m0) {
    run_block_dot<NT, MR>(p, tile0, m0);
  }
};
template <bool kOffsets>
struct SuperblockConstants {
  template <int NT, int MR>
  static void block(const Problem& p, int64_t tile0, int64_t m0) {
    run_block_super<NT, MR, kOffsets>(p, tile0, m0);
  }
};

#ifdef SPECSERVE_INT8_X
// ---- six-bit codes with superblock constants on int8 activations (AVX-512 VNNI) -------------
//
// run_block_super's sums on int8 activations (int8_x.h): per sub-group j of 16 inputs and
// row m, isum = sum of u * xq over its unit (vpdpbusd of the unsigned u = code + 32 with the
// signed xq, exact in int32), and with step the step of the 32 inputs j lies in:
//     ys = fma(sc_j, float(isum - 32 * qsum[m, j]) * step, ys)
//     yo = fma(mo_j, xsum[m, j], yo)                          (offsets: the exact sums of x)
//     at the superblock's end:  y = fma(d, ys, y);  y = fma(e, yo, y)
// One vpermb turns each block u_b of a unit (byte 16 c + i: row i, input 4 b + c) into 32-bit
// lanes of a row's four inputs, the operand vpdpbusd takes against a broadcast word of xq.
// Fixed per output whatever M or the thread split.
struct QuadIndex {
  alignas(64) uint8_t idx[64];
};
constexpr QuadIndex make_quad_index() {
  QuadIndex r{};
  for (int i = 0; i < 16; ++i)
    for (int c = 0; c < 4; ++c) r.idx[4 * i + c] = static_cast<uint8_t>(16 * c + i);
  return r;
}
inline constexpr QuadIndex kQuads = make_quad_index();

using specserve_native::kInt8XGroup;
using specserve_native::six_bit_block_u;

// Block b of each tile's unit (six_bit_block_u) as row quads (quads: kQuads, loaded) into the
// MR rows' int32 sums against word word0 + b of each row's xq: into a1 for odd b where kTwo.
template <int b, int NT, int MR, bool kTwo>
inline void block_quads(const __m512i (&l0)[NT], const __m512i (&l1)[NT], const __m512i (&hb)[NT],
                        __m512i quads, const int32_t* const (&xw)[MR], int64_t word0,
                        __m512i (&a0)[NT][MR], __m512i (&a1)[NT][MR]) {
#pragma GCC unroll 16
  for (int t = 0; t < NT; ++t) {
    const __m512i rows = _mm512_permutexvar_epi8(quads, six_bit_block_u<b>(l0[t], l1[t], hb[t]));
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512i xb = _mm512_set1_epi32(xw[m][word0 + b]);
      if constexpr (kTwo && b % 2 == 1) {
        a1[t][m] = _mm512_dpbusd_epi32(a1[t][m], rows, xb);
      } else {
        a0[t][m] = _mm512_dpbusd_epi32(a0[t][m], rows, xb);
      }
    }
  }
}

template <int NT, int MR, bool kOffsets>
void run_block_super_x8(const Problem& p, int64_t tile0, int64_t m0) {
  const __m512i quads = _mm512_load_si512(kQuads.idx);
  // two accumulators a row and tile where there are few (latency), else one (registers): the
  // integer sums are exact, so the bits are the same either way
  constexpr bool kTwo = NT * MR <= 4;
  const int64_t groups = p.groups_per_super;
  const int64_t code_blocks = groups / 4;
  X8Streams<NT, MR> s(p, tile0, m0);

  __m512 y[NT][MR];
  zero(y);
  const int64_t nsuper = p.ngroups / groups;
  for (int64_t sb = 0; sb < nsuper; ++sb) {
    const int8_t* head[NT];
    skip_super_header<NT, kOffsets>(p, s.w, s.ahead, head);
    __m512 ys[NT][MR], yo[NT][MR];
    zero(ys);
    if constexpr (kOffsets) zero(yo);
    for (int64_t j = 0; j < groups; ++j) {
      const int64_t g = sb * groups + j;
      __m512i l0[NT], l1[NT], hb[NT];
      next_unit<NT>(p, s.w, s.ahead, l0, l1, hb);
      __m512i a0[NT][MR], a1[NT][MR];
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t)
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          a0[t][m] = _mm512_setzero_si512();
          a1[t][m] = _mm512_setzero_si512();
        }
      block_quads<0, NT, MR, kTwo>(l0, l1, hb, quads, s.xw, 4 * g, a0, a1);
      block_quads<1, NT, MR, kTwo>(l0, l1, hb, quads, s.xw, 4 * g, a0, a1);
      block_quads<2, NT, MR, kTwo>(l0, l1, hb, quads, s.xw, 4 * g, a0, a1);
      block_quads<3, NT, MR, kTwo>(l0, l1, hb, quads, s.xw, 4 * g, a0, a1);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
        const int8_t* codes = head[t] + (kOffsets ? 2 : 1) * kBlockBytes + 16 * j;
        const __m512 sc = codes_ps(codes);
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          const __m512i sum = kTwo ? _mm512_add_epi32(a0[t][m], a1[t][m]) : a0[t][m];
          const __m512i centred = _mm512_sub_epi32(sum, _mm512_set1_epi32(32 * s.qs[m][g]));
          const __m512 a =
              _mm512_mul_ps(_mm512_cvtepi32_ps(centred), _mm512_set1_ps(s.xd[m][g / 2]));
          ys[t][m] = _mm512_fmadd_ps(sc, a, ys[t][m]);
        }
        if constexpr (kOffsets) offset_term<MR>(codes + code_blocks * kBlockBytes, s.xs, g, yo[t]);
      }
    }
    finish_superblock<NT, MR, kOffsets>(head, ys, yo, y);
  }
  store_tiles<NT, MR>(p, tile0, m0, y);
}

template <bool kOffsets>
struct SuperblockConstantsX8 {
  template <int NT, int MR>
  static void block(const Problem& p, int64_t tile0, int64_t m0) {
    run_block_super_x8<NT, MR, kOffsets>(p, tile0, m0);
  }
};
#endif  // SPECSERVE_INT8_X

template <class Kernel, int NT>
void run_rows_dot(const Problem& p, int64_t tile0, int64_t m0, int64_t rows) {
  specserve_native::with_rows<kMaxRows>(
      rows, [&](auto mr) { Kernel::template block<NT, decltype(mr)::value>(p, tile0, m0); });
}

// Tiles [begin, end), all rows: four tiles at once for 1 row, two for 2 or 3 rows (latency of
// the vdpbf16ps chains), else one tile at a time, each row block in turn.
template <class Kernel>
void run_range_dot(const Problem& p, int64_t begin, int64_t end) {
  int64_t t = begin;
  if (p.M == 1) {
    for (; t + kTileGroup <= end; t += kTileGroup) Kernel::template block<kTileGroup, 1>(p, t, 0);
  } else if (p.M <= 3) {
    for (; t + 2 <= end; t += 2) run_rows_dot<Kernel, 2>(p, t, 0, p.M);
  }
  const int64_t nblocks = num_row_blocks(p.M);
  for (; t < end; ++t) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t m0 = block_start(p.M, i);
      run_rows_dot<Kernel, 1>(p, t, m0, block_start(p.M, i + 1) - m0);
    }
  }
}
#else
constexpr bool kSixBitDot = false;
#endif

#endif  // __AVX512F__

// ---- six-bit codes in quad order with superblock constants, on int8 activations (AVX2) ------
//
// The superblock layout of run_block_super (header blocks d, e and the sub-groups' scale and
// offset codes, then S / 16 six-bit units), with each unit's bytes in quad order: byte
// 32 h + 4 r + c of every block u_b is row 8 h + r, input k0 + 4 b + c, so a 32-byte half of
// an unpacked block holds 8 rows' 4 inputs each (qweight [Np / 16, K / S, H + 3 S / 16, 2, 32],
// superblock.py). Those are vpmaddubsw operands as they unpack: against a broadcast word of
// four xq (quantise_x8_rows, int8_x.h) it sums a row's two input pairs in two 16-bit lanes,
// and vpmaddwd with the sub-group's scale codes (each row's code in both 16-bit halves of its
// lane) multiplies and widens them at once. Per output (m, n) and region of 32 inputs (sub-
// groups j0 and j1, xq's step `step` of the region):
//     isum = sc_j0 * sum_j0 u * xq + sc_j1 * sum_j1 u * xq - 32 * (sc_j0 qsum_j0 + sc_j1 qsum_j1)
//                                                      (exact in int32: below 2^26)
//     y = fma(d * step, float(isum), y)
//     (offsets) y = fma(e * mo_j, xsum[m, j], y)  for j = j0, j1
//   out = y * row_scale   (ones)
// A u * xq pair sums to at most 2 * 63 * 127 in a 16-bit lane, two blocks' to 32004, below
// 2^15. Fixed per output whatever M or the thread split. These weights are packed where int8
// activations are on at load (superblock.py), and always take them.
constexpr int64_t kMaxRowsQuads = 8;  // rows of a register block, one half at a time

// The quad-order unit's four blocks u_0 .. u_3 of half h (rows 8 h .. 8 h + 7) from its three
// packed blocks at w (L0, L1, H as six_bit.pack_units writes them, in quad order).
inline void unpack_quads(const int8_t* w, int h, __m256i (&u)[4]) {
  const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30);
  const auto load = [&](int block) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kBlockBytes * block + 32 * h));
  };
  const __m256i l0 = load(0), l1 = load(1), hb = load(2);
  // 16-bit shifts: the masks drop what crosses a byte
  u[0] = _mm256_or_si256(_mm256_and_si256(l0, low),
                         _mm256_and_si256(_mm256_slli_epi16(hb, 4), high));
  u[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                         _mm256_and_si256(_mm256_slli_epi16(hb, 2), high));
  u[2] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(hb, high));
  u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                         _mm256_and_si256(_mm256_srli_epi16(hb, 2), high));
}

// The 8 int8 codes at c (a sub-group's codes of one half's rows) as int32 lanes holding the
// code in both 16-bit halves: vpmaddwd's multiplier of a row's two 16-bit sums.
inline __m256i code_pairs16(const int8_t* c) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
  return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xAA);
}

// The codes of sub-groups j0 (at c0) and j1 (at c1) of one half's rows as int16 pairs
// (j0 low, j1 high) in each row's lane.
inline __m256i code_pair_j(const int8_t* c0, const int8_t* c1) {
  const __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c0)));
  const __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c1)));
  return _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xAA);
}

// Tiles [tile0, tile0 + NT), halves [h0, h0 + NH), the MR rows of the row block at m0: the
// arithmetic above.
template <int NT, int NH, int MR, bool kOffsets>
void run_block_quads(const Problem& p, int64_t tile0, int h0, int64_t m0) {
  const int64_t groups = p.groups_per_super;  // sub-groups of 16 a superblock
  const int64_t kinds = kOffsets ? 2 : 1;
  const int64_t header = kinds * (1 + groups / 4);
  X8Streams<NT, MR> s(p, tile0, m0);

  __m256 y[NT][NH][MR];
  specserve_native::set_zero(y);
  const int64_t nsuper = p.ngroups / groups;
  for (int64_t sb = 0; sb < nsuper; ++sb) {
    const int8_t* head[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) head[t] = s.w[t];
    for (int64_t i = 0; i < header; ++i) next_block<NT>(p, s.w, s.ahead);
    for (int64_t r = 0; r < groups / 2; ++r) {  // regions of 32 inputs
      const int64_t g0 = sb * groups + 2 * r;    // the region's first sub-group
      __m256i acc[NT][NH][MR];
      specserve_native::set_zero(acc);
#pragma GCC unroll 2
      for (int64_t jj = 0; jj < 2; ++jj) {
        const int64_t g = g0 + jj;
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 2
          for (int h = 0; h < NH; ++h) {
            __m256i u[4];
            unpack_quads(s.w[t], h0 + h, u);
            const __m256i sc =
                code_pairs16(head[t] + kinds * kBlockBytes + 16 * (2 * r + jj) + 8 * (h0 + h));
#pragma GCC unroll 16
            for (int m = 0; m < MR; ++m) {
              const int32_t* xb = s.xw[m] + 4 * g;  // the sub-group's four words of xq
              const __m256i p01 = _mm256_add_epi16(
                  _mm256_maddubs_epi16(u[0], _mm256_set1_epi32(xb[0])),
                  _mm256_maddubs_epi16(u[1], _mm256_set1_epi32(xb[1])));
              const __m256i p23 = _mm256_add_epi16(
                  _mm256_maddubs_epi16(u[2], _mm256_set1_epi32(xb[2])),
                  _mm256_maddubs_epi16(u[3], _mm256_set1_epi32(xb[3])));
              acc[t][h][m] = _mm256_add_epi32(
                  acc[t][h][m], _mm256_add_epi32(_mm256_madd_epi16(p01, sc),
                                                 _mm256_madd_epi16(p23, sc)));
            }
          }
        }
#pragma GCC unroll 3
        for (int i = 0; i < 3; ++i) next_block<NT>(p, s.w, s.ahead);
      }
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 2
        for (int h = 0; h < NH; ++h) {
          const int64_t half = 8 * (h0 + h);
          const int8_t* codes = head[t] + kinds * kBlockBytes + 16 * (2 * r) + half;
          // 32 sc_j in each 16-bit half (|32 sc| <= 4096): the correction in one vpmaddwd
          const __m256i scj32 = _mm256_slli_epi16(code_pair_j(codes, codes + 16), 5);
          const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(head[t]) + half);
          __m256 e_mo[2];
          if constexpr (kOffsets) {
            const __m256 e =
                _mm256_loadu_ps(reinterpret_cast<const float*>(head[t] + kBlockBytes) + half);
            const int8_t* mo = codes + (groups / 4) * kBlockBytes;
#pragma GCC unroll 2
            for (int jj = 0; jj < 2; ++jj)
              e_mo[jj] = _mm256_mul_ps(
                  e, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mo + 16 * jj)))));
          }
#pragma GCC unroll 16
          for (int m = 0; m < MR; ++m) {
            // |qsum| <= 16 * 127: both fit an int16
            const uint32_t qpair = (static_cast<uint32_t>(s.qs[m][g0]) & 0xFFFFu) |
                                   (static_cast<uint32_t>(s.qs[m][g0 + 1]) << 16);
            const __m256i corr =
                _mm256_madd_epi16(scj32, _mm256_set1_epi32(static_cast<int32_t>(qpair)));
            const __m256i isum = _mm256_sub_epi32(acc[t][h][m], corr);
            const __m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(s.xd[m][g0 / 2]));
            y[t][h][m] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(isum), y[t][h][m]);
            if constexpr (kOffsets) {
#pragma GCC unroll 2
              for (int jj = 0; jj < 2; ++jj)
                y[t][h][m] =
                    _mm256_fmadd_ps(e_mo[jj], _mm256_set1_ps(s.xs[m][g0 + jj]), y[t][h][m]);
            }
          }
        }
      }
    }
  }
  specserve_native::store_halves<NT, NH, MR>(p, tile0, h0, m0, y);
}

// One tile, the row block at m0 with `rows` rows (1 <= rows <= kMaxRowsQuads), one half at a
// time (each half's accumulators and sums in registers).
template <bool kOffsets>
void run_rows_quads(const Problem& p, int64_t tile0, int64_t m0, int64_t rows) {
  specserve_native::with_rows<kMaxRowsQuads>(rows, [&](auto mr) {
    for (int h = 0; h < 2; ++h)
      run_block_quads<1, 1, decltype(mr)::value, kOffsets>(p, tile0, h, m0);
  });
}

// Tiles [begin, end), all rows: one row over both halves of a tile at once, else one half at
// a time for each row block in turn (the tile's codes stay in L2).
template <bool kOffsets>
void run_range_quads(const Problem& p, int64_t begin, int64_t end) {
  if (p.M == 1) {
    int64_t t = begin;
    for (; t + 2 <= end; t += 2) run_block_quads<2, 2, 1, kOffsets>(p, t, 0, 0);
    for (; t < end; ++t) run_block_quads<1, 2, 1, kOffsets>(p, t, 0, 0);
    return;
  }
  const int64_t nblocks = specserve_native::num_row_blocks(p.M, kMaxRowsQuads);
  for (int64_t t = begin; t < end; ++t) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t m0 = specserve_native::row_block_start(p.M, kMaxRowsQuads, i);
      run_rows_quads<kOffsets>(
          p, t, m0, specserve_native::row_block_start(p.M, kMaxRowsQuads, i + 1) - m0);
    }
  }
}

// One tile, the row block at m0 with `rows` rows (1 <= rows <= kMaxRows): both halves at once
// for up to 6 rows (each broadcast input serves two FMAs), one half at a time for 7 - 8 (the
// accumulators of 16 chains would not leave registers for the operands). Measured here
// (Skylake-SP, 2 cores) 8-row blocks took ~10% less time per row than two 4-row blocks.
template <int kLayout>
void run_rows(const Problem& p, int64_t tile0, int64_t m0, int64_t rows) {
  switch (rows) {
    case 1: run_block<1, 2, 1, kLayout>(p, tile0, 0, m0); break;
    case 2: run_block<1, 2, 2, kLayout>(p, tile0, 0, m0); break;
    case 3: run_block<1, 2, 3, kLayout>(p, tile0, 0, m0); break;
    case 4: run_block<1, 2, 4, kLayout>(p, tile0, 0, m0); break;
    case 5: run_block<1, 2, 5, kLayout>(p, tile0, 0, m0); break;
    case 6: run_block<1, 2, 6, kLayout>(p, tile0, 0, m0); break;
    case 7:
      for (int h = 0; h < 2; ++h) run_block<1, 1, 7, kLayout>(p, tile0, h, m0);
      break;
    default:
      for (int h = 0; h < 2; ++h) run_block<1, 1, 8, kLayout>(p, tile0, h, m0);
      break;
  }
}

// Tiles [begin, end), all rows: kTileGroup tiles at once for 1 row and two for 2 rows (8
// chains), else one tile at a time, each row block in turn (the tile's codes stay in L2).
template <int kLayout>
void run_range(const Problem& p, int64_t begin, int64_t end) {
  int64_t t = begin;
  if (p.M == 1) {
    for (; t + kTileGroup <= end; t += kTileGroup) run_block<kTileGroup, 2, 1, kLayout>(p, t, 0, 0);
  } else if (p.M == 2) {
    for (; t + 2 <= end; t += 2) run_block<2, 2, 2, kLayout>(p, t, 0, 0);
  }
  const int64_t nblocks = num_row_blocks(p.M);
  for (; t < end; ++t) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t m0 = block_start(p.M, i);
      run_rows<kLayout>(p, t, m0, block_start(p.M, i + 1) - m0);
    }
  }
}

#endif  // SPECSERVE_INT8_AVX2

}  // namespace

namespace specserve_native {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

PackedWeight quant_packed_weight(const Tensor& qweight, const Tensor& scales,
                                 const Tensor& row_scale, int64_t out_features,
                                 int64_t group_size, const char* what) {
  const ScalarType t = qweight.scalar_type();
  STD_TORCH_CHECK(t == ScalarType::Byte || t == ScalarType::Char, what,
                  ": qweight must be uint8 (int4 layout) or int8 (int8-group layout)");
  return tile_packed_weight(qweight, scales, row_scale, out_features, group_size, what,
                            t == ScalarType::Byte ? 4 : int8_code_bits(qweight));
}

void quant_matmul(const uint16_t* x, int64_t M, const PackedWeight& w, void* out, bool out_f32) {
  if (w.bits == 4) {
    int4_matmul(x, M, w, out, out_f32);
  } else {
    int8_matmul(x, M, w, out, out_f32);
  }
}

#ifndef SPECSERVE_INT8_AVX2

bool int8_cpu_supported() { return false; }

void int8_matmul(const uint16_t*, int64_t, const PackedWeight&, void*, bool) {
  STD_TORCH_CHECK(false, "int8-group kernel built for a CPU without AVX2 / FMA / F16C");
}

#else

bool int8_cpu_supported() { return avx2_supported(); }

void int8_matmul(const uint16_t* x, int64_t M, const PackedWeight& w, void* out, bool out_f32) {
  STD_TORCH_CHECK(w.bits == 8 || w.bits == 6, "int8_matmul: not an int8-group weight");
  // superblock constants: the inputs' sums are per 16-input sub-group
  const int64_t sum_group = w.super_form != 0 ? 16 : w.group_size;
  const int64_t K = w.K, ngroups = K / sum_group;
  const int64_t ntiles = (w.N + kTile - 1) / kTile;
  if (M == 0 || w.N == 0) return;
#ifndef SPECSERVE_INT8_DOT
  STD_TORCH_CHECK(w.super_form == 0 || w.quad_order,
                  "int8_matmul: six-bit codes with superblock constants need the AVX-512 BF16 / "
                  "VBMI / GFNI build of the kernel (or their quad order, superblock.py)");
#endif
  std::vector<float> xsum(static_cast<size_t>(M * ngroups));
  group_sums(x, xsum.data(), M, K, sum_group);
  if (quant_amx_applies(w)) {  // the AMX tiles (quant_amx.cpp), x read in place
    const QuantTiles tiles{&w, x, xsum.data(), out, out_f32, M, amx_prefetch()};
    torch::stable::parallel_for(0, ntiles, amx_grain(K, M, 6), [&](int64_t begin, int64_t end) {
      quant_amx_range(tiles, begin, end);
    });
    return;
  }
  // superblock constants on int8 activations: x quantised, no pair interleaving; the quad
  // order (only ever superblock constants, tile_packed_weight) always: run_block_quads
  const bool quads = w.quad_order;
#if defined(SPECSERVE_INT8_X) && defined(SPECSERVE_INT8_DOT)
  const bool x8 = quads || (w.super_form != 0 && K % kInt8XGroup == 0 && int8_activations());
#else
  const bool x8 = quads;
#endif
  std::vector<int8_t> x8q(static_cast<size_t>(x8 ? M * K : 0));
  std::vector<float> x8step(static_cast<size_t>(x8 ? M * K / 32 : 0));  // a step per 32
  std::vector<int32_t> x8sum(static_cast<size_t>(x8 ? M * K / 16 : 0));  // a sum per 16
  if (quads) {
    specserve_native::quantise_x8_rows(x, M, K, x8q.data(), x8step.data(), x8sum.data());
  }
#ifdef SPECSERVE_INT8_X
  if (x8 && !quads) quantise_x8(x, M, K, false, x8q.data(), x8step.data(), x8sum.data());
#endif
  const Layout layout = w.bits == 6 ? kSixBit : w.inline_constants ? kInline : kApart;
#ifdef __AVX512F__
  const bool wide = wide_vectors() && (layout != kSixBit || kWideSixBit);
  // superblock constants run on their bf16-pair kernel only, whatever the switch
  const bool dot = !quads && ((wide && layout == kSixBit && kSixBitDot) || w.super_form != 0);
#else
  const bool dot = false;
#endif
  // x as the kernels read it: bf16 pairs for the six-bit dot kernel, fp32 for the fp32
  // kernels (the quad-order kernel reads only xq)
  const bool fp32_x = !dot && !quads;
  std::vector<float> xf(fp32_x ? static_cast<size_t>(M * K) : 0);
  std::vector<uint32_t> xi(dot && M > 1 && !x8 ? static_cast<size_t>(M * K / 2) : 0);
  const uint32_t* xip = reinterpret_cast<const uint32_t*>(x);  // 1 row: itself
  if (dot && M > 1 && !x8) {
    specserve_native::interleave_pairs(xip, xi.data(), M, K / 2, kMaxRows);
    xip = xi.data();
  } else if (fp32_x) {
    interleave_rows(x, xf.data(), M, K);
  }
  Problem p;
  p.qweight = reinterpret_cast<const int8_t*>(w.qweight);
  p.scales = w.scales;
  p.row_scale = w.row_scale;
  p.xf = xf.data();
  p.xi = xip;
  p.xsum = xsum.data();
  p.out = out;
  p.out_f32 = out_f32;
  p.sweep = specserve_native::sweep_prefetch();
  p.l2 = specserve_native::prefetch_l2();
  p.one_tile_distance = specserve_native::one_tile_prefetch() ? kPrefetchOneTile : kPrefetch;
  p.M = M;
  p.N = w.N;
  p.K = K;
  p.ngroups = ngroups;
  p.blocks_per_group = w.group_size / kBlockK;  // byte-code blocks (six-bit: 4 a unit)
  p.groups_per_super = w.group_size / 16;
  p.tile_bytes = w.tile_bytes;
  if (x8) {
    p.xq = x8q.data();
    p.xstep = x8step.data();
    p.qsum = x8sum.data();
  }

  // Split over N only: tasks are runs of kTileGroup-tile groups (whole groups for the 1-row
  // kernel) holding at least 128 KiB / (M + 1) of weights, so tiny layers stay on one thread.
  const int64_t tile_group_bytes = K * kTile * kTileGroup;
  const int64_t ntile_groups = (ntiles + kTileGroup - 1) / kTileGroup;
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{128} << 10) / (tile_group_bytes * std::min<int64_t>(M + 1, 16)));
  torch::stable::parallel_for(0, ntile_groups, grain, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kTileGroup, last = std::min(ntiles, end * kTileGroup);
    if (quads) {
      if (w.super_form == 2) {
        run_range_quads<true>(p, first, last);
      } else {
        run_range_quads<false>(p, first, last);
      }
      return;
    }
#ifdef SPECSERVE_INT8_DOT
    if (dot) {  // every weight with superblock constants
#ifdef SPECSERVE_INT8_X
      if (x8) {
        if (w.super_form == 2) {
          run_range_dot<SuperblockConstantsX8<true>>(p, first, last);
        } else {
          run_range_dot<SuperblockConstantsX8<false>>(p, first, last);
        }
        return;
      }
#endif
      switch (w.super_form) {
        case 2: run_range_dot<SuperblockConstants<true>>(p, first, last); break;
        case 1: run_range_dot<SuperblockConstants<false>>(p, first, last); break;
        default: run_range_dot<PerGroupConstants>(p, first, last); break;
      }
      return;
    }
#endif
#ifdef __AVX512F__
    if (wide) {
      switch (layout) {
        case kSixBit: run_range16<kSixBit>(p, first, last); break;
        case kInline: run_range16<kInline>(p, first, last); break;
        default: run_range16<kApart>(p, first, last); break;
      }
      return;
    }
#endif
    switch (layout) {
      case kSixBit: run_range<kSixBit>(p, first, last); break;
      case kInline: run_range<kInline>(p, first, last); break;
      default: run_range<kApart>(p, first, last); break;
    }
  });
}

#endif  // SPECSERVE_INT8_AVX2

}  // namespace specserve_native

namespace {

using specserve_native::PackedWeight;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Tensor int8_gemm(const Tensor& x_in, const Tensor& qweight, const Tensor& scales,
                 const Tensor& row_scale, int64_t out_features, int64_t group_size, int64_t tiles) {
  STD_TORCH_CHECK(specserve_native::int8_cpu_supported(),
                  "int8_gemm: this CPU (or this build) lacks AVX2 / FMA / F16C");
  STD_TORCH_CHECK(x_in.is_cpu(), "int8_gemm: CPU tensors only");
  STD_TORCH_CHECK(x_in.dim() == 2, "int8_gemm: x must be [M, K]");
  const ScalarType xt = x_in.scalar_type();
  STD_TORCH_CHECK(xt == ScalarType::BFloat16 || xt == ScalarType::Float,
                  "int8_gemm: x must be bf16 or fp32");
  PackedWeight w = specserve_native::tile_packed_weight(
      qweight, scales, row_scale, out_features, group_size, "int8_gemm",
      specserve_native::int8_code_bits(qweight));
  w.tiles = tiles;
  STD_TORCH_CHECK(x_in.size(1) == w.K, "int8_gemm: x has ", x_in.size(1), " inputs, weight ",
                  w.K);
  Tensor x = xt == ScalarType::BFloat16 ? x_in : torch::stable::to(x_in, ScalarType::BFloat16);
  if (!x.is_contiguous()) x = torch::stable::contiguous(x);
  const bool f32 = xt == ScalarType::Float;
  Tensor out = specserve_native::empty_2d(x.size(0), out_features, f32);
  specserve_native::int8_matmul(static_cast<const uint16_t*>(x.const_data_ptr()), x.size(0), w,
                                out.mutable_data_ptr(), f32);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def(
      "int8_gemm(Tensor x, Tensor qweight, Tensor scales, Tensor row_scale, int out_features, "
      "int group_size, int tiles=1) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CPU, m) { m.impl("int8_gemm", TORCH_BOX(&int8_gemm)); }
