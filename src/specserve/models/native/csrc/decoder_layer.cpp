// One whole decoder layer in one call, for bf16 models whose projections run on the native
// int4 kernel (int4_gemv.cpp): RMSNorm, fused q/k/v projection (+ bias, + per-head q/k
// RMSNorm for Qwen3), RoPE, KV-cache write,
// attention, output projection, residual, RMSNorm, fused gate/up projection, SiLU * up, down
// projection, residual. Registered as torch.ops.specserve.int4_decoder_layer; the Python side
// is specserve/models/native/fused_layer.py.
//
// Why: a 1-token decode step of a 28-layer model dispatches ~1,900 small ATen ops (about
// 70 per layer) at a few microseconds each: 10-15 ms next to ~30 ms of weight reads. Here a
// layer is one dispatch, and its temporaries are reused buffers.
//
// Numerics follow the eager bf16 module (models/decoder.py) op by op: every value the eager
// path rounds to bf16 is rounded here too (norm output, weight product, projections, bias add,
// each RoPE product and sum, attention output, residual adds, SiLU and its product), and
// norms, softmax and attention accumulate in fp32. Summation orders differ from ATen's, so
// results agree to bf16 rounding, not bit for bit.
//
// Batch invariance: every row's arithmetic is fixed whatever the other rows are. Attention
// of a query at position p reduces over exactly the keys 0..p of its sequence (masked keys are
// skipped, not added as zeros), so a verified token gets the bits a decode step gives it, and
// the context length the caller pads to does not matter.
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
#include <vector>

#include "int4_gemv.h"

namespace {

using specserve_native::PackedWeight;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

#ifndef SPECSERVE_INT4_NO_ISA

// 16 bf16 values -> fp32 (exact).
inline __m512 load_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// fp32 -> 16 bf16 values, round to nearest even (as torch's conversion).
inline void store_bf16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

// The bf16 value nearest to v, as fp32: what an eager bf16 op hands to the next one.
inline __m512 round_bf16(__m512 v) {
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e^x in fp32: x = k ln2 + r, |r| <= ln2 / 2, e^r by the Cephes expf polynomial (~1 ulp),
// scaled by 2^k with vscalefps (which also gives 0 / inf past the fp32 range).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

// out = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))) per row, like RMSNorm.forward.
void rms_norm(const uint16_t* x, const uint16_t* w, uint16_t* out, int64_t M, int64_t H,
              float eps) {
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* xr = x + m * H;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < H; i += 16) {
      const __m512 v = load_bf16(xr + i);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(H) + eps);
    const __m512 s = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < H; i += 16) {
      const __m512 n = round_bf16(_mm512_mul_ps(load_bf16(xr + i), s));
      store_bf16(out + m * H + i, _mm512_mul_ps(load_bf16(w + i), n));
    }
  }
}

// y[i] = bf16(a[i] + b[i]) over n values (n a multiple of 16).
void add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16)
    store_bf16(y + i, _mm512_add_ps(load_bf16(a + i), load_bf16(b + i)));
}

// In place on one head of hd values: the "rotate half" RoPE of apply_rotary, every product
// and the sum rounded to bf16.
void rope_head(uint16_t* x, const uint16_t* cos, const uint16_t* sin, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t d = 0; d < half; d += 16) {
    const __m512 x1 = load_bf16(x + d), x2 = load_bf16(x + half + d);
    const __m512 lo = _mm512_add_ps(round_bf16(_mm512_mul_ps(x1, load_bf16(cos + d))),
                                    round_bf16(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), x2),
                                                             load_bf16(sin + d))));
    const __m512 hi = _mm512_add_ps(round_bf16(_mm512_mul_ps(x2, load_bf16(cos + half + d))),
                                    round_bf16(_mm512_mul_ps(x1, load_bf16(sin + half + d))));
    store_bf16(x + d, lo);
    store_bf16(x + half + d, hi);
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
};

