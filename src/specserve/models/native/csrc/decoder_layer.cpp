// One whole decoder layer in one call, for bf16 models on CPU: RMSNorm, q/k/v projection
// (+ bias, + per-head q/k RMSNorm for Qwen3), RoPE, KV-cache write, attention, output
// projection, residual, RMSNorm, gate/up projection, SiLU * up, down projection, residual.
// Two ops share the body and differ in their projections' weights:
//   torch.ops.specserve.int4_decoder_layer  packed quantised weights, q/k/v and gate/up fused
//                                           into one matrix each; each projection in the int4
//                                           layout (uint8 qweight, int4_gemv.cpp) or the
//                                           int8-group one (int8 qweight, int8_gemv.cpp);
//   torch.ops.specserve.bf16_decoder_layer  the model's own bf16 weights (bf16_gemm.cpp),
//                                           seven matrices, biases added before rounding.
// The Python side is specserve/models/native/fused_layer.py.
//
// Why: a 1-token decode step of a 28-layer model dispatches ~1,900 small ATen ops (about
// 70 per layer) at a few microseconds each: 10-15 ms next to the weight reads. Here a layer is
// one dispatch, and its temporaries are reused buffers.
//
// Numerics follow the eager bf16 module (models/decoder.py) op by op: every value the eager
// path rounds to bf16 is rounded here too (norm output, projections, bias add of the int4 op,
// each RoPE product and sum, attention output, SiLU and its product), and norms, softmax and
// attention accumulate in fp32. Summation orders differ from ATen's, so results agree to bf16
// rounding, not bit for bit. The residual stream x (the layer's input and output) is either
// bf16, its adds rounded as in the eager module, or fp32 (the caller's choice, by x's dtype):
// then the output and down projections write fp32, the adds are not rounded, norms, RoPE and
// SiLU round once where they hand a value on, and bf16 is only what enters a projection, the
// KV cache and the attention output, which keeps the served model's logits nearer fp32
// activations' (docs/benchmarks.md).
//
// Batch invariance: every row's arithmetic is fixed whatever the other rows are (the matmuls
// guarantee it for theirs, the rest is row by row). Attention of a query at position p
// reduces over exactly the keys 0..p of its sequence (masked keys are skipped, not added as
// zeros), so a verified token gets the bits a decode step gives it, and the context length
// the caller pads to does not matter.
//
// The elementwise code is AVX2 + FMA (simd.h), the same on every CPU the library builds for;
// the attention's value sums take 16-lane registers on AVX-512 builds (the same bits), and its
// scores the keys in lanes on AVX-512 BF16 ones (key_lanes.h: other bits, SPECSERVE_BF16_SCORES);
// with AMX BF16 too, scores and value sums run on the tiles (attention_tiles.h: other bits again,
// SPECSERVE_ATTENTION_AMX).
//
// Shapes: M = B * T query rows (B sequences of T tokens, padded rows included), H hidden,
// nh / nkv query / key-value heads of hd dims, I the MLP width.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "bf16_gemm.h"
#include "int4_gemv.h"
#include "int8_gemv.h"
#include "attention_tiles.h"
#include "key_lanes.h"
#include "simd.h"

namespace {

using specserve_native::load_bf16x8;
using specserve_native::round_bf16;
using specserve_native::store_bf16x8;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Eight values of a residual stream in bf16 (uint16_t) or fp32, loaded as fp32; stored back
// rounded to bf16 or as they are.
inline __m256 load_x8(const uint16_t* p) { return load_bf16x8(p); }
inline __m256 load_x8(const float* p) { return _mm256_loadu_ps(p); }
inline void store_x8(uint16_t* p, __m256 v) { store_bf16x8(p, v); }
inline void store_x8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

// v rounded to bf16 where the eager module rounds (eager), v as it is otherwise.
inline __m256 eager_round(__m256 v, bool eager) { return eager ? round_bf16(v) : v; }

// out = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))) per row, like RMSNorm.forward (eager), or
// with one rounding, bf16(w * x * rsqrt(...)); x bf16 or fp32, the output bf16 either way.
template <class X>
void rms_norm(const X* x, const uint16_t* w, uint16_t* out, int64_t M, int64_t H, float eps,
              bool eager) {
  for (int64_t m = 0; m < M; ++m) {
    const X* xr = x + m * H;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < H; i += 8) {
      const __m256 v = load_x8(xr + i);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    const float mean = specserve_native::reduce_add(acc) / static_cast<float>(H);
    const __m256 s = _mm256_set1_ps(1.0f / std::sqrt(mean + eps));
    for (int64_t i = 0; i < H; i += 8) {
      const __m256 n = eager_round(_mm256_mul_ps(load_x8(xr + i), s), eager);
      store_bf16x8(out + m * H + i, _mm256_mul_ps(load_bf16x8(w + i), n));
    }
  }
}

// y[i] = a[i] + b[i] over n values (n a multiple of 8), all bf16 (the sum rounded to bf16, as
// the eager module's adds) or all fp32.
template <class X>
void add_to(const X* a, const X* b, X* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) store_x8(y + i, _mm256_add_ps(load_x8(a + i), load_x8(b + i)));
}

// In place on one head of hd values: the "rotate half" RoPE of apply_rotary, every product
// and the sum rounded to bf16 (eager), or only the sum.
void rope_head(uint16_t* x, const uint16_t* cos, const uint16_t* sin, int64_t hd, bool eager) {
  const int64_t half = hd / 2;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t d = 0; d < half; d += 8) {
    const __m256 x1 = load_bf16x8(x + d), x2 = load_bf16x8(x + half + d);
    const __m256 lo =
        _mm256_add_ps(eager_round(_mm256_mul_ps(x1, load_bf16x8(cos + d)), eager),
                      eager_round(_mm256_mul_ps(_mm256_sub_ps(zero, x2), load_bf16x8(sin + d)),
                                  eager));
    const __m256 hi =
        _mm256_add_ps(eager_round(_mm256_mul_ps(x2, load_bf16x8(cos + half + d)), eager),
                      eager_round(_mm256_mul_ps(x1, load_bf16x8(sin + half + d)), eager));
    store_bf16x8(x + d, lo);
    store_bf16x8(x + half + d, hi);
  }
}

