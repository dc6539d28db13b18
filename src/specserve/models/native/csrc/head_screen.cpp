// A draft model's LM head screened in two-bit codes: which vocabulary rows can hold the top
// logit, for a fraction of the bytes of the head itself.
//
// A greedy draft needs only its top token and that token's probability (the confidence stop),
// yet its int4 LM head is a quarter of the bytes a draft token reads (the 0.5B's 151,936 x
// 896). head_screen reads a copy of the head in two-bit codes (2.5 bits a weight with its
// constants, half the int4 head's 5), keeps per input row the top_n rows of that coarse
// product and what the softmax denominator holds outside them, computes those candidates'
// logits exactly with the head's own int4 kernel on their tiles alone (exact_tiles), and
// returns the top one first with its probability: the draft proposes the full head's top
// token whenever it is among the candidates (head_screen.py calls it).
//
// Packed layout (head_screen.py packs it):
//   codes uint8 [Np / 16, K / 64, 5, 64]: per tile of 16 rows and group of 64 inputs, four
//     code blocks, then one constants block. In code block b (inputs k0 = 64 g + 16 b ..
//     k0 + 15), byte 4 i + e holds in bits 2 j, 2 j + 1 the code q[row i, k0 + 4 j + e]
//     (i 0..15, e and j 0..3), so (block >> 2 j) & 3 bytewise is the operand of vpdpbusd for
//     inputs k0 + 4 j .. k0 + 4 j + 3, one row per 32-bit lane. The constants block holds the
//     16 rows' scales s (fp16), then their minimums mn (fp16): w = q s + mn.
// Per row m of x and group g, x is rounded to int8 steps (step = max |x| / 127) and
//   isum = sum of q * xq over the group (exact in int32, whatever the order)
//   y = fma(s * step, float(isum), y);  y = fma(mn, xsum[m, g], y)   (xsum: the group's
//   sum of x in fp32, in input order)
// so a row's scores depend on nothing but its own x and the codes (the thread split is over
// tiles). Then per row: the top_n scores (ties to the lower row; scanned in row order), their
// maximum s_max, and tail = the sum of exp(s - s_max) over the other rows below out_features,
// summed per chunk of kChunk rows in a fixed order.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <limits>
#include <vector>

#include "int4_gemv.h"
#include "simd.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr int64_t kTile = 16, kGroup = 64, kBlocks = 5, kBlockBytes = 64;
constexpr int64_t kGroupBytes = kBlocks * kBlockBytes;
constexpr int64_t kRows = 4;         // x rows a tile pass takes at once
constexpr int64_t kChunk = 4096;     // rows of the tail's partial sums
constexpr int64_t kAhead = 2048;     // bytes prefetched ahead in a tile's stream

struct Screen {
  const uint8_t* codes;
  const int8_t* xq;    // [M, K]
  const float* step;   // [M, K / 64]
  const float* xsum;   // [M, K / 64]
  int64_t M, K, tiles;
  float* scores;       // [M, tiles * 16]
};

// x rows (bf16) -> int8 steps per group of 64, the steps and the groups' sums of x.
void quantise_rows(const uint16_t* x, int64_t M, int64_t K, int8_t* xq, float* step,
                   float* xsum) {
  const int64_t ng = K / kGroup;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < ng; ++g) {
      const uint16_t* src = x + m * K + g * kGroup;
      float amax = 0.0f, sum = 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) {
        const float v = specserve_native::bf16_to_float(src[i]);
        amax = std::max(amax, std::fabs(v));
        sum += v;
      }
      const float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) {
        const float v = std::nearbyint(specserve_native::bf16_to_float(src[i]) * inv);
        xq[m * K + g * kGroup + i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
      step[m * ng + g] = s;
      xsum[m * ng + g] = sum;
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

// The scores of tile t for rows m0 .. m0 + MR - 1.
template <int MR>
void run_tile(const Screen& p, int64_t t, int64_t m0) {
  const int64_t ng = p.K / kGroup;
  const uint8_t* w = p.codes + t * ng * kGroupBytes;
  const __m512i three = _mm512_set1_epi8(3);
  __m512 y[MR];
  for (int m = 0; m < MR; ++m) y[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g, w += kGroupBytes) {
    for (int64_t b = 0; b < kGroupBytes; b += 64) _mm_prefetch(w + kAhead + b, _MM_HINT_T1);
    __m512i acc[MR][4];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_si512();
    for (int64_t b = 0; b < 4; ++b) {
      const __m512i packed = _mm512_loadu_si512(w + b * kBlockBytes);
      for (int j = 0; j < 4; ++j) {
        const __m512i q = _mm512_and_si512(_mm512_srli_epi16(packed, 2 * j), three);
        for (int m = 0; m < MR; ++m) {
          int32_t x4;
          __builtin_memcpy(&x4, p.xq + (m0 + m) * p.K + g * kGroup + 16 * b + 4 * j, 4);
          acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], q, _mm512_set1_epi32(x4));
        }
      }
    }
    const __m256i* c = reinterpret_cast<const __m256i*>(w + 4 * kBlockBytes);
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(c));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(c + 1));
    for (int m = 0; m < MR; ++m) {
      const __m512i isum = _mm512_add_epi32(_mm512_add_epi32(acc[m][0], acc[m][1]),
                                            _mm512_add_epi32(acc[m][2], acc[m][3]));
      const __m512 st = _mm512_mul_ps(s, _mm512_set1_ps(p.step[(m0 + m) * ng + g]));
      y[m] = _mm512_fmadd_ps(st, _mm512_cvtepi32_ps(isum), y[m]);
      y[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(p.xsum[(m0 + m) * ng + g]), y[m]);
    }
  }
  for (int m = 0; m < MR; ++m)
    _mm512_storeu_ps(p.scores + (m0 + m) * p.tiles * kTile + t * kTile, y[m]);
}