// Query row m, the query heads of kv head h: softmax(q k^T * scale) v over keys 0..p.
void attend(const AttentionProblem& a, int64_t m, int64_t h) {
  const int64_t group = a.nh / a.nkv, hd = a.hd, chunks = hd / 16;
  const int64_t p = a.positions[m], n = p + 1;
  const int64_t* ctx = a.context_slots + (m / a.T) * a.S;
  const int64_t row_stride = (a.nh + 2 * a.nkv) * hd;
  // Per worker thread, reused across calls (no allocation per head and layer).
  thread_local std::vector<float> q, scores, acc;
  q.resize(static_cast<size_t>(group * hd));
  scores.resize(static_cast<size_t>(group * n));
  acc.assign(static_cast<size_t>(group * hd), 0.0f);
  for (int64_t g = 0; g < group; ++g) {
    const uint16_t* qr = a.qkv + m * row_stride + (h * group + g) * hd;
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_storeu_ps(&q[g * hd + c * 16], load_bf16(qr + c * 16));
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* kr = a.k_cache + (ctx[j] * a.nkv + h) * hd;
    for (int64_t g = 0; g < group; ++g) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c)
        s = _mm512_fmadd_ps(_mm512_loadu_ps(&q[g * hd + c * 16]), load_bf16(kr + c * 16), s);
      scores[g * n + j] = _mm512_reduce_add_ps(s) * a.scale;
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* sg = &scores[g * n];
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1u);
      mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, sg + j));
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1u);
      const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sg + j), top));
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
      _mm512_mask_storeu_ps(sg + j, k, e);
    }
    const __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1u);
      _mm512_mask_storeu_ps(sg + j, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, sg + j), total));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* vr = a.v_cache + (ctx[j] * a.nkv + h) * hd;
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512 v = load_bf16(vr + c * 16);
      for (int64_t g = 0; g < group; ++g) {
        float* o = &acc[g * hd + c * 16];
        const __m512 w = _mm512_set1_ps(scores[g * n + j]);
        _mm512_storeu_ps(o, _mm512_fmadd_ps(w, v, _mm512_loadu_ps(o)));
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    uint16_t* o = a.out + m * a.nh * hd + (h * group + g) * hd;
    for (int64_t c = 0; c < chunks; ++c)
      store_bf16(o + c * 16, _mm512_loadu_ps(&acc[g * hd + c * 16]));
  }
}

// gate_up [M, 2I] (gate columns first) -> out [M, I] = bf16(bf16(silu(gate)) * up).
void silu_mul(const uint16_t* gate_up, uint16_t* out, int64_t M, int64_t I) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* g = gate_up + m * 2 * I;
    for (int64_t i = 0; i < I; i += 16) {
      const __m512 x = load_bf16(g + i);
      const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
      const __m512 act = round_bf16(_mm512_div_ps(x, _mm512_add_ps(one, e)));
      store_bf16(out + m * I + i, _mm512_mul_ps(act, load_bf16(g + I + i)));
    }
  }
}

#endif  // SPECSERVE_INT4_NO_ISA

const uint16_t* bf16_data(const Tensor& t) {
  return static_cast<const uint16_t*>(t.const_data_ptr());
}

void check_bf16(const Tensor& t, int64_t numel, const char* name) {
  STD_TORCH_CHECK(t.is_cpu() && t.scalar_type() == ScalarType::BFloat16 && t.is_contiguous() &&
                      t.numel() == numel,
                  "int4_decoder_layer: ", name, " must be a contiguous CPU bf16 tensor of ",
                  numel, " values");
}

void check_index(const Tensor& t, int64_t numel, const char* name) {
  STD_TORCH_CHECK(t.is_cpu() && t.scalar_type() == ScalarType::Long && t.is_contiguous() &&
                      t.numel() == numel,
                  "int4_decoder_layer: ", name, " must be a contiguous CPU int64 tensor of ",
                  numel, " values");
}