struct AttentionProblem {
  const uint16_t* qkv;  // [M, (nh + 2 nkv) hd], q heads first
  const uint16_t* k_cache;  // [slots, nkv, hd]
  const uint16_t* v_cache;
  const int64_t* positions;  // [M]
  const int64_t* context_slots;  // [B, S]
  uint16_t* out;  // [M, nh hd]
  int64_t T, S, nh, nkv, hd;
  float scale;
  bool fast;  // fast_attention()
  bool lanes;  // bf16_scores(): the keys in lanes, scores by vdpbf16ps (key_lanes.h)
  bool tiles;  // attention_tiles(): scores and value sums on the AMX tiles (attention_tiles.h)
};

// Keys ahead whose K and V rows attend() prefetches: the cache rows of a layer come from
// memory (the weight stream evicts them between steps), and without it the loops waited on
// each key's lines in turn.
constexpr int64_t kKeysAhead = 8;
constexpr int64_t kKeyBlock = 8;  // keys whose q.k chains run side by side
constexpr int64_t kAttendRows = 16;  // rows of a sequence one attention task takes at most

template <int Hint>
inline void prefetch_row(const uint16_t* row, int64_t hd) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < hd * 2; b += 64) _mm_prefetch(p + b, static_cast<_mm_hint>(Hint));
}

// Cache rows j0 .. j0 + nj - 1 (row(j): a bf16 row of hd values) as fp32 into out [nj, hd].
template <class Row>
inline void rows_to_f32(const Row& row, int64_t j0, int64_t nj, int64_t hd, float* out) {
  for (int64_t i = 0; i < nj; ++i)
    for (int64_t d = 0; d < hd; d += 8)
      _mm256_storeu_ps(out + i * hd + d, load_bf16x8(row(j0 + i) + d));
}

// The q.k scores (times scale) of one query head qg against NK keys (fp32 rows kf, [NK, hd]):
// each one chain of FMAs over the head's dims in order, 8 lanes wide, then reduce_add. The
// NK chains run side by side: alone, each would wait on its FMAs' latency.
template <int NK>
inline void score_keys(const float* qg, const float* kf, int64_t hd, float scale, float* sg) {
  __m256 s[NK];
  for (int i = 0; i < NK; ++i) s[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8) {
    const __m256 qd = _mm256_loadu_ps(qg + d);
    for (int i = 0; i < NK; ++i) s[i] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kf + i * hd + d), s[i]);
  }
  for (int i = 0; i < NK; ++i) sg[i] = specserve_native::reduce_add(s[i]) * scale;
}

inline void score_block(const float* qg, const float* kf, int64_t nj, int64_t hd, float scale,
                        float* sg) {
  switch (nj) {
    case 8: return score_keys<8>(qg, kf, hd, scale, sg);
    case 7: return score_keys<7>(qg, kf, hd, scale, sg);
    case 6: return score_keys<6>(qg, kf, hd, scale, sg);
    case 5: return score_keys<5>(qg, kf, hd, scale, sg);
    case 4: return score_keys<4>(qg, kf, hd, scale, sg);
    case 3: return score_keys<3>(qg, kf, hd, scale, sg);
    case 2: return score_keys<2>(qg, kf, hd, scale, sg);
    default: return score_keys<1>(qg, kf, hd, scale, sg);
  }
}

// W fp32 lanes a register: 8 (AVX2) or 16 (AVX-512 builds), for add_values.
template <int W>
struct FloatLanes {
  using V = __m256;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};
#ifdef __AVX512F__
template <>
struct FloatLanes<16> {
  using V = __m512;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

// o [C * W] += the weights pg [nj] times nj fp32 value rows (vf, [nj, C * W]): each output
// lane one chain of FMAs over the keys in order, the C registers' chains side by side (one
// register's alone waits on each FMA's latency). A lane's chain is the same whatever W, so
// 16-lane registers give the bits of 8-lane ones in half the instructions.
template <int C, int W = 8>
inline void add_values(const float* pg, const float* vf, int64_t nj, float* o) {
  using L = FloatLanes<W>;
  typename L::V acc[C];
  for (int c = 0; c < C; ++c) acc[c] = L::load(o + W * c);
  for (int64_t i = 0; i < nj; ++i) {
    const typename L::V w = L::set1(pg[i]);
    for (int c = 0; c < C; ++c) acc[c] = L::fma(w, L::load(vf + i * C * W + W * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) L::store(o + W * c, acc[c]);
}

// o [hd] += pg [nj] times vf [nj, hd] as add_values, one register's chain after the other:
// the earlier form (SPECSERVE_FAST_ATTENTION=0), each chain waiting on its FMAs' latency.
inline void add_values_serial(const float* pg, const float* vf, int64_t nj, int64_t hd, float* o) {
  for (int64_t d = 0; d < hd; d += 8) {
    __m256 sum = _mm256_loadu_ps(o + d);
    for (int64_t i = 0; i < nj; ++i)
      sum = _mm256_fmadd_ps(_mm256_set1_ps(pg[i]), _mm256_loadu_ps(vf + i * hd + d), sum);
    _mm256_storeu_ps(o + d, sum);
  }
}

inline void add_value_block(const float* pg, const float* vf, int64_t nj, int64_t hd, float* o) {
#ifdef __AVX512F__
  switch (hd) {
    case 128: return add_values<8, 16>(pg, vf, nj, o);
    case 64: return add_values<4, 16>(pg, vf, nj, o);
    case 32: return add_values<2, 16>(pg, vf, nj, o);
    default: break;
  }
#endif
  switch (hd) {
    case 128: return add_values<16>(pg, vf, nj, o);
    case 64: return add_values<8>(pg, vf, nj, o);
    case 32: return add_values<4>(pg, vf, nj, o);
    case 16: return add_values<2>(pg, vf, nj, o);
    default: return add_values_serial(pg, vf, nj, hd, o);  // the same chains, one at a time
  }
}

// Whether attention runs as below (the default) or in its earlier form
// (SPECSERVE_FAST_ATTENTION=0: each query row on its own, blocks of 4 keys, the value
// registers' chains one after the other). Read once per layer call, so that a benchmark can
// alternate both in one process; the two give the same bits.
inline bool fast_attention() {
  const char* v = std::getenv("SPECSERVE_FAST_ATTENTION");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Whether the fast form scores keys in lanes with vdpbf16ps (key_lanes.h: AVX-512 BF16 builds,
// head dims a multiple of 32; the default there) or as fp32 chains per key
// (SPECSERVE_BF16_SCORES=0, and every other build): different bits, each batch invariant.
// Read once per layer call, like fast_attention().
inline bool bf16_scores(int64_t hd) {
#ifdef SPECSERVE_KEY_LANES
  const char* v = std::getenv("SPECSERVE_BF16_SCORES");
  return hd % 32 == 0 && (v == nullptr || std::strcmp(v, "0") != 0);
#else
  (void)hd;
  return false;
#endif
}

// The scores sg [n] of one query head in place -> softmax weights (fp32), and sg [n, n8)
// (n8: n rounded up to 8) zeros: the keys past the row's position weigh exactly 0.
inline void softmax(float* sg, int64_t n) {
  const int64_t n8 = (n + 7) / 8 * 8;
  const __m256 tail = specserve_native::tail_mask(n - (n8 - 8));  // valid lanes of the last 8
  for (int64_t j = n; j < n8; ++j) sg[j] = -INFINITY;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n8; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sg + j));
  const __m256 top = _mm256_set1_ps(specserve_native::reduce_max(mx));
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n8; j += 8) {
    __m256 e = specserve_native::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sg + j), top));
    if (j + 8 == n8) e = _mm256_and_ps(e, tail);
    sum = _mm256_add_ps(sum, e);
    _mm256_storeu_ps(sg + j, e);
  }
  const __m256 total = _mm256_set1_ps(specserve_native::reduce_add(sum));
  for (int64_t j = 0; j < n8; j += 8)
    _mm256_storeu_ps(sg + j, _mm256_div_ps(_mm256_loadu_ps(sg + j), total));
}

