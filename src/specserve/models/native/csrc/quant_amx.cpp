// Int4 and six-bit weights on the AMX tiles (tdpbf16ps), for every number of x rows.
//
// Where a step carries several tokens, the vdpbf16ps kernels of int4_gemv.cpp and
// int8_gemv.cpp pay one instruction per (16 weight rows, 2 inputs, x row): on a CPU with AMX
// a verify of 5 rows cost 2.7 one-row steps (docs/benchmarks.md). Here the codes of a tile
// (16 weight rows) are unpacked into the same bf16 pair vectors (code_pairs.h), stored as the
// weight operand B of tdpbf16ps (pair j of the chunk in B's row j, output row i in its 32-bit
// column i), and multiplied by up to 16 x rows at once, read in place as operand A (row-major
// bf16, the matmul's row stride): one instruction per (16 weight rows, 32 inputs, 16 x rows).
//
// Per output (m, n), for each group g of G inputs:
//   acc = 0
//   for each chunk of C inputs of the group (C = 32, or 16 for six-bit groups of 16), and in
//   it for each pair j in order:  acc += w'[2j] * x[2j]; acc += w'[2j + 1] * x[2j + 1]
//   (w' = 128 + q for int4, code + 160 for six-bit codes: exact bf16; the products exact in
//   fp32, the sums rounded by tdpbf16ps's definition, denormals flushed)
//   y = fma(s, acc, y);  y = fma(fma(s, -offset, c), xsum[m, g], y)
// with the group's constants (s and c as int4_gemv.cpp and int8_gemv.cpp define them, offset
// 135.5 and 160 respectively) and out = y * row_scale, rounded to bf16 (nearest even) or not.
// A row's sums read its own x row and weight rows only, so every row is bit-identical whatever
// M, the other rows or the thread split (over tiles of N). The sums round differently from
// the vdpbf16ps chains', so quant_amx_applies() decides per weight and switch, never per M.
//
// A group's codes are unpacked two groups before the tile unit reads them and its sums
// (stored from the tile unit, tilestored) scaled two groups after, and groups alternate
// between two sets of tile registers, so the vector and tile units overlap.
//
// Opt-in (SPECSERVE_QUANT_AMX=1, read on every call): a one-row call costs more on the tiles
// than on the vdpbf16ps kernel (unpacking, the tile loads and stores for every group of 16
// weight rows, whatever M; measured 0.8x on an AMX host), a call of 3 or more rows less
// (1.5 - 1.9x at 5 rows), so the tiles pay where most steps carry several tokens: the target
// of speculative decoding (docs/benchmarks.md).

#include <torch/csrc/stable/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "amx_tiles.h"
#include "code_pairs.h"
#include "quant_amx.h"
#include "simd.h"

#ifdef SPECSERVE_HAVE_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(SPECSERVE_HAVE_AMX) && defined(SPECSERVE_SIX_BIT_PAIRS)
#define SPECSERVE_QUANT_AMX 1
#endif

namespace specserve_native {

bool switch_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v != nullptr && v[0] == '0' && v[1] == '\0');
}

bool switch_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '1' && v[1] == '\0';
}

bool amx_permitted() {
#ifdef SPECSERVE_HAVE_AMX
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted && switch_on("SPECSERVE_AMX");
#else
  return false;
#endif
}

int64_t amx_prefetch() { return 6144; }

int64_t amx_grain(int64_t K, int64_t M, int bits) {
  const int64_t tile_bytes = std::max<int64_t>(1, K * 16 * bits / 8);
  return std::max<int64_t>(1, (int64_t{128} << 10) / (tile_bytes * std::min<int64_t>(M + 1, 16)));
}

bool quant_amx_permitted() {
#ifdef SPECSERVE_QUANT_AMX
  return amx_permitted();
#else
  return false;
#endif
}

bool quant_amx_on() { return switch_set("SPECSERVE_QUANT_AMX") && quant_amx_permitted(); }

#ifndef SPECSERVE_QUANT_AMX

bool quant_amx_applies(const PackedWeight&) { return false; }

void quant_amx_range(const QuantTiles&, int64_t, int64_t) {}

#else

bool quant_amx_applies(const PackedWeight& w) {
  const bool shape = (w.bits == 4 && w.super_form == 0 && w.group_size % 32 == 0 &&
                      w.group_size <= 256) ||
                     (w.bits == 6 && w.super_form == 0 && w.group_size % 16 == 0 &&
                      w.group_size <= 128);
  if (!shape) return false;
  const int64_t mode = w.tiles & kTilesMask;
  if (mode == kTilesPermitted) return quant_amx_permitted();
  return mode == kTilesSwitched && quant_amx_on();
}