// Buffers reused from call to call (one set per calling thread).
struct Scratch {
  std::vector<uint16_t> h, qkv, attn, o, x1, gate_up, act, down;
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
    int64_t num_heads, int64_t num_kv_heads, double eps) {
  STD_TORCH_CHECK(specserve_native::cpu_supported(),
                  "int4_decoder_layer: this CPU lacks AVX-512 BF16 / GFNI");
  STD_TORCH_CHECK(x.dim() == 2, "int4_decoder_layer: x must be [M, hidden]");
  const int64_t M = x.size(0), H = x.size(1);
  STD_TORCH_CHECK(context_slots.dim() == 2, "int4_decoder_layer: context_slots must be [B, S]");
  const int64_t B = context_slots.size(0), S = context_slots.size(1);
  STD_TORCH_CHECK(B > 0 && M % B == 0, "int4_decoder_layer: ", M, " rows are not B = ", B,
                  " sequences of equal length");
  const int64_t nh = num_heads, nkv = num_kv_heads;
  STD_TORCH_CHECK(nkv > 0 && nh > 0 && nh % nkv == 0,
                  "int4_decoder_layer: num_heads must be a multiple of num_kv_heads");
  STD_TORCH_CHECK(k_cache.dim() == 3 && k_cache.size(1) == nkv,
                  "int4_decoder_layer: k_cache must be [slots, num_kv_heads, head_dim]");
  const int64_t hd = k_cache.size(2), slots = k_cache.size(0);
  STD_TORCH_CHECK(hd % 32 == 0 && H % 16 == 0,
                  "int4_decoder_layer: head_dim must be a multiple of 32, hidden of 16");
  check_bf16(x, M * H, "x");
  check_bf16(k_cache, slots * nkv * hd, "k_cache");
  check_bf16(v_cache, slots * nkv * hd, "v_cache");
  check_bf16(cos, M * hd, "cos");
  check_bf16(sin, M * hd, "sin");
  check_bf16(input_norm, H, "input_norm");
  check_bf16(post_norm, H, "post_norm");
  check_index(positions, M, "positions");
  check_index(slot_mapping, M, "slot_mapping");
  check_index(context_slots, B * S, "context_slots");
  const int64_t n_qkv = (nh + 2 * nkv) * hd;
  const PackedWeight qkv = specserve_native::packed_weight(qkv_qweight, qkv_scales, qkv_row_scale,
                                                           n_qkv, qkv_group, "qkv_proj");
  const PackedWeight o = specserve_native::packed_weight(o_qweight, o_scales, o_row_scale, H,
                                                         o_group, "o_proj");
  const int64_t I = down_qweight.dim() == 3 ? down_qweight.size(1) * 8 : 0;
  const PackedWeight gu = specserve_native::packed_weight(
      gate_up_qweight, gate_up_scales, gate_up_row_scale, 2 * I, gate_up_group, "gate_up_proj");
  const PackedWeight down = specserve_native::packed_weight(down_qweight, down_scales,
                                                            down_row_scale, H, down_group,
                                                            "down_proj");
  STD_TORCH_CHECK(qkv.K == H && o.K == nh * hd && gu.K == H && I % 16 == 0,
                  "int4_decoder_layer: projection shapes do not fit hidden ", H, ", ", nh,
                  " heads of ", hd);
  const bool has_bias = qkv_bias.numel() > 0;
  if (has_bias) check_bf16(qkv_bias, n_qkv, "qkv_bias");
  const bool has_qk_norm = q_norm.numel() > 0;
  STD_TORCH_CHECK(has_qk_norm == (k_norm.numel() > 0),
                  "int4_decoder_layer: q_norm and k_norm come together");
  if (has_qk_norm) {
    check_bf16(q_norm, hd, "q_norm");
    check_bf16(k_norm, hd, "k_norm");
  }
  const auto* pos = static_cast<const int64_t*>(positions.const_data_ptr());
  const auto* slot = static_cast<const int64_t*>(slot_mapping.const_data_ptr());
  const auto* ctx = static_cast<const int64_t*>(context_slots.const_data_ptr());
  for (int64_t m = 0; m < M; ++m) {
    STD_TORCH_CHECK(pos[m] >= 0 && pos[m] < S, "int4_decoder_layer: position ", pos[m],
                    " outside the ", S, " context slots");
    STD_TORCH_CHECK(slot[m] >= 0 && slot[m] < slots, "int4_decoder_layer: slot ", slot[m],
                    " outside the cache");
  }
  for (int64_t i = 0; i < B * S; ++i)
    STD_TORCH_CHECK(ctx[i] >= 0 && ctx[i] < slots, "int4_decoder_layer: context slot ", ctx[i],
                    " outside the cache");

  Tensor out = specserve_native::empty_2d(M, H, false);
#ifndef SPECSERVE_INT4_NO_ISA
  thread_local Scratch s;
  s.h.resize(M * H);
  s.qkv.resize(M * n_qkv);
  s.attn.resize(M * nh * hd);
  s.o.resize(M * H);
  s.x1.resize(M * H);
  s.gate_up.resize(M * 2 * I);
  s.act.resize(M * I);
  s.down.resize(M * H);
  const float feps = static_cast<float>(eps);

  rms_norm(bf16_data(x), bf16_data(input_norm), s.h.data(), M, H, feps);
  specserve_native::int4_matmul(s.h.data(), M, qkv, s.qkv.data(), false);
  if (has_bias)
    for (int64_t m = 0; m < M; ++m)
      add_bf16(s.qkv.data() + m * n_qkv, bf16_data(qkv_bias), s.qkv.data() + m * n_qkv, n_qkv);
  auto* kc = static_cast<uint16_t*>(k_cache.mutable_data_ptr());
  auto* vc = static_cast<uint16_t*>(v_cache.mutable_data_ptr());
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* row = s.qkv.data() + m * n_qkv;
    if (has_qk_norm)  // per head, in place (rms_norm reads a value before writing it)
      for (int64_t head = 0; head < nh + nkv; ++head)
        rms_norm(row + head * hd, bf16_data(head < nh ? q_norm : k_norm), row + head * hd, 1,
                 hd, feps);
    for (int64_t head = 0; head < nh + nkv; ++head)  // q heads, then k heads
      rope_head(row + head * hd, bf16_data(cos) + m * hd, bf16_data(sin) + m * hd, hd);
    std::memcpy(kc + slot[m] * nkv * hd, row + nh * hd, nkv * hd * sizeof(uint16_t));
    std::memcpy(vc + slot[m] * nkv * hd, row + (nh + nkv) * hd, nkv * hd * sizeof(uint16_t));
  }
  AttentionProblem a{s.qkv.data(), kc, vc, pos, ctx, s.attn.data(), M / B, S, nh, nkv, hd,
                     static_cast<float>(std::pow(static_cast<double>(hd), -0.5))};
  torch::stable::parallel_for(0, M * nkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) attend(a, t / nkv, t % nkv);
  });
  specserve_native::int4_matmul(s.attn.data(), M, o, s.o.data(), false);
  add_bf16(bf16_data(x), s.o.data(), s.x1.data(), M * H);
  rms_norm(s.x1.data(), bf16_data(post_norm), s.h.data(), M, H, feps);
  specserve_native::int4_matmul(s.h.data(), M, gu, s.gate_up.data(), false);
  silu_mul(s.gate_up.data(), s.act.data(), M, I);
  specserve_native::int4_matmul(s.act.data(), M, down, s.down.data(), false);
  add_bf16(s.x1.data(), s.down.data(), static_cast<uint16_t*>(out.mutable_data_ptr()), M * H);
#endif
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def(
      "int4_decoder_layer(Tensor x, Tensor positions, Tensor slot_mapping, Tensor context_slots, "
      "Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor input_norm, "
      "Tensor qkv_qweight, Tensor qkv_scales, Tensor qkv_row_scale, Tensor qkv_bias, "
      "Tensor q_norm, Tensor k_norm, int qkv_group, Tensor o_qweight, Tensor o_scales, Tensor o_row_scale, int o_group, "
      "Tensor post_norm, Tensor gate_up_qweight, Tensor gate_up_scales, "
      "Tensor gate_up_row_scale, int gate_up_group, Tensor down_qweight, Tensor down_scales, "
      "Tensor down_row_scale, int down_group, int num_heads, int num_kv_heads, float eps) "
      "-> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CPU, m) {
  m.impl("int4_decoder_layer", TORCH_BOX(&int4_decoder_layer));
}