// Whether attention runs on the AMX tiles (attention_tiles.h: builds with AMX BF16 and AVX-512
// BF16, the OS granting the tiles, head dims a multiple of 32; the default there) or on the
// vector units (SPECSERVE_ATTENTION_AMX=0): different bits, each batch invariant. Read once
// per layer call, like fast_attention().
inline bool attention_tiles(int64_t hd) {
#ifdef SPECSERVE_ATTENTION_TILES
  return hd % 32 == 0 && specserve_native::switch_on("SPECSERVE_ATTENTION_AMX") &&
         specserve_native::amx_permitted();
#else
  (void)hd;
  return false;
#endif
}

#ifdef SPECSERVE_KEY_LANES
// attend()'s scores with the keys in lanes (key_lanes.h): blocks of 16 keys, each turned
// once for all the query heads of the rows with keys in it (keys_of: attend()'s count of a
// row's keys); a row's scores past its own keys are computed too (from later rows' keys, or
// zero rows past n_max) and then masked by the softmax, as the tail of a block always was.
// scores: row r's head g at [(r * group + g) * stride].
template <class Row, class Keys, class Prefetch>
void score_in_lanes(const AttentionProblem& a, int64_t m0, int64_t T, int64_t h, const Row& k_row,
                    const Keys& keys_of, const Prefetch& prefetch_keys, int64_t n_max,
                    int64_t stride, float* scores) {
  using specserve_native::kLaneKeys;
  const int64_t group = a.nh / a.nkv, hd = a.hd;
  const int64_t row_stride = (a.nh + 2 * a.nkv) * hd;
  thread_local std::vector<__m512i> kt;
  thread_local std::vector<const uint16_t*> qs;
  thread_local std::vector<float*> outs;
  kt.resize(static_cast<size_t>(hd / 2));
  qs.resize(static_cast<size_t>(T * group));
  outs.resize(static_cast<size_t>(T * group));
  for (int64_t j0 = 0; j0 < n_max; j0 += kLaneKeys) {
    const int64_t nj = std::min(kLaneKeys, n_max - j0);
    prefetch_keys(j0 + kLaneKeys, j0 + 2 * kLaneKeys);
    specserve_native::keys_to_lanes(k_row, j0, nj, hd, kt.data());
    int64_t nq = 0;  // the query heads of the rows with keys in this block
    for (int64_t r = 0; r < T; ++r) {
      if (keys_of(r) <= j0) continue;
      for (int64_t g = 0; g < group; ++g, ++nq) {
        qs[nq] = a.qkv + (m0 + r) * row_stride + (h * group + g) * hd;
        outs[nq] = scores + (r * group + g) * stride + j0;
      }
    }
    specserve_native::score_queries(qs.data(), kt.data(), hd, a.scale, outs.data(), nq);
  }
}
#endif

// Row j's cache row (hd bf16 values) for kv head h of the sequence whose context slots are ctx.
struct CacheRows {
  const uint16_t* cache;
  const int64_t* ctx;
  int64_t nkv, h, hd;
  const uint16_t* operator()(int64_t j) const { return cache + (ctx[j] * nkv + h) * hd; }
};

// How many keys query row r of a part attends to: keys 0 .. its position.
struct KeyCounts {
  const int64_t* positions;  // from the part's first row
  int64_t operator()(int64_t r) const { return positions[r] + 1; }
};

// The T query rows from m0 (of one sequence) and kv head h of an attention problem: their
// keys' and values' cache rows, each row's key count and the most of them.
struct Part {
  CacheRows keys, values;
  KeyCounts keys_of;
  int64_t n_max = 0;
  Part(const AttentionProblem& a, int64_t m0, int64_t T, int64_t h)
      : keys{a.k_cache, a.context_slots + (m0 / a.T) * a.S, a.nkv, h, a.hd},
        values{a.v_cache, keys.ctx, a.nkv, h, a.hd},
        keys_of{a.positions + m0} {
    for (int64_t r = 0; r < T; ++r) n_max = std::max(n_max, keys_of(r));
  }
};

#ifdef SPECSERVE_ATTENTION_TILES
// attend() on the AMX tiles (attention_tiles.h): the T rows' query heads gathered into whole
// tiles of 16 (rows past T * group zero), every block of 16 keys turned into lanes once and
// scored for all of them, the softmax as attend()'s, then the weights as bf16 pairs against
// the values, the keys in super-blocks of kSuperKeys whose values are laid out once for all
// rows. Other bits than attend()'s vector form; the same independence of the other rows.
constexpr int64_t kSuperKeys = 256;

