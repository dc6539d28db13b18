// Attention scores with the keys in the lanes, for the fused layers' attention
// (decoder_layer.cpp) on CPUs with AVX-512 BF16.
//
// Why: with grouped-query attention every cached key serves several query heads (6 on the
// Qwen2.5-Coder 1.5B, 7 on the 0.5B), and a verify's rows multiply that again. Scoring a key
// as one 8-lane chain of fp32 FMAs over the head's dims per query head, then a horizontal
// sum, made the attention bound by its arithmetic rather than by its reads of the cache at
// long contexts (docs/benchmarks.md). Here sixteen keys' rows are turned so that each lane holds one key
// (a 16 x 16 transpose of their bf16 pairs), and each query head's scores for all sixteen
// come from one chain of vdpbf16ps over the head's dims, its pair of query values
// broadcast: no conversion of the keys to fp32, no horizontal sums, two dims per lane and
// instruction.
//
// Numbers: a score is one chain over the dim pairs in order, each step adding the two exact
// bf16 products (vdpbf16ps: DAZ/FTZ, round to nearest even), then times the scale. A lane
// depends only on its own key and query, never on the other lanes (keys past the block's
// end are zero rows), the other queries or how many rows the call holds, so a verify's rows
// get the bits a one-token step gives them. They are not the bits of the fp32 chains
// (decoder_layer.cpp's score_keys, SPECSERVE_BF16_SCORES=0).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define SPECSERVE_KEY_LANES 1

namespace specserve_native {

constexpr int64_t kLaneKeys = 16;  // keys a block of lanes holds

// r[0..15] (rows of 16 dwords) transposed in place: r[c] holds dword c of every row.
inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: dwords 0-1 / 2-3 of rows 2i, 2i+1
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + e], 128-bit lane L: dword 4L + e of rows 4i..4i+3
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // the 4 x 4 transpose of 128-bit lanes of u[e], u[4+e], ...
    const __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
    r[e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// kt [hd / 2]: kt[p] holds the bf16 pair (2p, 2p + 1) of key j0 + i in lane i, for the nj <=
// 16 keys from j0 (row(j): the key's hd bf16 values; hd a multiple of 32), zero past nj.
template <class Row>
inline void keys_to_lanes(const Row& row, int64_t j0, int64_t nj, int64_t hd, __m512i* kt) {
  for (int64_t c = 0; c < hd / 32; ++c) {
    __m512i r[16];
    for (int64_t i = 0; i < 16; ++i)
      r[i] = i < nj ? _mm512_loadu_si512(row(j0 + i) + 32 * c) : _mm512_setzero_si512();
    transpose_16x16(r);
    for (int p = 0; p < 16; ++p) kt[16 * c + p] = r[p];
  }
}

// The scores of NQ queries (q[i]: hd bf16 values) against the block's keys (kt, above),
// times scale, into out[i][0..15]: per query one chain of vdpbf16ps over the dim pairs in
// order; the NQ chains run side by side (alone, each would wait on the last one's latency).
template <int NQ>
inline void score_lanes(const uint16_t* const* q, const __m512i* kt, int64_t hd, float scale,
                        float* const* out) {
  __m512 acc[NQ];
  for (int i = 0; i < NQ; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < hd / 2; ++p) {
    const __m512bh k = reinterpret_cast<__m512bh>(kt[p]);
    for (int i = 0; i < NQ; ++i) {
      int32_t pair;
      std::memcpy(&pair, q[i] + 2 * p, sizeof pair);
      acc[i] = _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)), k);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < NQ; ++i) _mm512_storeu_ps(out[i], _mm512_mul_ps(acc[i], s));
}

// score_lanes for any nq queries, in runs of up to 8.
inline void score_queries(const uint16_t* const* q, const __m512i* kt, int64_t hd, float scale,
                          float* const* out, int64_t nq) {
  for (int64_t i = 0; i < nq; i += 8) {
    switch (nq - i < 8 ? nq - i : 8) {
      case 8: score_lanes<8>(q + i, kt, hd, scale, out + i); break;
      case 7: score_lanes<7>(q + i, kt, hd, scale, out + i); break;
      case 6: score_lanes<6>(q + i, kt, hd, scale, out + i); break;
      case 5: score_lanes<5>(q + i, kt, hd, scale, out + i); break;
      case 4: score_lanes<4>(q + i, kt, hd, scale, out + i); break;
      case 3: score_lanes<3>(q + i, kt, hd, scale, out + i); break;
      case 2: score_lanes<2>(q + i, kt, hd, scale, out + i); break;
      default: score_lanes<1>(q + i, kt, hd, scale, out + i); break;
    }
  }
}

}  // namespace specserve_native

#endif  // AVX-512 BF16
