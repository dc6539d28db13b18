// The fused layers' attention on the AMX tiles (decoder_layer.cpp's attend_on_tiles), for
// CPUs with AMX BF16 and AVX-512 BF16.
//
// Why: a prompt's chunk of 16 rows holds 96 query heads per key-value head on the Qwen2.5-Coder
// 1.5B (112 on the 0.5B), and on the vector units their scores (one vdpbf16ps chain per query
// head and 16 keys) and value sums (one fp32 FMA chain per output lane and key) made the
// attention half of a 3000-token prefill. The tiles multiply 16 query heads by 16 keys over 32
// dims (scores), or 16 query heads' weights by 16 keys' values over 16 dims (value sums), in
// one instruction.
//
// Numbers (other bits than the vector units', each batch invariant):
// - a score is tdpbf16ps over the head's dims, 32 at a time in order, into a zeroed tile,
//   then times the scale; the 16 x 16 product gives every query head's scores of 16 keys;
// - a weight p (fp32, after the softmax) enters as a pair of bf16 values, p rounded and the
//   remainder rounded, multiplied by its key's value twice, so the value sums keep about 16
//   bits of p rather than bf16's 8; each output is tdpbf16ps over the keys in blocks of 16 in
//   order, a row's keys past its own position weighing exactly zero.
// Each output depends on its own query row and the keys only: not on the other rows a call
// holds, so a verify's rows and a prompt's chunk get the bits one-token steps give them.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "amx_tiles.h"
#include "key_lanes.h"

#if defined(SPECSERVE_HAVE_AMX) && defined(SPECSERVE_KEY_LANES)
#define SPECSERVE_ATTENTION_TILES 1

namespace specserve_native {

constexpr int64_t kTileRows = 16;  // query heads, keys or dims a tile holds

// Every tile register 16 rows of 64 bytes: 0-3 sums, 4 query rows or weights, 5-7 keys or
// values.
inline void load_attention_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = kTileRows;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// scores [16 i, 16 keys] at out + i * stride (fp32 elements) for the 16 * nr query rows of q
// ([rows, hd] bf16) from row 16 * rb, against the block's keys in lanes (kt, key_lanes.h:
// pair p of all 16 keys at kt[p], the layout of a tile's second operand), times scale.
template <int NR>
inline void score_rows(const uint16_t* q, int64_t rb, const __m512i* kt, int64_t hd, float scale,
                       float* out, int64_t stride) {
  if (NR > 0) _tile_zero(0);
  if (NR > 1) _tile_zero(1);
  if (NR > 2) _tile_zero(2);
  if (NR > 3) _tile_zero(3);
  const int64_t qs = hd * 2;  // bytes a query row
  const uint16_t* q0 = q + rb * kTileRows * hd;
  for (int64_t c = 0; c < hd / 32; ++c) {
    _tile_loadd(5, kt + 16 * c, 64);
    const uint16_t* qc = q0 + 32 * c;
    if (NR > 0) { _tile_loadd(4, qc, qs); _tile_dpbf16ps(0, 4, 5); }
    if (NR > 1) { _tile_loadd(6, qc + kTileRows * hd, qs); _tile_dpbf16ps(1, 6, 5); }
    if (NR > 2) { _tile_loadd(7, qc + 2 * kTileRows * hd, qs); _tile_dpbf16ps(2, 7, 5); }
    if (NR > 3) { _tile_loadd(4, qc + 3 * kTileRows * hd, qs); _tile_dpbf16ps(3, 4, 5); }
  }
  const int64_t os = stride * 4;
  float* o = out + rb * kTileRows * stride;
  if (NR > 0) _tile_stored(0, o, os);
  if (NR > 1) _tile_stored(1, o + kTileRows * stride, os);
  if (NR > 2) _tile_stored(2, o + 2 * kTileRows * stride, os);
  if (NR > 3) _tile_stored(3, o + 3 * kTileRows * stride, os);
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < NR * kTileRows; ++i)
    _mm512_storeu_ps(o + i * stride, _mm512_mul_ps(_mm512_loadu_ps(o + i * stride), s));
}

// score_rows for all `rows` (a multiple of 16) query rows, four row blocks a pass (each key
// tile loaded once for them).
inline void score_tiles(const uint16_t* q, int64_t rows, const __m512i* kt, int64_t hd,
                        float scale, float* out, int64_t stride) {
  const int64_t blocks = rows / kTileRows;
  for (int64_t rb = 0; rb < blocks; rb += 4) {
    switch (blocks - rb < 4 ? blocks - rb : 4) {
      case 4: score_rows<4>(q, rb, kt, hd, scale, out, stride); break;
      case 3: score_rows<3>(q, rb, kt, hd, scale, out, stride); break;
      case 2: score_rows<2>(q, rb, kt, hd, scale, out, stride); break;
      default: score_rows<1>(q, rb, kt, hd, scale, out, stride); break;
    }
  }
}