void attend_on_tiles(const AttentionProblem& a, int64_t m0, int64_t T, int64_t h) {
  using specserve_native::kTileRows;
  const int64_t group = a.nh / a.nkv, hd = a.hd;
  const int64_t row_stride = (a.nh + 2 * a.nkv) * hd;
  const Part part(a, m0, T, h);
  const CacheRows &k_row = part.keys, &v_row = part.values;
  const KeyCounts& keys_of = part.keys_of;
  const int64_t n_max = part.n_max;
  const int64_t rows = T * group, rp = (rows + kTileRows - 1) / kTileRows * kTileRows;
  const int64_t np = (n_max + kTileRows - 1) / kTileRows * kTileRows;  // whole key blocks
  // Per worker thread, reused: query head i = r * group + g at q[i * hd], its scores (then
  // weights) at scores[i * np], their pairs at w[i * np], its sums at acc[i * hd].
  thread_local std::vector<uint16_t> q;
  thread_local std::vector<float> scores, acc;
  thread_local std::vector<uint32_t> w, vp;
  thread_local std::vector<__m512i> kt;
  q.assign(static_cast<size_t>(rp * hd), 0);
  scores.resize(static_cast<size_t>(rp * np));
  w.resize(static_cast<size_t>(rp * np));
  acc.resize(static_cast<size_t>(rp * hd));
  vp.resize(static_cast<size_t>(kSuperKeys * hd));
  kt.resize(static_cast<size_t>(hd / 2));
  for (int64_t r = 0; r < T; ++r)  // a row's query heads are adjacent in its qkv row
    std::memcpy(&q[r * group * hd], a.qkv + (m0 + r) * row_stride + h * group * hd,
                static_cast<size_t>(group * hd) * sizeof(uint16_t));
  for (int64_t j = 0; j < std::min(n_max, kKeysAhead); ++j) prefetch_row<_MM_HINT_T0>(k_row(j), hd);
  specserve_native::load_attention_config();
  for (int64_t j0 = 0; j0 < n_max; j0 += kTileRows) {
    const int64_t nj = std::min(kTileRows, n_max - j0);
    for (int64_t j = j0 + kTileRows; j < std::min(n_max, j0 + 2 * kTileRows); ++j)
      prefetch_row<_MM_HINT_T0>(k_row(j), hd);
    specserve_native::keys_to_lanes(k_row, j0, nj, hd, kt.data());
    specserve_native::score_tiles(q.data(), rp, kt.data(), hd, a.scale, scores.data() + j0, np);
  }
  for (int64_t i = 0; i < rp; ++i) {
    const int64_t n = i < rows ? keys_of(i / group) : 0;
    if (n > 0) softmax(&scores[i * np], n);
    specserve_native::weight_pairs(&scores[i * np], n, np, &w[i * np]);
  }
  for (int64_t s0 = 0; s0 < np; s0 += kSuperKeys) {
    const int64_t ns = std::min(kSuperKeys, np - s0);
    for (int64_t j = s0; j < s0 + ns; ++j) {
      if (j + kKeysAhead < n_max) prefetch_row<_MM_HINT_T0>(v_row(j + kKeysAhead), hd);
      const int64_t b = (j - s0) / kTileRows, k = (j - s0) % kTileRows;
      specserve_native::value_pairs(j < n_max ? v_row(j) : nullptr, hd,
                                    &vp[b * hd * kTileRows + k * kTileRows]);
    }
    specserve_native::value_tiles(&w[s0], np, vp.data(), ns / kTileRows, rp, hd, acc.data(),
                                  s0 == 0);
  }
  _tile_release();
  for (int64_t i = 0; i < rows; ++i) {
    uint16_t* o = a.out + (m0 + i / group) * a.nh * hd + (h * group + i % group) * hd;
    for (int64_t d = 0; d < hd; d += 8) store_bf16x8(o + d, _mm256_loadu_ps(&acc[i * hd + d]));
  }
}
#endif