#else

// The same arithmetic on AVX2: each 64-byte operand as two halves of 8 rows, vpmaddubsw
// (code times int8 x, pairs summed in int16: at most 2 * 3 * 127) and vpmaddwd by ones.
template <int MR>
void run_tile(const Screen& p, int64_t t, int64_t m0) {
  const int64_t ng = p.K / kGroup;
  const uint8_t* w = p.codes + t * ng * kGroupBytes;
  const __m256i three = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256 y[MR][2];
  for (int m = 0; m < MR; ++m) y[m][0] = y[m][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g, w += kGroupBytes) {
    for (int64_t b = 0; b < kGroupBytes; b += 64) _mm_prefetch(w + kAhead + b, _MM_HINT_T0);
    __m256i acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
    for (int64_t b = 0; b < 4; ++b)
      for (int h = 0; h < 2; ++h) {
        const __m256i packed =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * kBlockBytes + 32 * h));
        for (int j = 0; j < 4; ++j) {
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(packed, 2 * j), three);
          for (int m = 0; m < MR; ++m) {
            int32_t x4;
            __builtin_memcpy(&x4, p.xq + (m0 + m) * p.K + g * kGroup + 16 * b + 4 * j, 4);
            const __m256i prod = _mm256_maddubs_epi16(q, _mm256_set1_epi32(x4));
            acc[m][h] = _mm256_add_epi32(acc[m][h], _mm256_madd_epi16(prod, ones));
          }
        }
      }
    const __m128i* c = reinterpret_cast<const __m128i*>(w + 4 * kBlockBytes);
    for (int h = 0; h < 2; ++h) {
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(c + h));
      const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128(c + 2 + h));
      for (int m = 0; m < MR; ++m) {
        const __m256 st = _mm256_mul_ps(s, _mm256_set1_ps(p.step[(m0 + m) * ng + g]));
        y[m][h] = _mm256_fmadd_ps(st, _mm256_cvtepi32_ps(acc[m][h]), y[m][h]);
        y[m][h] = _mm256_fmadd_ps(mn, _mm256_set1_ps(p.xsum[(m0 + m) * ng + g]), y[m][h]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(p.scores + (m0 + m) * p.tiles * kTile + t * kTile + 8 * h, y[m][h]);
}

#endif

void run_tiles(const Screen& p, int64_t t) {
  for (int64_t m0 = 0; m0 < p.M; m0 += kRows) {
    switch (std::min(kRows, p.M - m0)) {
      case 4: run_tile<4>(p, t, m0); break;
      case 3: run_tile<3>(p, t, m0); break;
      case 2: run_tile<2>(p, t, m0); break;
      default: run_tile<1>(p, t, m0); break;
    }
  }
}

// The top_n of s [0, n) (top_n <= n) into idx, by falling score, ties to the lower row, a NaN
// counting as -inf: the first top_n rows fill the slots, then a row (in order) replaces the
// lowest kept one when above it. A vector compare skips the rows that cannot enter.
void top_rows(const float* s, int64_t n, int64_t top_n, int64_t* idx) {
  const auto score = [&](int64_t r) { return std::isnan(s[r]) ? -INFINITY : s[r]; };
  std::vector<float> val(top_n);
  std::vector<int64_t> at(top_n);
  for (int64_t r = 0; r < top_n; ++r) val[r] = score(r), at[r] = r;
  int64_t low = 0;  // the slot to replace: the lowest score, of those the highest row
  const auto find_low = [&]() {
    low = 0;
    for (int64_t i = 1; i < top_n; ++i)
      if (val[i] < val[low] || (val[i] == val[low] && at[i] > at[low])) low = i;
  };
  find_low();
  const auto consider = [&](int64_t r) {
    if (score(r) > val[low]) val[low] = score(r), at[low] = r, find_low();
  };
  int64_t r = top_n;
  for (; r < n && r % 8; ++r) consider(r);
  for (; r + 8 <= n; r += 8) {
    const __m256 v = _mm256_loadu_ps(s + r);
    int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(val[low]), _CMP_GT_OQ));
    while (mask) {
      consider(r + __builtin_ctz(mask));  // val[low] may have risen: consider checks again
      mask &= mask - 1;
    }
  }
  for (; r < n; ++r) consider(r);
  std::vector<int64_t> order(top_n);
  for (int64_t i = 0; i < top_n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return val[a] > val[b] || (val[a] == val[b] && at[a] < at[b]);
  });
  for (int64_t i = 0; i < top_n; ++i) idx[i] = at[order[i]];
}

