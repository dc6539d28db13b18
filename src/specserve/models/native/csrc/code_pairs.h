// Quantised codes as bf16 pairs (AVX-512 BW + BF16 + GFNI, six-bit codes also VBMI): the
// unpacking shared by the vdpbf16ps kernels (int4_gemv.cpp, int8_gemv.cpp) and the AMX tile
// kernels (quant_amx.cpp). A pair vector holds, in 32-bit lane i, the bf16 words of row i of a
// tile of 16 weight rows at two consecutive inputs: the operand vdpbf16ps takes, and one row
// of the weight operand (B) of tdpbf16ps.
#pragma once

#include <immintrin.h>

#include <cstdint>

#if defined(__AVX512BW__) && defined(__AVX512BF16__) && defined(__GFNI__)
#define SPECSERVE_CODE_PAIRS 1

namespace specserve_native {

// A per-byte GF(2) affine map (vgf2p8affineqb with one 8x8 bit matrix for every byte).
inline __m512i gf_map(__m512i v, int64_t matrix) {
  return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(matrix), 0);
}
constexpr int64_t kGfShr4 = 0x1020408000000000LL;  // logical right shift of each byte by 4

// An int4 code block of 8 inputs (int4_gemv.cpp's layout) as its low and high nibbles, one
// byte each (lo = raw & 15, hi = raw >> 4).
inline void int4_block_nibbles(__m512i raw, __m512i& lo, __m512i& hi) {
  lo = _mm512_and_si512(raw, _mm512_set1_epi8(0x0F));
  hi = gf_map(raw, kGfShr4);
}

// The same block as four pair vectors: z[c] holds
// (0x4300 | q[i, k0 + 2c], 0x4300 | q[i, k0 + 2c + 1]) = bf16(128 + q) in lane i.
inline void int4_block_pairs(__m512i raw, __m512i (&z)[4]) {
  const __m512i exp_byte = _mm512_set1_epi8(0x43);
  __m512i lo, hi;
  int4_block_nibbles(raw, lo, hi);
  z[0] = _mm512_unpacklo_epi8(lo, exp_byte);
  z[1] = _mm512_unpackhi_epi8(lo, exp_byte);
  z[2] = _mm512_unpacklo_epi8(hi, exp_byte);
  z[3] = _mm512_unpackhi_epi8(hi, exp_byte);
}

#ifdef __AVX512VBMI__
#define SPECSERVE_SIX_BIT_PAIRS 1
// vpermt2b indices: 32-bit lane i of the pair vector of inputs (c, c + 1) of a six-bit block
// takes byte 16 c + i (row i of input c) and byte 16 (c + 1) + i, each followed by 0x43 (from
// the second source). Built at compile time, loaded once per kernel call.
struct PairIndex {
  alignas(64) uint8_t idx[64];
};
constexpr PairIndex make_pair_index(int c) {
  PairIndex r{};
  for (int i = 0; i < 16; ++i) {
    r.idx[4 * i] = static_cast<uint8_t>(16 * c + i);
    r.idx[4 * i + 1] = 64;
    r.idx[4 * i + 2] = static_cast<uint8_t>(16 * (c + 1) + i);
    r.idx[4 * i + 3] = 64;
  }
  return r;
}
inline constexpr PairIndex kPairs01 = make_pair_index(0), kPairs23 = make_pair_index(2);

// Block b (0 .. 3) of a six-bit unit (int8_gemv.cpp's layout: blocks L0, L1, H) as its 64
// codes u = code + 32, u_b[16 c + i] of row i at input 4 b + c: GF(2) affine byte maps and
// masks take them out of L0, L1 and H.
template <int b>
inline __m512i six_bit_block_u(__m512i l0, __m512i l1, __m512i hb) {
  // H's bits 2b, 2b + 1 to bits 4, 5
  constexpr int64_t kHigh[4] = {0x01020000LL, 0x04080000LL, 0x10200000LL, 0x40800000LL};
  const __m512i src = b < 2 ? l0 : l1;
  const __m512i nibble =
      b % 2 == 0 ? _mm512_and_si512(src, _mm512_set1_epi8(0x0F)) : gf_map(src, kGfShr4);
  return _mm512_or_si512(nibble, gf_map(hb, kHigh[b]));
}

// Block b (0 .. 3) of a six-bit unit (int8_gemv.cpp's layout: blocks L0, L1, H) as two pair
// vectors of u = code + 32 (six_bit_block_u): z0 for inputs (k0 + 4b, k0 + 4b + 1), z1 for
// (k0 + 4b + 2, k0 + 4b + 3), words 0x4300 | u = bf16(128 + u) = bf16(code + 160); one
// vpermt2b per input pair makes the words.
// pairs01, pairs23: kPairs01 and kPairs23, loaded.
template <int b>
inline void six_bit_block_pairs(__m512i l0, __m512i l1, __m512i hb, __m512i pairs01,
                                __m512i pairs23, __m512i& z0, __m512i& z1) {
  const __m512i exp_byte = _mm512_set1_epi8(0x43);
  const __m512i u = six_bit_block_u<b>(l0, l1, hb);
  z0 = _mm512_permutex2var_epi8(u, pairs01, exp_byte);
  z1 = _mm512_permutex2var_epi8(u, pairs23, exp_byte);
}
#endif  // __AVX512VBMI__

}  // namespace specserve_native

#endif  // SPECSERVE_CODE_PAIRS