// The T query rows from m0 (of one sequence), the query heads of kv head h: softmax(q k^T *
// scale) v over keys 0..p of each row (p its position). Each q.k is one chain of FMAs over the
// head's dims in order, then reduce_add (score_keys: the chains of a block's kKeyBlock keys
// side by side), and each output lane one chain of FMAs over the keys in order (add_values:
// a head's value registers side by side); which chains share the machine changes no bit. The
// rows share each block of keys and values: read from the cache and converted to fp32 once
// for all of them (a verify's rows used to read the whole context once each), and a row
// takes from a block only the keys up to its own position, so its arithmetic is the same
// whatever the other rows are. With a.fast off (fast_attention), the earlier form: T = 1 per
// call, blocks of 4 keys, the value registers one after the other; the same bits, slower.
// With a.lanes (bf16_scores), the scores come instead from score_in_lanes: other bits, the
// same independence of the other rows; with a.tiles, all of it from attend_on_tiles.
void attend(const AttentionProblem& a, int64_t m0, int64_t T, int64_t h) {
#ifdef SPECSERVE_ATTENTION_TILES
  if (a.tiles) return attend_on_tiles(a, m0, T, h);
#endif
  const int64_t group = a.nh / a.nkv, hd = a.hd;
  const int64_t row_stride = (a.nh + 2 * a.nkv) * hd;
  const Part part(a, m0, T, h);
  const CacheRows &k_row = part.keys, &v_row = part.values;
  const KeyCounts& keys_of = part.keys_of;
  const int64_t n_max = part.n_max;
  const int64_t stride = (n_max + 15) / 16 * 16;  // a row's scores: whole blocks of 16 keys
  // K rows into L1 for the q.k loop, V rows into L2 for the value loop (which pulls them
  // into L1 kKeysAhead keys ahead of itself), keys [from, min(to, n_max)).
  const auto prefetch_keys = [&](int64_t from, int64_t to) {
    for (int64_t j = from; j < std::min(n_max, to); ++j) {
      prefetch_row<_MM_HINT_T0>(k_row(j), hd);
      prefetch_row<_MM_HINT_T1>(v_row(j), hd);
    }
  };
  // Per worker thread, reused across calls (no allocation per head and layer): row r's head
  // g at q[(r * group + g) * hd], its scores at scores[(r * group + g) * stride], its sums at
  // acc[(r * group + g) * hd]; block: up to kKeyBlock cache rows in fp32.
  thread_local std::vector<float> q, scores, acc, block;
  q.resize(static_cast<size_t>(T * group * hd));
  scores.resize(static_cast<size_t>(T * group * stride));
  acc.assign(static_cast<size_t>(T * group * hd), 0.0f);
  block.resize(static_cast<size_t>(kKeyBlock * hd));
  for (int64_t r = 0; r < T && !a.lanes; ++r)  // (in lanes, the scores read q as bf16)
    for (int64_t g = 0; g < group; ++g) {
      const uint16_t* qr = a.qkv + (m0 + r) * row_stride + (h * group + g) * hd;
      float* qd = &q[(r * group + g) * hd];
      for (int64_t d = 0; d < hd; d += 8) _mm256_storeu_ps(qd + d, load_bf16x8(qr + d));
    }
  prefetch_keys(0, kKeysAhead);
  const int64_t kb = a.fast ? kKeyBlock : 4;
#ifdef SPECSERVE_KEY_LANES
  if (a.lanes) {
    score_in_lanes(a, m0, T, h, k_row, keys_of, prefetch_keys, n_max, stride, scores.data());
  } else
#endif
  for (int64_t j0 = 0; j0 < n_max; j0 += kb) {
    const int64_t nj_max = std::min(kb, n_max - j0);
    prefetch_keys(j0 + kKeysAhead, j0 + kKeysAhead + nj_max);
    float* kf = block.data();  // the block's keys in fp32, [nj_max, hd]
    rows_to_f32(k_row, j0, nj_max, hd, kf);
    for (int64_t r = 0; r < T; ++r) {
      const int64_t nj = std::min(nj_max, keys_of(r) - j0);  // this row's keys of the block
      if (nj <= 0) continue;
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = &q[(r * group + g) * hd];
        float* sg = &scores[(r * group + g) * stride + j0];
        if (a.fast) {
          score_block(qg, kf, nj, hd, a.scale, sg);
        } else if (nj == 4) {
          score_keys<4>(qg, kf, hd, a.scale, sg);
        } else {
          for (int64_t i = 0; i < nj; ++i) score_keys<1>(qg, kf + i * hd, hd, a.scale, sg + i);
        }
      }
    }
  }
  for (int64_t r = 0; r < T; ++r)
    for (int64_t g = 0; g < group; ++g) softmax(&scores[(r * group + g) * stride], keys_of(r));
  // acc += p_j v_j over the keys in order, each output lane one chain of FMAs; a block's
  // values converted to fp32 once for all the rows and heads, each head's sums loaded and
  // stored once per block instead of once per key.
  for (int64_t j0 = 0; j0 < n_max; j0 += kb) {
    const int64_t nj_max = std::min(kb, n_max - j0);
    for (int64_t j = j0 + kKeysAhead; j < std::min(n_max, j0 + kKeysAhead + nj_max); ++j)
      prefetch_row<_MM_HINT_T0>(v_row(j), hd);
    float* vf = block.data();  // the block's values in fp32, [nj_max, hd]
    rows_to_f32(v_row, j0, nj_max, hd, vf);
    for (int64_t r = 0; r < T; ++r) {
      const int64_t nj = std::min(nj_max, keys_of(r) - j0);
      if (nj <= 0) continue;
      for (int64_t g = 0; g < group; ++g) {
        const float* pg = &scores[(r * group + g) * stride + j0];
        float* o = &acc[(r * group + g) * hd];
        if (a.fast) {
          add_value_block(pg, vf, nj, hd, o);
        } else {
          add_values_serial(pg, vf, nj, hd, o);
        }
      }
    }
  }
  for (int64_t r = 0; r < T; ++r)
    for (int64_t g = 0; g < group; ++g) {
      uint16_t* o = a.out + (m0 + r) * a.nh * hd + (h * group + g) * hd;
      const float* src = &acc[(r * group + g) * hd];
      for (int64_t d = 0; d < hd; d += 8) store_bf16x8(o + d, _mm256_loadu_ps(src + d));
    }
}

// gate_up [M, 2I] (gate columns first) -> out [M, I] = bf16(bf16(silu(gate)) * up) (eager),
// or bf16(silu(gate) * up).
void silu_mul(const uint16_t* gate_up, uint16_t* out, int64_t M, int64_t I, bool eager) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* g = gate_up + m * 2 * I;
    for (int64_t i = 0; i < I; i += 8) {
      const __m256 x = load_bf16x8(g + i);
      const __m256 e = specserve_native::exp_ps(_mm256_sub_ps(zero, x));
      const __m256 act = eager_round(_mm256_div_ps(x, _mm256_add_ps(one, e)), eager);
      store_bf16x8(out + m * I + i, _mm256_mul_ps(act, load_bf16x8(g + I + i)));
    }
  }
}

const uint16_t* bf16_data(const Tensor& t) {
  return static_cast<const uint16_t*>(t.const_data_ptr());
}

void check_bf16(const Tensor& t, int64_t numel, const char* op, const char* name) {
  STD_TORCH_CHECK(t.is_cpu() && t.scalar_type() == ScalarType::BFloat16 && t.is_contiguous() &&
                      t.numel() == numel,
                  op, ": ", name, " must be a contiguous CPU bf16 tensor of ", numel, " values");
}

void check_index(const Tensor& t, int64_t numel, const char* op, const char* name) {
  STD_TORCH_CHECK(t.is_cpu() && t.scalar_type() == ScalarType::Long && t.is_contiguous() &&
                      t.numel() == numel,
                  op, ": ", name, " must be a contiguous CPU int64 tensor of ", numel, " values");
}

// What both ops take besides their projection weights, checked.
struct Layer {
  const char* op;
  const Tensor& x;
  const Tensor& positions;
  const Tensor& slot_mapping;
  const Tensor& context_slots;
  const Tensor& cos;
  const Tensor& sin;
  Tensor& k_cache;
  Tensor& v_cache;
  const Tensor& input_norm;
  const Tensor& post_norm;
  const Tensor& q_norm;
  const Tensor& k_norm;
  int64_t nh, nkv;
  double eps;
  // Derived by check():
  int64_t M = 0, H = 0, B = 0, S = 0, hd = 0, slots = 0, n_qkv = 0;
  bool has_qk_norm = false;