namespace {

constexpr int64_t kTile = 16;   // weight rows per tile; x rows per tile at most
constexpr int64_t kBlock = 64;  // bytes of one stream block
constexpr int kRing = 4;        // groups' sums kept
constexpr int kLag = 2;         // groups between a group's tilestored and its scaling
constexpr int kAhead = 2;       // groups between a group's unpacking and its tile loads
constexpr int64_t kMaxChunks = 8;  // chunks of a group at most (G <= 256 int4, 128 six-bit)

// Tile registers: P (0 or 1) the sums of alternate groups, 2 + P their x chunk (A), 4 + P
// their codes (B).
void load_config(int64_t rows, int64_t chunk) {
  TileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = 64;
    c.rows[2 + t] = static_cast<uint8_t>(rows);
    c.colsb[2 + t] = static_cast<uint16_t>(chunk * 2);
    c.rows[4 + t] = static_cast<uint8_t>(chunk / 2);
    c.colsb[4 + t] = 64;
  }
  _tile_loadconfig(&c);
}

struct alignas(64) PairRows {
  uint32_t row[16][kTile];  // B: pair j of the chunk in row j
};

// Block blk of a six-bit unit: B's rows 2 blk and 2 blk + 1.
template <int blk>
inline void six_bit_rows(__m512i l0, __m512i l1, __m512i hb, __m512i pairs01, __m512i pairs23,
                         PairRows& b) {
  __m512i z0, z1;
  six_bit_block_pairs<blk>(l0, l1, hb, pairs01, pairs23, z0, z1);
  _mm512_store_si512(b.row[2 * blk], z0);
  _mm512_store_si512(b.row[2 * blk + 1], z1);
}

// One chunk of codes (int4: 32 inputs, 4 blocks; six-bit: one unit of 16 inputs, 3 blocks)
// into B's rows.
template <int kBits>
inline void unpack_chunk(const uint8_t* src, PairRows& b, __m512i pairs01, __m512i pairs23) {
  if constexpr (kBits == 4) {
#pragma GCC unroll 4
    for (int blk = 0; blk < 4; ++blk) {
      __m512i z[4];
      int4_block_pairs(_mm512_loadu_si512(src + blk * kBlock), z);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) _mm512_store_si512(b.row[4 * blk + c], z[c]);
    }
  } else {
    const __m512i l0 = _mm512_loadu_si512(src), l1 = _mm512_loadu_si512(src + kBlock);
    const __m512i hb = _mm512_loadu_si512(src + 2 * kBlock);
    six_bit_rows<0>(l0, l1, hb, pairs01, pairs23, b);
    six_bit_rows<1>(l0, l1, hb, pairs01, pairs23, b);
    six_bit_rows<2>(l0, l1, hb, pairs01, pairs23, b);
    six_bit_rows<3>(l0, l1, hb, pairs01, pairs23, b);
  }
}

struct Geometry {
  int64_t G, chunk, ngroups;
  int64_t chunk_bytes;  // stream bytes of one chunk of codes
  int64_t code_bytes;   // of one group
  int64_t group_bytes;  // codes and (inline) the constants block
  bool inline_constants;
  float offset;         // -(128 + 7.5) for int4, -160 for six-bit codes
};

Geometry geometry(const PackedWeight& w) {
  Geometry g;
  g.G = w.group_size;
  g.ngroups = w.K / g.G;
  if (w.bits == 4) {
    g.chunk = 32;
    g.chunk_bytes = 4 * kBlock;
    g.code_bytes = g.G / 8 * kBlock;
    g.offset = -135.5f;
  } else {
    g.chunk = 16;  // one unit a chunk
    g.chunk_bytes = 3 * kBlock;
    g.code_bytes = 3 * g.G / 16 * kBlock;
    g.offset = -160.0f;
  }
  g.inline_constants = w.bits == 6 || w.inline_constants;
  g.group_bytes = g.code_bytes + (g.inline_constants ? kBlock : 0);
  return g;
}

// Group g's sums into sums (rows x 16 fp32) from its unpacked chunks b, on tile registers TC
// (sums), TA (x), TB (codes). GCC's tile intrinsics take the register numbers as literals,
// hence a macro.
#define SPECSERVE_GROUP_SUMS(TC, TA, TB)              \
  do {                                                \
    _tile_zero(TC);                                   \
    for (int64_t c = 0; c < nchunks; ++c) {           \
      _tile_loadd(TA, xg + c * chunk, K * 2);         \
      _tile_loadd(TB, b[c].row, 64);                  \
      _tile_dpbf16ps(TC, TA, TB);                     \
    }                                                 \
    _tile_stored(TC, sums, 64);                       \
  } while (0)

inline void group_sums(bool odd, int64_t nchunks, int64_t chunk, const uint16_t* xg, int64_t K,
                       const PairRows* b, float (*sums)[kTile]) {
  if (odd) {
    SPECSERVE_GROUP_SUMS(1, 3, 5);
  } else {
    SPECSERVE_GROUP_SUMS(0, 2, 4);
  }
}
#undef SPECSERVE_GROUP_SUMS