// sum of exp(s - top) over s [0, n), 8 lanes, then reduce_add: a fixed order.
float sum_exp(const float* s, int64_t n, float top) {
  const __m256 t = _mm256_set1_ps(top);
  __m256 acc = _mm256_setzero_ps();
  int64_t r = 0;
  for (; r + 8 <= n; r += 8)
    acc = _mm256_add_ps(acc, specserve_native::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + r), t)));
  float sum = specserve_native::reduce_add(acc);
  for (; r < n; ++r) sum += std::exp(s[r] - top);
  return sum;
}

// The head's exact logits (bf16, as its own op gives them) of the tiles holding cand [M, top_n]:
// those tiles gathered into one packed weight (sorted), multiplied by the int4 kernel (a row's
// result depends on its own codes and x only); tile_of maps a tile to its place.
std::vector<uint16_t> exact_tiles(const uint16_t* x, int64_t M,
                                  const specserve_native::PackedWeight& head,
                                  const int64_t* cand, int64_t n, std::vector<int64_t>& tiles) {
  tiles.assign(cand, cand + n);
  for (int64_t& t : tiles) t /= kTile;
  std::sort(tiles.begin(), tiles.end());
  tiles.erase(std::unique(tiles.begin(), tiles.end()), tiles.end());
  const int64_t nt = static_cast<int64_t>(tiles.size()), tb = head.tile_bytes;
  const int64_t sb = head.scales == nullptr ? 0 : head.K / head.group_size * 2 * kTile;
  std::vector<uint8_t> q(nt * tb);
  std::vector<uint16_t> sc(nt * sb);
  std::vector<float> rs(nt * kTile);
  for (int64_t i = 0; i < nt; ++i) {
    std::memcpy(q.data() + i * tb, head.qweight + tiles[i] * tb, tb);
    if (sb) std::memcpy(sc.data() + i * sb, head.scales + tiles[i] * sb, sb * 2);
    std::memcpy(rs.data() + i * kTile, head.row_scale + tiles[i] * kTile, kTile * 4);
  }
  specserve_native::PackedWeight sub = head;
  sub.qweight = q.data();
  sub.scales = sb ? sc.data() : nullptr;
  sub.row_scale = rs.data();
  sub.N = nt * kTile;
  std::vector<uint16_t> out(M * sub.N);
  specserve_native::int4_matmul(x, M, sub, out.data(), false);
  return out;
}