  void check() {
    STD_TORCH_CHECK(specserve_native::avx2_supported(), op, ": this CPU lacks AVX2 / FMA / F16C");
    STD_TORCH_CHECK(x.dim() == 2, op, ": x must be [M, hidden]");
    M = x.size(0);
    H = x.size(1);
    STD_TORCH_CHECK(context_slots.dim() == 2, op, ": context_slots must be [B, S]");
    B = context_slots.size(0);
    S = context_slots.size(1);
    STD_TORCH_CHECK(B > 0 && M % B == 0, op, ": ", M, " rows are not B = ", B,
                    " sequences of equal length");
    STD_TORCH_CHECK(nkv > 0 && nh > 0 && nh % nkv == 0, op,
                    ": num_heads must be a multiple of num_kv_heads");
    STD_TORCH_CHECK(k_cache.dim() == 3 && k_cache.size(1) == nkv, op,
                    ": k_cache must be [slots, num_kv_heads, head_dim]");
    hd = k_cache.size(2);
    slots = k_cache.size(0);
    STD_TORCH_CHECK(hd % 16 == 0 && H % 16 == 0, op,
                    ": head_dim and hidden must be multiples of 16");
    n_qkv = (nh + 2 * nkv) * hd;
    STD_TORCH_CHECK(x.is_cpu() && x.is_contiguous() && x.numel() == M * H &&
                        (x.scalar_type() == ScalarType::BFloat16 ||
                         x.scalar_type() == ScalarType::Float),
                    op, ": x must be a contiguous CPU bf16 or fp32 tensor of ", M * H, " values");
    check_bf16(k_cache, slots * nkv * hd, op, "k_cache");
    check_bf16(v_cache, slots * nkv * hd, op, "v_cache");
    check_bf16(cos, M * hd, op, "cos");
    check_bf16(sin, M * hd, op, "sin");
    check_bf16(input_norm, H, op, "input_norm");
    check_bf16(post_norm, H, op, "post_norm");
    check_index(positions, M, op, "positions");
    check_index(slot_mapping, M, op, "slot_mapping");
    check_index(context_slots, B * S, op, "context_slots");
    has_qk_norm = q_norm.numel() > 0;
    STD_TORCH_CHECK(has_qk_norm == (k_norm.numel() > 0), op, ": q_norm and k_norm come together");
    if (has_qk_norm) {
      check_bf16(q_norm, hd, op, "q_norm");
      check_bf16(k_norm, hd, op, "k_norm");
    }
    const auto* pos = static_cast<const int64_t*>(positions.const_data_ptr());
    const auto* slot = static_cast<const int64_t*>(slot_mapping.const_data_ptr());
    const auto* ctx = static_cast<const int64_t*>(context_slots.const_data_ptr());
    for (int64_t m = 0; m < M; ++m) {
      STD_TORCH_CHECK(pos[m] >= 0 && pos[m] < S, op, ": position ", pos[m], " outside the ", S,
                      " context slots");
      STD_TORCH_CHECK(slot[m] >= 0 && slot[m] < slots, op, ": slot ", slot[m],
                      " outside the cache");
    }
    for (int64_t i = 0; i < B * S; ++i)
      STD_TORCH_CHECK(ctx[i] >= 0 && ctx[i] < slots, op, ": context slot ", ctx[i],
                      " outside the cache");
  }
};

// Buffers reused from call to call (one set per calling thread and residual type X).
template <class X>
struct Scratch {
  std::vector<uint16_t> h, qkv, attn, gate_up, act;
  std::vector<X> o, x1, down;  // what the residual stream adds, and the stream after attention
};

// The layer, with the projections of Proj: qkv(h, out [M, n_qkv]) (bias included),
// o(attn, out [M, H], f32), gate_up(h, out [M, 2I]), down(act, out [M, H], f32); the residual
// stream in X (uint16_t: bf16, or float), and o's and down's outputs, and the layer's.
template <class X, class Proj>
Tensor run_layer(Layer& L, const Proj& proj, int64_t I) {
  const int64_t M = L.M, H = L.H, nh = L.nh, nkv = L.nkv, hd = L.hd, n_qkv = L.n_qkv;
  Tensor out = specserve_native::empty_2d(M, H, std::is_same_v<X, float>);
  const X* x = static_cast<const X*>(L.x.const_data_ptr());
  thread_local Scratch<X> s;
  s.h.resize(M * H);
  s.qkv.resize(M * n_qkv);
  s.attn.resize(M * nh * hd);
  s.o.resize(M * H);
  s.x1.resize(M * H);
  s.gate_up.resize(M * 2 * I);
  s.act.resize(M * I);
  s.down.resize(M * H);
  const float feps = static_cast<float>(L.eps);
  const auto* pos = static_cast<const int64_t*>(L.positions.const_data_ptr());
  const auto* slot = static_cast<const int64_t*>(L.slot_mapping.const_data_ptr());
  const auto* ctx = static_cast<const int64_t*>(L.context_slots.const_data_ptr());

  // A bf16 stream rounds as the eager module does; an fp32 one only where a value is stored in
  // bf16 (projection inputs and outputs, the cache, the attention output).
  constexpr bool f32 = std::is_same_v<X, float>, eager = !f32;
  rms_norm(x, bf16_data(L.input_norm), s.h.data(), M, H, feps, eager);
  proj.qkv(s.h.data(), M, s.qkv.data());
  auto* kc = static_cast<uint16_t*>(L.k_cache.mutable_data_ptr());
  auto* vc = static_cast<uint16_t*>(L.v_cache.mutable_data_ptr());
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* row = s.qkv.data() + m * n_qkv;
    if (L.has_qk_norm)  // per head, in place (rms_norm reads a value before writing it)
      for (int64_t head = 0; head < nh + nkv; ++head)
        rms_norm(row + head * hd, bf16_data(head < nh ? L.q_norm : L.k_norm), row + head * hd, 1,
                 hd, feps, eager);
    for (int64_t head = 0; head < nh + nkv; ++head)  // q heads, then k heads
      rope_head(row + head * hd, bf16_data(L.cos) + m * hd, bf16_data(L.sin) + m * hd, hd, eager);
    std::memcpy(kc + slot[m] * nkv * hd, row + nh * hd, nkv * hd * sizeof(uint16_t));
    std::memcpy(vc + slot[m] * nkv * hd, row + (nh + nkv) * hd, nkv * hd * sizeof(uint16_t));
  }
  AttentionProblem a{s.qkv.data(), kc, vc, pos, ctx, s.attn.data(), M / L.B, L.S, nh, nkv, hd,
                     static_cast<float>(std::pow(static_cast<double>(hd), -0.5)),
                     fast_attention(), false, false};
  a.lanes = a.fast && bf16_scores(hd);
  a.tiles = a.lanes && attention_tiles(hd);
  // A sequence's rows together, up to kAttendRows at a time (a prompt's chunk in several
  // tasks: more of them for the threads, and scores for that many rows at most in a thread's
  // scratch), or (the earlier form) each row on its own. A row's bits do not depend on which.
  const int64_t T = M / L.B, rows = a.fast ? std::min(T, kAttendRows) : 1;
  const int64_t parts = (T + rows - 1) / rows;  // per sequence
  torch::stable::parallel_for(0, L.B * parts * nkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t part = t / nkv % parts, r0 = part * rows;
      attend(a, t / nkv / parts * T + r0, std::min(rows, T - r0), t % nkv);
    }
  });
  proj.o(s.attn.data(), M, s.o.data(), f32);
  add_to(x, s.o.data(), s.x1.data(), M * H);
  rms_norm(s.x1.data(), bf16_data(L.post_norm), s.h.data(), M, H, feps, eager);
  proj.gate_up(s.h.data(), M, s.gate_up.data());
  silu_mul(s.gate_up.data(), s.act.data(), M, I, eager);
  proj.down(s.act.data(), M, s.down.data(), f32);
  add_to(s.x1.data(), s.down.data(), static_cast<X*>(out.mutable_data_ptr()), M * H);
  return out;
}