// Tile `tile` (weight rows 16 tile ..) against the x rows [m0, m0 + rows). A group's codes are
// unpacked kAhead groups before the tile unit reads them, and its sums scaled kLag groups after
// it stored them: the vector and tile units never wait for each other's stores.
template <int kBits>
void run_tile(const QuantTiles& p, const Geometry& geo, int64_t tile, int64_t m0, int64_t rows) {
  const PackedWeight& w = *p.w;
  const int64_t K = w.K, N = w.N, nchunks = geo.G / geo.chunk;
  const uint8_t* base = w.qweight + tile * w.tile_bytes;
  const uint16_t* x = p.x + m0 * K;
  const float* xs = p.xsum + m0 * geo.ngroups;
  const __m512i pairs01 = _mm512_load_si512(kPairs01.idx);
  const __m512i pairs23 = _mm512_load_si512(kPairs23.idx);
  const __m512 offset = _mm512_set1_ps(geo.offset);

  alignas(64) float sums[kRing][kTile][kTile];
  PairRows b[kRing][kMaxChunks];
  __m512 y[kTile];
  for (int64_t m = 0; m < rows; ++m) y[m] = _mm512_setzero_ps();
  const auto unpack_group = [&](int64_t g) {
    const uint8_t* codes = base + g * geo.group_bytes;
    for (int64_t off = 0; off < geo.group_bytes; off += kBlock)
      _mm_prefetch(reinterpret_cast<const char*>(codes) + p.prefetch + off, _MM_HINT_T0);
    for (int64_t c = 0; c < nchunks; ++c)
      unpack_chunk<kBits>(codes + c * geo.chunk_bytes, b[g % kRing][c], pairs01, pairs23);
  };
  for (int64_t g = 0; g < std::min<int64_t>(kAhead, geo.ngroups); ++g) unpack_group(g);

  for (int64_t g = 0; g < geo.ngroups + kLag; ++g) {
    if (g + kAhead < geo.ngroups) unpack_group(g + kAhead);
    if (g < geo.ngroups)
      group_sums(g & 1, nchunks, geo.chunk, x + g * geo.G, K, b[g % kRing], sums[g % kRing]);
    if (g >= kLag) {
      const int64_t h = g - kLag;
      // the group's constants: inline after its codes, or in w.scales
      const uint16_t* c =
          geo.inline_constants
              ? reinterpret_cast<const uint16_t*>(base + h * geo.group_bytes + geo.code_bytes)
              : w.scales + (tile * geo.ngroups + h) * 2 * kTile;
      const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
      const __m512 o =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + kTile)));
      const __m512 bias = _mm512_fmadd_ps(s, offset, o);
      const float (*sh)[kTile] = sums[h % kRing];
      for (int64_t m = 0; m < rows; ++m) {
        y[m] = _mm512_fmadd_ps(s, _mm512_load_ps(sh[m]), y[m]);
        y[m] = _mm512_fmadd_ps(bias, _mm512_set1_ps(xs[m * geo.ngroups + h]), y[m]);
      }
    }
  }

  const int64_t n0 = tile * kTile;
  const int64_t valid = std::min<int64_t>(kTile, N - n0);
  const __mmask16 mask = valid >= kTile ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1u);
  const __m512 r = _mm512_loadu_ps(w.row_scale + n0);
  for (int64_t m = 0; m < rows; ++m) {
    const __m512 v = _mm512_mul_ps(y[m], r);
    if (p.out_f32) {
      _mm512_mask_storeu_ps(static_cast<float*>(p.out) + (m0 + m) * N + n0, mask, v);
    } else {
      const __m256i hv = (__m256i)_mm512_cvtneps_pbh(v);
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p.out) + (m0 + m) * N + n0, mask, hv);
    }
  }
}

template <int kBits>
void run_range(const QuantTiles& p, const Geometry& geo, int64_t begin, int64_t end) {
  // Each tile against every row block in turn (the tile's stream stays in the cache); the
  // balanced row blocks have at most two sizes, so the configuration changes seldom.
  const int64_t blocks = num_row_blocks(p.M, kTile);
  int64_t configured = 0;
  for (int64_t t = begin; t < end; ++t) {
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t m0 = row_block_start(p.M, kTile, i);
      const int64_t rows = row_block_start(p.M, kTile, i + 1) - m0;
      if (rows != configured) {
        load_config(rows, geo.chunk);
        configured = rows;
      }
      run_tile<kBits>(p, geo, t, m0, rows);
    }
  }
  _tile_release();
}

}  // namespace

void quant_amx_range(const QuantTiles& p, int64_t begin, int64_t end) {
  const Geometry geo = geometry(*p.w);
  if (p.w->bits == 4) {
    run_range<4>(p, geo, begin, end);
  } else {
    run_range<6>(p, geo, begin, end);
  }
}

#endif  // SPECSERVE_QUANT_AMX

}  // namespace specserve_native

namespace {
// Whether int4 and six-bit matmuls of a target's weights run on the AMX tiles now
// (quant_amx_on); with switched=False, whether the tiles are there at all
// (quant_amx_permitted: a draft model's calls of several rows take them).
bool quant_amx_active(bool switched) {
  return switched ? specserve_native::quant_amx_on() : specserve_native::quant_amx_permitted();
}
}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def("quant_amx_active(bool switched=True) -> bool");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CompositeExplicitAutograd, m) {
  m.impl("quant_amx_active", TORCH_BOX(&quant_amx_active));
}