// The weights p [np] (np a multiple of 16) as pairs (bf16 p, bf16 of p's remainder) in the
// dwords of out [np]: the first n weights, zero past them (what p holds there is not read).
inline void weight_pairs(const float* p, int64_t n, int64_t np, uint32_t* out) {
  for (int64_t j = 0; j < np; j += 16) {
    const int64_t left = n - j;
    const __mmask16 valid = left >= 16 ? __mmask16(0xFFFF)
                            : left <= 0 ? __mmask16(0)
                                        : static_cast<__mmask16>((1u << left) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(valid, p + j);
    const __m512i hi = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
    const __m512i lo =
        _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(rest)));
    _mm512_storeu_si512(out + j, _mm512_or_si512(hi, _mm512_slli_epi32(lo, 16)));
  }
}

// Value row v (hd bf16, hd a multiple of 32) as the rows of 16-dim tiles' second operand: dim
// d's value twice in dword d % 16 of out[(d / 16) * 256]; a null v (a key past the context)
// gives zeros.
inline void value_pairs(const uint16_t* v, int64_t hd, uint32_t* out) {
  alignas(64) static const uint16_t kTwice[2][32] = {
      {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7,
       8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15},
      {16, 16, 17, 17, 18, 18, 19, 19, 20, 20, 21, 21, 22, 22, 23, 23,
       24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29, 30, 30, 31, 31}};
  const __m512i first = _mm512_load_si512(kTwice[0]), second = _mm512_load_si512(kTwice[1]);
  for (int64_t d = 0; d < hd; d += 32) {
    const __m512i x = v != nullptr ? _mm512_loadu_si512(v + d) : _mm512_setzero_si512();
    _mm512_storeu_si512(out + d * 16, _mm512_permutexvar_epi16(first, x));
    _mm512_storeu_si512(out + (d + 16) * 16, _mm512_permutexvar_epi16(second, x));
  }
}

// acc [16 rows, 16 * nd dims] (fp32, stride hd; zeroed first where `fresh`) += the weights'
// pairs w ([16 rows, nb * 16 keys] dwords, row stride ws) times the values' pairs vp (per key
// block of 16 keys: hd / 16 tiles of [16 keys, 16 dims] dwords; vp points at the first of
// this call's nd dim tiles), the key blocks in order.
template <int ND>
inline void add_value_tiles(const uint32_t* w, int64_t ws, const uint32_t* vp, int64_t nb,
                            int64_t hd, float* acc, bool fresh) {
  const int64_t as = hd * 4, block = hd * 16;  // bytes an acc row; dwords a key block's values
  if (fresh) {
    if (ND > 0) _tile_zero(0);
    if (ND > 1) _tile_zero(1);
    if (ND > 2) _tile_zero(2);
    if (ND > 3) _tile_zero(3);
  } else {
    if (ND > 0) _tile_loadd(0, acc, as);
    if (ND > 1) _tile_loadd(1, acc + 16, as);
    if (ND > 2) _tile_loadd(2, acc + 32, as);
    if (ND > 3) _tile_loadd(3, acc + 48, as);
  }
  for (int64_t kb = 0; kb < nb; ++kb) {
    _tile_loadd(4, w + kb * 16, ws * 4);
    const uint32_t* v = vp + kb * block;
    if (ND > 0) { _tile_loadd(5, v, 64); _tile_dpbf16ps(0, 4, 5); }
    if (ND > 1) { _tile_loadd(6, v + 256, 64); _tile_dpbf16ps(1, 4, 6); }
    if (ND > 2) { _tile_loadd(7, v + 512, 64); _tile_dpbf16ps(2, 4, 7); }
    if (ND > 3) { _tile_loadd(5, v + 768, 64); _tile_dpbf16ps(3, 4, 5); }
  }
  if (ND > 0) _tile_stored(0, acc, as);
  if (ND > 1) _tile_stored(1, acc + 16, as);
  if (ND > 2) _tile_stored(2, acc + 32, as);
  if (ND > 3) _tile_stored(3, acc + 48, as);
}

// add_value_tiles for all `rows` (a multiple of 16) rows and the head's hd dims, four dim
// tiles a pass.
inline void value_tiles(const uint32_t* w, int64_t ws, const uint32_t* vp, int64_t nb,
                        int64_t rows, int64_t hd, float* acc, bool fresh) {
  for (int64_t r = 0; r < rows; r += kTileRows)
    for (int64_t d = 0; d < hd / 16; d += 4) {
      const uint32_t* wr = w + r * ws;
      float* a = acc + r * hd + d * 16;
      const uint32_t* v = vp + d * 256;
      switch (hd / 16 - d < 4 ? hd / 16 - d : 4) {
        case 4: add_value_tiles<4>(wr, ws, v, nb, hd, a, fresh); break;
        case 3: add_value_tiles<3>(wr, ws, v, nb, hd, a, fresh); break;
        case 2: add_value_tiles<2>(wr, ws, v, nb, hd, a, fresh); break;
        default: add_value_tiles<1>(wr, ws, v, nb, hd, a, fresh); break;
      }
    }
}

}  // namespace specserve_native

#endif  // AMX BF16 and AVX-512 BF16