// run_layer with the residual stream in x's dtype (checked: bf16 or fp32).
template <class Proj>
Tensor run_with_residual(Layer& L, const Proj& proj, int64_t I) {
  if (L.x.scalar_type() == ScalarType::Float) return run_layer<float>(L, proj, I);
  return run_layer<uint16_t>(L, proj, I);
}

// ------------------------------------------------------------------ quantised weights -----

using specserve_native::PackedWeight;

// Each projection int4 or int8-group (PackedWeight::bits), in any mix.
struct QuantProj {
  PackedWeight qkv_w, o_w, gu_w, down_w;
  const uint16_t* qkv_bias;  // null: none
  int64_t n_qkv;
  void qkv(const uint16_t* h, int64_t M, uint16_t* out) const {
    specserve_native::quant_matmul(h, M, qkv_w, out, false);
    if (qkv_bias != nullptr)
      for (int64_t m = 0; m < M; ++m) add_to(out + m * n_qkv, qkv_bias, out + m * n_qkv, n_qkv);
  }
  void o(const uint16_t* a, int64_t M, void* out, bool f32) const {
    specserve_native::quant_matmul(a, M, o_w, out, f32);
  }
  void gate_up(const uint16_t* h, int64_t M, uint16_t* out) const {
    specserve_native::quant_matmul(h, M, gu_w, out, false);
  }
  void down(const uint16_t* a, int64_t M, void* out, bool f32) const {
    specserve_native::quant_matmul(a, M, down_w, out, f32);
  }
};

Tensor int4_decoder_layer(
    const Tensor& x, const Tensor& positions, const Tensor& slot_mapping,
    const Tensor& context_slots, const Tensor& cos, const Tensor& sin, Tensor k_cache,
    Tensor v_cache, const Tensor& input_norm, const Tensor& qkv_qweight, const Tensor& qkv_scales,
    const Tensor& qkv_row_scale, const Tensor& qkv_bias, const Tensor& q_norm,
    const Tensor& k_norm, int64_t qkv_group,
    const Tensor& o_qweight, const Tensor& o_scales, const Tensor& o_row_scale, int64_t o_group,
    const Tensor& post_norm, const Tensor& gate_up_qweight, const Tensor& gate_up_scales,
    const Tensor& gate_up_row_scale, int64_t gate_up_group, const Tensor& down_qweight,
    const Tensor& down_scales, const Tensor& down_row_scale, int64_t down_group,
    int64_t num_heads, int64_t num_kv_heads, double eps, int64_t tiles) {
  const char* op = "int4_decoder_layer";
  Layer L{op,      x,          positions, slot_mapping, context_slots, cos,    sin,
          k_cache, v_cache,    input_norm, post_norm,  q_norm,        k_norm, num_heads,
          num_kv_heads, eps};
  L.check();
  PackedWeight qkv = specserve_native::quant_packed_weight(
      qkv_qweight, qkv_scales, qkv_row_scale, L.n_qkv, qkv_group, "qkv_proj");
  PackedWeight o = specserve_native::quant_packed_weight(o_qweight, o_scales, o_row_scale, L.H,
                                                         o_group, "o_proj");
  PackedWeight down = specserve_native::quant_packed_weight(
      down_qweight, down_scales, down_row_scale, L.H, down_group, "down_proj");
  const int64_t I = down.K;
  PackedWeight gu = specserve_native::quant_packed_weight(
      gate_up_qweight, gate_up_scales, gate_up_row_scale, 2 * I, gate_up_group, "gate_up_proj");
  for (PackedWeight* w : {&qkv, &o, &gu, &down}) w->tiles = tiles;  // quant_amx.h
  for (const PackedWeight* w : {&qkv, &o, &gu, &down}) {
    if (w->bits == 4) {
      STD_TORCH_CHECK(specserve_native::cpu_supported(), op,
                      ": the int4 kernel does not run on this CPU");
    } else {
      STD_TORCH_CHECK(specserve_native::int8_cpu_supported(), op,
                      ": the int8-group kernel does not run on this CPU");
    }
  }
  STD_TORCH_CHECK(qkv.K == L.H && o.K == L.nh * L.hd && gu.K == L.H && I % 16 == 0, op,
                  ": projection shapes do not fit hidden ", L.H, ", ", L.nh, " heads of ", L.hd);
  const bool has_bias = qkv_bias.numel() > 0;
  if (has_bias) check_bf16(qkv_bias, L.n_qkv, op, "qkv_bias");
  const QuantProj proj{qkv, o, gu, down, has_bias ? bf16_data(qkv_bias) : nullptr, L.n_qkv};
  return run_with_residual(L, proj, I);
}

// ------------------------------------------------------------------ bf16 weights ----------

using specserve_native::DenseWeight;