Tensor head_screen(const Tensor& x_in, const Tensor& codes, int64_t out_features, int64_t vocab,
                   int64_t top_n, const Tensor& qweight, const Tensor& scales,
                   const Tensor& row_scale, int64_t group_size, int64_t tiles_mode,
                   Tensor& candidates) {
  STD_TORCH_CHECK(specserve_native::avx2_supported() && specserve_native::cpu_supported(),
                  "head_screen: this CPU lacks the int4 kernel's instructions");
  STD_TORCH_CHECK(x_in.is_cpu() && x_in.dim() == 2 && x_in.scalar_type() == ScalarType::BFloat16,
                  "head_screen: x must be a CPU bf16 [M, K]");
  STD_TORCH_CHECK(codes.is_cpu() && codes.dim() == 4 && codes.scalar_type() == ScalarType::Byte &&
                      codes.size(2) == kBlocks && codes.size(3) == kBlockBytes &&
                      codes.is_contiguous(),
                  "head_screen: codes must be contiguous uint8 [Np / 16, K / 64, 5, 64]");
  const Tensor x = x_in.is_contiguous() ? x_in : torch::stable::contiguous(x_in);
  const int64_t M = x.size(0), K = x.size(1), tiles = codes.size(0);
  STD_TORCH_CHECK(K == codes.size(1) * kGroup, "head_screen: x has ", K, " inputs, the codes ",
                  codes.size(1) * kGroup);
  STD_TORCH_CHECK(out_features > (tiles - 1) * kTile && out_features <= tiles * kTile,
                  "head_screen: out_features ", out_features, " does not fit ", tiles, " tiles");
  STD_TORCH_CHECK(top_n >= 1 && top_n <= out_features, "head_screen: top_n must be in [1, ",
                  out_features, "], got ", top_n);
  STD_TORCH_CHECK(vocab >= 1, "head_screen: vocab must be positive, got ", vocab);
  STD_TORCH_CHECK(candidates.is_cpu() && candidates.scalar_type() == ScalarType::Long &&
                      candidates.dim() == 2 && candidates.size(0) == M &&
                      candidates.size(1) == top_n && candidates.is_contiguous(),
                  "head_screen: candidates must be a contiguous int64 [M, top_n]");
  specserve_native::PackedWeight head = specserve_native::tile_packed_weight(
      qweight, scales, row_scale, out_features, group_size, "head_screen", 4);
  head.tiles = tiles_mode;
  STD_TORCH_CHECK(head.K == K && (head.N + kTile - 1) / kTile == tiles,
                  "head_screen: the int4 head does not match the codes");
  const int64_t ng = K / kGroup, n_pad = tiles * kTile;
  std::vector<int8_t> xq(M * K);
  std::vector<float> step(M * ng), xsum(M * ng);
  const std::unique_ptr<float[]> score_buf(new float[M * n_pad]);  // every entry written
  float* scores = score_buf.get();
  const auto* xp = static_cast<const uint16_t*>(x.const_data_ptr());
  quantise_rows(xp, M, K, xq.data(), step.data(), xsum.data());
  const Screen p{static_cast<const uint8_t*>(codes.const_data_ptr()), xq.data(), step.data(),
                 xsum.data(), M, K, tiles, scores};
  torch::stable::parallel_for(0, tiles, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) run_tiles(p, t);
  });
  auto* cand = static_cast<int64_t*>(candidates.mutable_data_ptr());
  Tensor stats = specserve_native::empty_2d(M, 3, true);
  auto* st = static_cast<float*>(stats.mutable_data_ptr());
  for (int64_t m = 0; m < M; ++m) {
    float* s = scores + m * n_pad;
    top_rows(s, out_features, top_n, cand + m * top_n);
    st[3 * m + 1] = s[cand[m * top_n]];
    for (int64_t i = 0; i < top_n; ++i) s[cand[m * top_n + i]] = -INFINITY;
  }
  const int64_t chunks = (out_features + kChunk - 1) / kChunk;
  std::vector<float> part(M * chunks);
  torch::stable::parallel_for(0, M * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = i / chunks, r0 = (i % chunks) * kChunk;
      part[i] = sum_exp(scores + m * n_pad + r0, std::min(kChunk, out_features - r0),
                        st[3 * m + 1]);
    }
  });
  std::vector<int64_t> tile_list;
  const std::vector<uint16_t> exact = exact_tiles(xp, M, head, cand, M * top_n, tile_list);
  const int64_t n_exact = static_cast<int64_t>(tile_list.size()) * kTile;
  for (int64_t m = 0; m < M; ++m) {
    int64_t* c = cand + m * top_n;
    std::vector<float> logit(top_n, -INFINITY);
    int64_t best = -1;
    for (int64_t i = 0; i < top_n; ++i) {
      if (c[i] >= vocab) continue;
      const int64_t at = (std::lower_bound(tile_list.begin(), tile_list.end(), c[i] / kTile) -
                          tile_list.begin()) * kTile + c[i] % kTile;
      logit[i] = specserve_native::bf16_to_float(exact[m * n_exact + at]);
      if (best < 0 || logit[i] > logit[best] || (logit[i] == logit[best] && c[i] < c[best]))
        best = i;
    }
    float tail = 0.0f;
    for (int64_t ch = 0; ch < chunks; ++ch) tail += part[m * chunks + ch];
    if (best < 0) {  // no candidate below vocab (a head far wider than the vocabulary)
      st[3 * m] = 0.0f, st[3 * m + 2] = tail;
      continue;
    }
    const float top = logit[best];
    float sum = tail * std::exp(st[3 * m + 1] - top);
    for (int64_t i = 0; i < top_n; ++i) sum += std::exp(logit[i] - top);
    std::swap(c[0], c[best]);
    st[3 * m] = 1.0f / sum;
    st[3 * m + 2] = tail;
  }
  return stats;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def(
      "head_screen(Tensor x, Tensor codes, int out_features, int vocab, int top_n, "
      "Tensor qweight, Tensor scales, Tensor row_scale, int group_size, int tiles, "
      "Tensor(a!) candidates) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CPU, m) { m.impl("head_screen", TORCH_BOX(&head_screen)); }