struct Bf16Proj {
  DenseWeight q_w, k_w, v_w, o_w, gate_w, up_w, down_w;
  const uint16_t* qkv_bias;  // [n_qkv] or null
  int64_t n_qkv, I;
  void qkv(const uint16_t* h, int64_t M, uint16_t* out) const {
    const uint16_t* b = qkv_bias;
    const specserve_native::DenseMatmul parts[3] = {
        {q_w, b, out},
        {k_w, b ? b + q_w.N : nullptr, out + q_w.N},
        {v_w, b ? b + q_w.N + k_w.N : nullptr, out + q_w.N + k_w.N}};
    specserve_native::bf16_matmul_many(h, M, parts, 3, n_qkv, false);
  }
  void o(const uint16_t* a, int64_t M, void* out, bool f32) const {
    specserve_native::bf16_matmul(a, M, o_w, nullptr, out, o_w.N, f32);
  }
  void gate_up(const uint16_t* h, int64_t M, uint16_t* out) const {
    const specserve_native::DenseMatmul parts[2] = {{gate_w, nullptr, out},
                                                    {up_w, nullptr, out + I}};
    specserve_native::bf16_matmul_many(h, M, parts, 2, 2 * I, false);
  }
  void down(const uint16_t* a, int64_t M, void* out, bool f32) const {
    specserve_native::bf16_matmul(a, M, down_w, nullptr, out, down_w.N, f32);
  }
};

Tensor bf16_decoder_layer(
    const Tensor& x, const Tensor& positions, const Tensor& slot_mapping,
    const Tensor& context_slots, const Tensor& cos, const Tensor& sin, Tensor k_cache,
    Tensor v_cache, const Tensor& input_norm, const Tensor& q_w, const Tensor& k_w,
    const Tensor& v_w, const Tensor& qkv_bias, const Tensor& q_norm, const Tensor& k_norm,
    const Tensor& o_w, const Tensor& post_norm, const Tensor& gate_w, const Tensor& up_w,
    const Tensor& down_w, int64_t num_heads, int64_t num_kv_heads, double eps) {
  const char* op = "bf16_decoder_layer";
  Layer L{op,      x,          positions, slot_mapping, context_slots, cos,    sin,
          k_cache, v_cache,    input_norm, post_norm,  q_norm,        k_norm, num_heads,
          num_kv_heads, eps};
  L.check();
  STD_TORCH_CHECK(specserve_native::bf16_cpu_supported(), op, ": this CPU lacks ",
                  specserve_native::kBf16Variant);
  const int64_t H = L.H, q_dim = L.nh * L.hd, kv_dim = L.nkv * L.hd;
  const DenseWeight q = specserve_native::dense_weight(q_w, "q_proj");
  const DenseWeight k = specserve_native::dense_weight(k_w, "k_proj");
  const DenseWeight v = specserve_native::dense_weight(v_w, "v_proj");
  const DenseWeight o = specserve_native::dense_weight(o_w, "o_proj");
  const DenseWeight gate = specserve_native::dense_weight(gate_w, "gate_proj");
  const DenseWeight up = specserve_native::dense_weight(up_w, "up_proj");
  const DenseWeight down = specserve_native::dense_weight(down_w, "down_proj");
  const int64_t I = gate.N;
  STD_TORCH_CHECK(q.N == q_dim && q.K == H && k.N == kv_dim && k.K == H && v.N == kv_dim &&
                      v.K == H && o.N == H && o.K == q_dim && gate.K == H && up.N == I &&
                      up.K == H && down.N == H && down.K == I && I % 16 == 0,
                  op, ": projection shapes do not fit hidden ", H, ", ", L.nh, " + ", L.nkv,
                  " heads of ", L.hd);
  const bool has_bias = qkv_bias.numel() > 0;
  if (has_bias) check_bf16(qkv_bias, L.n_qkv, op, "qkv_bias");
  const Bf16Proj proj{q, k, v, o, gate, up, down, has_bias ? bf16_data(qkv_bias) : nullptr,
                      L.n_qkv, I};
  return run_with_residual(L, proj, I);
}

// Whether the layers' attention scores keys in lanes now (bf16_scores) for heads of head_dim.
bool fused_bf16_scores(int64_t head_dim) { return fast_attention() && bf16_scores(head_dim); }

// Whether the layers' attention runs on the AMX tiles now (attention_tiles) for head_dim.
bool fused_attention_tiles(int64_t head_dim) {
  return fused_bf16_scores(head_dim) && attention_tiles(head_dim);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def("fused_bf16_scores(int head_dim) -> bool");
  m.def("fused_attention_tiles(int head_dim) -> bool");
  m.def(
      "int4_decoder_layer(Tensor x, Tensor positions, Tensor slot_mapping, Tensor context_slots, "
      "Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor input_norm, "
      "Tensor qkv_qweight, Tensor qkv_scales, Tensor qkv_row_scale, Tensor qkv_bias, "
      "Tensor q_norm, Tensor k_norm, int qkv_group, Tensor o_qweight, Tensor o_scales, Tensor o_row_scale, int o_group, "
      "Tensor post_norm, Tensor gate_up_qweight, Tensor gate_up_scales, "
      "Tensor gate_up_row_scale, int gate_up_group, Tensor down_qweight, Tensor down_scales, "
      "Tensor down_row_scale, int down_group, int num_heads, int num_kv_heads, float eps, "
      "int tiles=1) -> Tensor");
  m.def(
      "bf16_decoder_layer(Tensor x, Tensor positions, Tensor slot_mapping, Tensor context_slots, "
      "Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor input_norm, "
      "Tensor q_w, Tensor k_w, Tensor v_w, Tensor qkv_bias, Tensor q_norm, Tensor k_norm, "
      "Tensor o_w, Tensor post_norm, Tensor gate_w, Tensor up_w, Tensor down_w, "
      "int num_heads, int num_kv_heads, float eps) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CPU, m) {
  m.impl("int4_decoder_layer", TORCH_BOX(&int4_decoder_layer));
  m.impl("bf16_decoder_layer", TORCH_BOX(&bf16_decoder_layer));
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CompositeExplicitAutograd, m) {
  m.impl("fused_bf16_scores", TORCH_BOX(&fused_bf16_scores));
  m.impl("fused_attention_tiles", TORCH_BOX(&fused_attention_tiles));
}
