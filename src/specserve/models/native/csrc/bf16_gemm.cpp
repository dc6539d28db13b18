// Batch-invariant bf16 GEMV/GEMM for decode and verify steps: y = x @ w.T (+ b) for bf16
// activations x [M, K] and bf16 weights w [N, K] in the model's own layout (no repacking, no
// second copy). Registered as torch.ops.specserve.bf16_gemm; the decoder layer op
// (decoder_layer.cpp) calls bf16_matmul directly.
//
// Why: at batch 1 a decode step is bound by reading the weights, and PyTorch's bf16 linear
// reads them at about 60 % of this machine's bandwidth for one row; for the 2 to 16 rows of a
// speculative verify it is several times slower than for one row (oneDNN's small-M path), so
// a verify cost far more than the step it replaces. Here one pass over the weights serves a
// block of up to 6 rows (5 on AVX2), and a verify of k + 1 rows costs little more than one
// decode step where the CPU has AVX-512 BF16 (1.2-1.4x one step at 5 rows on AVX2, whose
// multi-row calls are bound by their FMAs).
//
// One variant per build (-march=native picks it). Per output (m, n) the arithmetic of a
// variant is fixed, whatever M, the other rows or the thread split, so a row of a k + 1-row
// verify is bit-identical to the same row decoded alone. The kernels of a variant differ only
// in how many outputs they interleave.
//
// AVX2 + FMA + F16C:
//   acc = 0 (8 fp32 lanes)
//   for each chunk c of 16 inputs:            // w and x as fp32, exact
//     acc = fma(w_even[c], x_even[c], acc)    // lane j: inputs 16c + 2j
//     acc = fma(w_odd[c],  x_odd[c],  acc)    // lane j: inputs 16c + 2j + 1
//   y = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))  (+ bias[n])
//
// AVX-512 BF16 (vdpbf16ps: a bf16 pair's two products, each exact in fp32, added to an fp32
// lane one after the other; denormal inputs and results are flushed to zero):
//   acc = 0 (16 fp32 lanes)
//   for each chunk c of 32 inputs (a last chunk of 16 has zeros above):
//     acc = dpbf16(acc, w[c], x[c])           // lane j: inputs 32c + 2j, 32c + 2j + 1
//   h = acc[0..7] + acc[8..15]; y = ((h0 + h1) + (h2 + h3)) + ((h4 + h5) + (h6 + h7))  (+ bias)
// One instruction does the 32 multiply-adds the AVX2 kernel needs two conversions and two
// FMAs per 16 inputs for, so the multi-row (verify, prefill chunk) calls, which are compute
// bound on AVX2, run several times faster.
//   The same sums as FMA pairs: vdpbf16ps adds, per lane, the odd input's product and then
// the even input's, each step an fp32 FMA with denormal inputs read as 0, denormal results
// flushed and round to nearest even. Two vfmadd231ps (odd, then even inputs, shifted into
// fp32: exact) under MXCSR's DAZ and FTZ give every lane bit for bit the same value. Where
// the CPU runs two 512-bit FMAs in less time than one vdpbf16ps (Intel cores with AMX run
// vdpbf16ps at a fraction of their FMA rate), calls of 3 or more x rows, bound by
// those instructions, take the pairs (fma_pairs_on(): a one-off timing of both at first use,
// or SPECSERVE_BF16_FMA=0 / 1); calls of 1 or 2 rows, bound by memory, keep vdpbf16ps. Same
// bits either way, so the choice may differ by M and by host without breaking the batch
// invariance.
//
// AMX BF16 (where the build has AMX and the kernel grants the process its tile state; on
// unless SPECSERVE_BF16_AMX=0, read on every call): a tile of 16 weight rows x 32 inputs, read
// straight from the [N, K] weight with the row stride, is multiplied (tdpbf16ps) by a tile of
// the x rows' bf16 pairs (interleaved once per call, per block of up to 16 x rows: pair j of
// the block's row r at [j][r]) into 16 x (block rows) fp32 sums. Per output (n, m):
//   acc = 0
//   for each chunk c of 32 inputs, for each pair j = 0 .. 15 of it, in order:
//     acc += w[32c + 2j] * x[32c + 2j]; acc += w[32c + 2j + 1] * x[32c + 2j + 1]
//   (products exact in fp32, sums rounded to nearest even, denormals flushed: the
//   instruction's definition); y = acc (+ bias[n])
// A row's sums use its own weight row and x row only, whatever M or the other rows, so the
// variant keeps the batch invariance; its sums round differently from the AVX-512 kernel's
// (a different order), so a process uses one or the other for every call. Where the AVX-512
// kernel is bound by its vdpbf16ps throughput (several x rows, on CPUs that run few of them
// per cycle), the tile unit does a 16 x 32 x 16 product per instruction: a verify of k + 1
// rows costs what one row costs. Weights whose K is not a multiple of 32, and the last N mod 16
// rows, stay on the AVX-512 kernel (a choice by shape, never by M).
//
// All: out = bf16(y) (round to nearest even) or y.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "amx_tiles.h"
#include "bf16_gemm.h"
#include "int4_gemv.h"
#include "simd.h"

// The AVX-512 BF16 variant where -march=native provides it, else the AVX2 one.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define SPECSERVE_BF16_AVX512 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SPECSERVE_BF16_AMX 1
#endif
#endif

namespace {

using specserve_native::DenseWeight;

#ifdef SPECSERVE_BF16_AVX512
constexpr int64_t kChunk = 32;  // inputs per step: one 64-byte load of a weight row
#else
constexpr int64_t kChunk = 16;  // inputs per step: one 32-byte load of a weight row
#endif
constexpr int64_t kKMultiple = 16;  // K must be a multiple of this (both variants)
#ifdef SPECSERVE_BF16_AVX512
constexpr int64_t kMaxRows = 6;  // rows of x per register block (with 2 or 4 weight rows)
#else
// 2 weight rows x 5 x rows: 10 sums, 4 weight vectors and the 2 vectors of one x row fill the
// 16 registers; 6 rows leave no register for x, so every FMA would load its x operand.
constexpr int64_t kMaxRows = 5;
#endif
constexpr int64_t kTaskRows = 16;        // weight rows per unit of the thread split
constexpr int64_t kPrefetchBytes = 512;  // ahead in each weight row's stream
// Blocks of more weights than this prefetch each row's stream, never the next block (sweep).
// AVX-512 sweeps into L2, where a block of up to 256 KiB, the one being read and the x rows
// fit; AVX2 into L1, with 32 KiB blocks at most.
#ifdef SPECSERVE_BF16_AVX512
constexpr int64_t kSweepBytes = int64_t{256} << 10;
#else
constexpr int64_t kSweepBytes = int64_t{32} << 10;
#endif

struct Job {
  const uint16_t* w;     // [N, K]
  const void* x;         // [M, K]: AVX-512, x itself (bf16), or for the FMA pairs per chunk of
                         // 32 inputs its 16 odd then its 16 even inputs in fp32, rows
                         // padded to whole chunks (split_odd_even); AVX2, per chunk of 16
                         // inputs its 8 even then its 8 odd inputs in fp32 (split_pairs)
  const uint16_t* bias;  // [N] or null
  void* out;             // element (m, n) at out + m * ldo + n
  int64_t ldo, K, M;
  bool out_f32;
  int64_t n_end;  // end of this task's weight rows (the sweep stops there)
  bool sweep;     // prefetch the next weight rows in one sweep (sweep_prefetch())
};

// y of output (m, n) from its sum, plus the bias, stored as bf16 or fp32.
inline void store_output(const Job& j, int64_t m, int64_t n, float y) {
  if (j.bias != nullptr) y = y + specserve_native::bf16_to_float(j.bias[n]);
  const int64_t at = m * j.ldo + n;
  if (j.out_f32)
    static_cast<float*>(j.out)[at] = y;
  else
    static_cast<uint16_t*>(j.out)[at] = specserve_native::bf16_bits_scalar(y);
}

// Whether the block of NR weight rows from n0 against the x rows from m0 sweeps (prefetches
// the next block): the first row block only, with a next block in the task, of at most
// kSweepBytes of weights.
inline bool sweeps(const Job& j, int nr, int64_t n0, int64_t m0) {
  return j.sweep && m0 == 0 && n0 + 2 * nr <= j.n_end && nr * j.K * 2 <= kSweepBytes;
}

#ifdef SPECSERVE_BF16_AVX512

inline __m512i load_chunk(const uint16_t* p) { return _mm512_loadu_si512(p); }
// The last 16 inputs when K is an odd multiple of 16: zeros above (their products add 0).
inline __m512i load_half(const uint16_t* p) { return _mm512_maskz_loadu_epi16(0xFFFFu, p); }

template <int NR, int MR>
inline void dot_step(__m512 (&acc)[NR][MR], const uint16_t* const (&w)[NR], const uint16_t* x,
                     int64_t K, int64_t k, bool half, bool row_prefetch) {
  __m512i wv[NR];
  for (int r = 0; r < NR; ++r) {
    if (row_prefetch)
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
    wv[r] = half ? load_half(w[r] + k) : load_chunk(w[r] + k);
  }
  for (int m = 0; m < MR; ++m) {
    const __m512i xv = half ? load_half(x + m * K + k) : load_chunk(x + m * K + k);
    for (int r = 0; r < NR; ++r)
      acc[r][m] = _mm512_dpbf16_ps(acc[r][m], (__m512bh)wv[r], (__m512bh)xv);
  }
}

// The fixed-order sum of 16 lanes: halves added lane by lane, then the 8-lane order.
inline float reduce_add16(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return specserve_native::reduce_add(_mm256_add_ps(lo, hi));
}

// Weight rows [n0, n0 + NR) against the MR rows of x from m0. Prefetch as in the AVX2
// variant below: with the sweep on, the first row block prefetches the next block's rows in
// address order, NR lines (what it reads itself) per step; otherwise each row's own stream
// 512 bytes ahead. The sweep's lines go to L2, not L1: the block being read, the next one
// and the x rows overflow L1 from 2 x rows on at 1536 inputs; with the lines in L1 an 8-token
// verify of the 1.5B cost 2.2x a decode step, in L2 1.43x (docs/benchmarks.md).
template <int NR, int MR>
void run_block(const Job& j, int64_t n0, int64_t m0) {
  const int64_t K = j.K;
  const uint16_t* w[NR];
  for (int r = 0; r < NR; ++r) w[r] = j.w + (n0 + r) * K;
  const uint16_t* x = static_cast<const uint16_t*>(j.x) + m0 * K;
  const bool sweep = sweeps(j, NR, n0, m0);
  const char* next = reinterpret_cast<const char*>(j.w + (n0 + NR) * K);
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kChunk <= K; k += kChunk) {
    if (sweep) {
      for (int q = 0; q < NR; ++q) _mm_prefetch(next + 64 * q, _MM_HINT_T1);
      next += NR * 64;
    }
    dot_step<NR, MR>(acc, w, x, K, k, false, !sweep);
  }
  if (k < K) dot_step<NR, MR>(acc, w, x, K, k, true, !sweep);
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) store_output(j, m0 + m, n0 + r, reduce_add16(acc[r][m]));
}

// The FMA pairs (see the file's header): x rows (bf16) -> per chunk of 32 inputs its 16 odd
// then its 16 even inputs in fp32, each row padded with zeros to whole chunks (a last chunk of
// 16 inputs has zeros above, as load_half gives vdpbf16ps).
inline int64_t padded_k(int64_t K) { return (K + kChunk - 1) / kChunk * kChunk; }

void split_odd_even(const uint16_t* x, float* xs, int64_t M, int64_t K) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t kp = padded_k(K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < kp; k += kChunk) {
      const uint16_t* p = x + m * K + k;
      const __m512i v = k + kChunk <= K ? load_chunk(p) : load_half(p);
      float* o = xs + m * kp + k;
      _mm512_storeu_ps(o, _mm512_castsi512_ps(_mm512_and_si512(v, high)));
      _mm512_storeu_ps(o + 16, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

// One chunk of 32 inputs of the FMA pairs: per sum, the odd inputs' FMA, then the even ones'.
// Each x vector is loaded once for its NR FMAs (the empty asm keeps the compiler from folding
// the load into every FMA, as in the AVX2 kernel).
template <int NR, int MR>
inline void fma_step(__m512 (&acc)[NR][MR], const uint16_t* const (&w)[NR], const float* x,
                     int64_t kp, int64_t k, bool half, bool row_prefetch) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 wo[NR], we[NR];
  for (int r = 0; r < NR; ++r) {
    if (row_prefetch)
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
    const __m512i v = half ? load_half(w[r] + k) : load_chunk(w[r] + k);
    wo[r] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    we[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  for (int m = 0; m < MR; ++m) {
    __m512 xo = _mm512_loadu_ps(x + m * kp + k);
    __asm__("" : "+v"(xo));
    for (int r = 0; r < NR; ++r) acc[r][m] = _mm512_fmadd_ps(wo[r], xo, acc[r][m]);
    __m512 xe = _mm512_loadu_ps(x + m * kp + k + 16);
    __asm__("" : "+v"(xe));
    for (int r = 0; r < NR; ++r) acc[r][m] = _mm512_fmadd_ps(we[r], xe, acc[r][m]);
  }
}

// Lines of the next weights a block of FMA pairs prefetches into L2 (the sweep): from `line`,
// `lines` of them, spread evenly over the block's steps. None where lines is 0.
struct SweepShare {
  const char* line;
  int64_t lines;
};

// MXCSR's DAZ and FTZ for a scope (the thread's own mode restored at its end).
class FmaMode {
 public:
  FmaMode() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kDazFtz); }
  ~FmaMode() { _mm_setcsr(saved_); }
  FmaMode(const FmaMode&) = delete;
  FmaMode& operator=(const FmaMode&) = delete;

 private:
  static constexpr unsigned kDazFtz = 0x8040;
  unsigned saved_;
};

// The 16 lane sums of output (n, m) of a group of weight rows from g (run_range_fma), kept
// until the group's blocks are done: they are summed to one value outside DAZ and FTZ, as the
// vdpbf16ps kernel sums them (under FTZ a sum of lanes falling below 2^-126 would be
// flushed, there it is not). Setting MXCSR once per group, not per block, keeps its cost
// off the blocks (a block's own setting cost the pairs their gain over vdpbf16ps).
struct LaneSums {
  float* data;  // [n - g][m][16]
  int64_t M;
  float* at(int64_t n, int64_t m) const { return data + (n * M + m) * 16; }
};

// run_block's sums as FMA pairs: weight rows [n0, n0 + NR) against the MR rows of the split
// x from m0, under DAZ and FTZ (the caller's FmaMode), their lane sums into `sums` (rows
// counted from the group's first); prefetching its share of the next weights
// (run_range_fma) or, with no share and the sweep off, each row's own stream 512 bytes ahead.
template <int NR, int MR>
void run_block_fma(const Job& j, int64_t n0, int64_t m0, SweepShare sweep, LaneSums sums,
                   int64_t g) {
  const int64_t K = j.K, kp = padded_k(K), steps = K / kChunk;
  const uint16_t* w[NR];
  for (int r = 0; r < NR; ++r) w[r] = j.w + (n0 + r) * K;
  const float* x = static_cast<const float*>(j.x) + m0 * kp;
  const bool row_prefetch = !j.sweep;
  int64_t due = 0;  // lines x steps done so far, less steps x lines issued
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kChunk <= K; k += kChunk) {
    for (due += sweep.lines; due >= steps; due -= steps, sweep.line += 64)
      _mm_prefetch(sweep.line, _MM_HINT_T1);
    fma_step<NR, MR>(acc, w, x, kp, k, false, row_prefetch);
  }
  if (k < K) fma_step<NR, MR>(acc, w, x, kp, k, true, row_prefetch);
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) _mm512_storeu_ps(sums.at(n0 - g + r, m0 + m), acc[r][m]);
}

constexpr int64_t kFmaRows = 5;        // x rows per block at most (with 4 weight rows)
constexpr int64_t kFmaFromRows = 3;    // calls of fewer x rows keep vdpbf16ps (no faster)
constexpr int64_t kFmaGroupRows = 16;  // weight rows per group at most (run_range_fma)

template <int NR>
void fma_rows(const Job& j, int64_t n0, int64_t m0, int64_t rows, SweepShare sweep,
              LaneSums sums, int64_t g) {
  switch (rows) {
    case 1: run_block_fma<NR, 1>(j, n0, m0, sweep, sums, g); break;
    case 2: run_block_fma<NR, 2>(j, n0, m0, sweep, sums, g); break;
    case 3: run_block_fma<NR, 3>(j, n0, m0, sweep, sums, g); break;
    case 4: run_block_fma<NR, 4>(j, n0, m0, sweep, sums, g); break;
    default: run_block_fma<NR, 5>(j, n0, m0, sweep, sums, g); break;
  }
}

// Outputs of weight rows [g, g_end), all x rows, from their lane sums (outside DAZ and FTZ).
void store_group(const Job& j, LaneSums sums, int64_t g, int64_t g_end) {
  for (int64_t n = g; n < g_end; ++n)
    for (int64_t m = 0; m < j.M; ++m)
      store_output(j, m, n, reduce_add16(_mm512_loadu_ps(sums.at(n - g, m))));
}

// Weight rows [begin, end), all rows of x, as FMA pairs: blocks of 4 weight rows against
// balanced blocks of up to 5 x rows (registers, 32: 20 sums, 8 weight vectors, the two of
// one x row and the mask; blocks of 3 x 6, 3 x 7 and 2 x 8 were slower for 6-8 x rows, and
// 3 weight rows against up to 7 x rows slower at 4-5 rows on the down projection). The
// weight rows go in groups of up to 16 (at most 256 KiB), and each x block passes over a whole
// group before the next x block: its split rows (up to 5 x 6 KiB at K = 1536) stay in L1 while the
// group's weights come from L2, where the other order read each x block from L2 once per
// 4 weight rows, twice the bytes. With the sweep on, every block of a group prefetches its
// share of the next group's lines, so that the next weights arrive while all the x blocks
// compute (with only the first x block prefetching, a 16-row call waited on memory in its
// first pass and left the memory idle in the others). The last weight rows one by one.
void run_range_fma(const Job& j, int64_t begin, int64_t end) {
  const int64_t M = j.M, K = j.K, blocks = specserve_native::num_row_blocks(M, kFmaRows);
  const auto start = [&](int64_t i) { return specserve_native::row_block_start(M, kFmaRows, i); };
  const int64_t fit = std::max<int64_t>(1, kSweepBytes / (4 * K * 2)) * 4;
  const int64_t group = std::min(kFmaGroupRows, fit), whole = begin + (end - begin) / 4 * 4;
  thread_local std::vector<float> lane_sums;  // per worker thread, reused
  lane_sums.resize(static_cast<size_t>(group * M * 16));  // the last rows (< 4) fit too
  const LaneSums sums{lane_sums.data(), M};
  for (int64_t g = begin; g < whole; g += group) {
    const int64_t g_end = std::min(g + group, whole), next_end = std::min(g_end + group, whole);
    const int64_t passes = blocks * ((g_end - g) / 4);
    const int64_t lines = j.sweep ? ((next_end - g_end) * K * 2 + 63) / 64 : 0;
    const char* next = reinterpret_cast<const char*>(j.w + g_end * K);
    {
      const FmaMode mode;
      int64_t pass = 0;
      for (int64_t i = 0; i < blocks; ++i)
        for (int64_t n = g; n < g_end; n += 4, ++pass) {
          const int64_t first = lines * pass / passes;
          const int64_t share = lines * (pass + 1) / passes - first;
          fma_rows<4>(j, n, start(i), start(i + 1) - start(i), {next + 64 * first, share}, sums, g);
        }
    }
    store_group(j, sums, g, g_end);
  }
  if (whole == end) return;
  {
    const FmaMode mode;
    for (int64_t n = whole; n < end; ++n)
      for (int64_t i = 0; i < blocks; ++i)
        fma_rows<1>(j, n, start(i), start(i + 1) - start(i), {nullptr, 0}, sums, whole);
  }
  store_group(j, sums, whole, end);
}

// Whether two 512-bit FMAs, with the pairs' share of shifts (about a fifth more), take less
// time than one vdpbf16ps on this CPU: each timed on 24 independent chains in registers,
// best of 7 (a few hundred microseconds, once per process).
bool fma_pairs_faster() {
  static const bool faster = [] {
    const auto best = [](auto&& body) {
      double t = 1e30;
      for (int rep = 0; rep < 7; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        body();
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
        t = std::min(t, took.count());
      }
      return t;
    };
    constexpr int kChains = 24, kIters = 2000;
    volatile float sink = 0;
    const double dp = best([&] {
      __m512 a[kChains];
      for (auto& v : a) v = _mm512_setzero_ps();
      __m512i w = _mm512_set1_epi16(0x3f80);
      const __m512i x = _mm512_set1_epi16(0x3f00);
      for (int i = 0; i < kIters; ++i) {
#pragma GCC unroll 24  // the chains in registers (a loop over memory would time its stores)
        for (auto& v : a) v = _mm512_dpbf16_ps(v, (__m512bh)w, (__m512bh)x);
        __asm__ volatile("" : "+v"(w));
      }
      for (auto& v : a) sink = sink + _mm512_reduce_add_ps(v);
    });
    const double fma = best([&] {
      __m512 a[kChains];
      for (auto& v : a) v = _mm512_setzero_ps();
      __m512 w = _mm512_set1_ps(1.0f);
      const __m512 x = _mm512_set1_ps(0.5f);
      for (int i = 0; i < kIters; ++i) {
#pragma GCC unroll 24
        for (auto& v : a) v = _mm512_fmadd_ps(w, x, v);
#pragma GCC unroll 24
        for (auto& v : a) v = _mm512_fmadd_ps(x, w, v);
        __asm__ volatile("" : "+v"(w));
      }
      for (auto& v : a) sink = sink + _mm512_reduce_add_ps(v);
    });
    return fma * 1.2 < dp;
  }();
  return faster;
}

// Whether calls of kFmaFromRows or more x rows take the FMA pairs: SPECSERVE_BF16_FMA=1 / 0,
// else fma_pairs_faster() (read on every call; the bits are the same either way).
bool fma_pairs_on() {
  if (specserve_native::switch_set("SPECSERVE_BF16_FMA")) return true;
  if (!specserve_native::switch_on("SPECSERVE_BF16_FMA")) return false;
  return fma_pairs_faster();
}

#ifdef SPECSERVE_BF16_AMX

constexpr int64_t kAmxK = 32;     // inputs per tile step (a 64-byte weight tile row)
constexpr int64_t kAmxRows = 16;  // weight rows per tile; x rows per tile at most

bool amx_on() {
  return specserve_native::switch_on("SPECSERVE_BF16_AMX") && specserve_native::amx_permitted();
}

// The tiles of amx_grid: 0-3 the sums (16 x mr fp32) of weight block w (of NW, 16 rows each)
// against x block b (of NX) at 2 * w + b, 4-5 the weight blocks' 16 x 32 inputs, 6-7 the x
// blocks' pairs (16 pairs x mr[b] rows).
void load_grid_config(const int64_t (&mr)[2]) {
  specserve_native::TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = kAmxRows;
    c.colsb[t] = t == 4 || t == 5 ? 64 : static_cast<uint16_t>(mr[(t < 4 ? t : t - 6) & 1] * 4);
  }
  _tile_loadconfig(&c);
}

// Weight rows [n0, n0 + 16 NW) against the x row blocks from m0[b] (mr[b] rows, whose pairs
// x[b] holds interleaved, specserve_native::interleave_pairs: pair p of row r at p * mr + r).
// Each output's sums are the same whatever shares the call: tdpbf16ps over the inputs in order
// into a zeroed tile. With NW or NX = 2 a weight tile serves two x blocks and an x tile two
// weight blocks, and the grid's chains keep the tile unit busy where one chain waits on its
// last product.
template <int NW, int NX>
void amx_grid(const Job& j, const uint32_t* const (&x)[2], int64_t n0, const int64_t (&m0)[2],
              const int64_t (&mr)[2]) {
  const int64_t K = j.K;
  const uint16_t* w = j.w + n0 * K;
  _tile_zero(0);
  if constexpr (NX == 2) _tile_zero(1);
  if constexpr (NW == 2) _tile_zero(2);
  if constexpr (NW == 2 && NX == 2) _tile_zero(3);
  for (int64_t k = 0; k < K; k += kAmxK) {
    for (int64_t r = 0; r < NW * kAmxRows; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k) + kPrefetchBytes, _MM_HINT_T0);
    _tile_loadd(4, w + k, K * 2);
    if constexpr (NW == 2) _tile_loadd(5, w + kAmxRows * K + k, K * 2);
    _tile_loadd(6, x[0] + (k / 2) * mr[0], mr[0] * 4);
    if constexpr (NX == 2) _tile_loadd(7, x[1] + (k / 2) * mr[1], mr[1] * 4);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NX == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (NW == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (NW == 2 && NX == 2) _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float sums[4][kAmxRows][kAmxRows];
  _tile_stored(0, sums[0], 64);
  if constexpr (NX == 2) _tile_stored(1, sums[1], 64);
  if constexpr (NW == 2) _tile_stored(2, sums[2], 64);
  if constexpr (NW == 2 && NX == 2) _tile_stored(3, sums[3], 64);
  for (int wb = 0; wb < NW; ++wb)
    for (int b = 0; b < NX; ++b)
      for (int64_t r = 0; r < kAmxRows; ++r)
        for (int64_t m = 0; m < mr[b]; ++m)
          store_output(j, m0[b] + m, n0 + wb * kAmxRows + r, sums[2 * wb + b][r][m]);
}

void run_range(const Job& j, int64_t begin, int64_t end);

// Weight rows [begin, end) on the tiles, x in row blocks of up to 16 rows (xi: all blocks'
// interleaved pairs); the last (end - begin) mod 16 rows on the AVX-512 kernel. One x block
// (decode, verify): one block of 16 weight rows at a time, 16 weight streams (two blocks' 32
// streams read more slowly at one x row, measured). Several (a prompt's chunk): pairs of
// weight blocks, each pair against every x block two at a time while it sits in L2, so the
// weights are read from memory once per call, not once per x block.
void run_range_amx(const Job& j, const uint32_t* xi, int64_t begin, int64_t end) {
  const int64_t whole = begin + (end - begin) / kAmxRows * kAmxRows;
  const int64_t blocks = specserve_native::num_row_blocks(j.M, kAmxRows);
  const auto start = [&](int64_t i) { return specserve_native::row_block_start(j.M, kAmxRows, i); };
  if (blocks == 1) {
    const int64_t m0[2] = {0, 0}, mr[2] = {j.M, j.M};
    const uint32_t* const x[2] = {xi, xi};
    load_grid_config(mr);
    for (int64_t n = begin; n < whole; n += kAmxRows) amx_grid<1, 1>(j, x, n, m0, mr);
  } else {
    int64_t configured[2] = {0, 0};
    for (int64_t n = begin; n < whole; n += 2 * kAmxRows) {
      const bool two_w = whole - n >= 2 * kAmxRows;
      for (int64_t i = 0; i < blocks; i += 2) {
        const bool two_x = i + 1 < blocks;
        const int64_t m0[2] = {start(i), two_x ? start(i + 1) : start(i)};
        const int64_t mr[2] = {start(i + 1) - m0[0],
                               two_x ? start(i + 2) - m0[1] : start(i + 1) - m0[0]};
        if (mr[0] != configured[0] || mr[1] != configured[1]) {
          load_grid_config(mr);
          configured[0] = mr[0];
          configured[1] = mr[1];
        }
        const uint32_t* const x[2] = {xi + m0[0] * (j.K / 2), xi + m0[1] * (j.K / 2)};
        if (two_w && two_x) amx_grid<2, 2>(j, x, n, m0, mr);
        else if (two_w) amx_grid<2, 1>(j, x, n, m0, mr);
        else if (two_x) amx_grid<1, 2>(j, x, n, m0, mr);
        else amx_grid<1, 1>(j, x, n, m0, mr);
      }
    }
  }
  _tile_release();
  if (whole < end) run_range(j, whole, end);
}

#endif  // SPECSERVE_BF16_AMX

#else  // AVX2

// x rows (bf16) -> the even/odd split fp32 layout of Job::x.
void split_pairs(const uint16_t* x, float* xd, int64_t M, int64_t K) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t i = 0; i < M * K; i += kChunk) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm256_storeu_ps(xd + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    _mm256_storeu_ps(xd + i + 8, _mm256_castsi256_ps(_mm256_and_si256(v, high)));
  }
}

// Weight rows [n0, n0 + NR) against the MR rows of x from m0.
//
// Prefetch: the block's NR rows are one contiguous stretch of NR * K weights, and so are the
// next NR rows. With the sweep on (and a next block in the task), the first row block
// prefetches the next block's rows, one line for every 64 bytes it reads itself, so the reads
// of the next block are in flight for as long as this one computes, in address order; several
// x rows make a block compute for longer than the 512 bytes ahead of each row's own stream
// take to arrive from memory. Otherwise, and for blocks of more than 32 KiB (the sweep would
// run a whole L1 ahead: the down projection's rows of 8960 inputs read more slowly with it
// in trials), each row's own stream is prefetched 512 bytes ahead. Only when lines are
// requested changes, never the arithmetic.
template <int NR, int MR>
void run_block(const Job& j, int64_t n0, int64_t m0) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t K = j.K;
  const uint16_t* w[NR];
  for (int r = 0; r < NR; ++r) w[r] = j.w + (n0 + r) * K;
  const float* x = static_cast<const float*>(j.x) + m0 * K;
  const bool sweep = sweeps(j, NR, n0, m0);
  const char* next = reinterpret_cast<const char*>(j.w + (n0 + NR) * K);
  constexpr int kLinesPerStep = (NR * kChunk * 2 + 63) / 64;
  __m256 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += kChunk) {
    if (sweep) {
      for (int q = 0; q < kLinesPerStep; ++q) _mm_prefetch(next + 64 * q, _MM_HINT_T0);
      next += NR * kChunk * 2;
    }
    if constexpr (MR == 1) {  // one x row: its two vectors stay in registers
      const __m256 xe = _mm256_loadu_ps(x + k), xo = _mm256_loadu_ps(x + k + 8);
      for (int r = 0; r < NR; ++r) {
        if (!sweep)
          _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
        acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), xe, acc[r][0]);
        acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), xo, acc[r][0]);
      }
    } else {  // the weight vectors stay in registers, each x vector is loaded once
      __m256 we[NR], wo[NR];
      for (int r = 0; r < NR; ++r) {
        if (!sweep)
          _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + kPrefetchBytes, _MM_HINT_T0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
        we[r] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        wo[r] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      }
      // Each x vector is loaded once into a register for its NR FMAs. Left to itself the
      // compiler folds the load into every FMA (NR loads of the same vector), and the loads,
      // not the FMAs, then bound the loop (docs/benchmarks.md: with the sweep below off, a
      // 5-token step costs 1.59x a 1-token step, against 1.70-1.84x before this change). The
      // empty asm only pins the value in a register; it emits nothing.
      for (int m = 0; m < MR; ++m) {
        __m256 xe = _mm256_loadu_ps(x + m * K + k);
        __asm__("" : "+x"(xe));
        for (int r = 0; r < NR; ++r) acc[r][m] = _mm256_fmadd_ps(we[r], xe, acc[r][m]);
        __m256 xo = _mm256_loadu_ps(x + m * K + k + 8);
        __asm__("" : "+x"(xo));
        for (int r = 0; r < NR; ++r) acc[r][m] = _mm256_fmadd_ps(wo[r], xo, acc[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m)
      store_output(j, m0 + m, n0 + r, specserve_native::reduce_add(acc[r][m]));
}

#endif  // SPECSERVE_BF16_AVX512

template <int NR>
void run_rows(const Job& j, int64_t n0, int64_t m0, int64_t rows) {
  switch (rows) {
    case 1: run_block<NR, 1>(j, n0, m0); break;
    case 2: run_block<NR, 2>(j, n0, m0); break;
    case 3: run_block<NR, 3>(j, n0, m0); break;
    case 4: run_block<NR, 4>(j, n0, m0); break;
    case 5: run_block<NR, 5>(j, n0, m0); break;
    default: run_block<NR, static_cast<int>(kMaxRows)>(j, n0, m0); break;
  }
}

// Row blocks of at most kMaxRows rows, balanced; block i starts at row block_start(M, i).
inline int64_t num_row_blocks(int64_t M) { return (M + kMaxRows - 1) / kMaxRows; }
inline int64_t block_start(int64_t M, int64_t i) {
  const int64_t n = num_row_blocks(M), base = M / n, extra = M % n;
  return i * base + std::min(i, extra);
}

// Weight rows [n, n + NR) against every row block of x.
template <int NR>
void run_row_blocks(const Job& j, int64_t n) {
  for (int64_t i = 0; i < num_row_blocks(j.M); ++i) {
    const int64_t m0 = block_start(j.M, i);
    run_rows<NR>(j, n, m0, block_start(j.M, i + 1) - m0);
  }
}

// Weight rows [begin, end), all rows of x: several weight rows at a time when x has few rows
// (independent FMA chains to cover the latency), else 2 weight rows per row block (4 on
// AVX-512, with its 32 registers; 3 against all rows at once for 7 and 8 rows). On AVX2, 2
// and 3 x rows take 3 weight rows (9 sums, 6 weight vectors and one x vector fit the 16
// registers; 4 did not).
void run_range(const Job& j, int64_t begin, int64_t end) {
  int64_t n = begin;
  if (j.M == 1) {
    for (; n + 8 <= end; n += 8) run_block<8, 1>(j, n, 0);
#ifdef SPECSERVE_BF16_AVX512
  } else if (j.M == 2) {
    for (; n + 4 <= end; n += 4) run_block<4, 2>(j, n, 0);
  } else if (j.M == 3) {
    for (; n + 4 <= end; n += 4) run_block<4, 3>(j, n, 0);
#else
  } else if (j.M == 2) {
    for (; n + 3 <= end; n += 3) run_block<3, 2>(j, n, 0);
  } else if (j.M == 3) {
    for (; n + 3 <= end; n += 3) run_block<3, 3>(j, n, 0);
#endif
  } else {
#ifdef SPECSERVE_BF16_AVX512
    // 7 or 8 x rows in one block of 3 weight rows (24 sums, 3 weight vectors and one x vector
    // of the 32 registers): the weights are read once, not once per block of 4 x rows.
    if (j.M == 7)
      for (; n + 3 <= end; n += 3) run_block<3, 7>(j, n, 0);
    else if (j.M == 8)
      for (; n + 3 <= end; n += 3) run_block<3, 8>(j, n, 0);
    for (; n + 4 <= end; n += 4) run_row_blocks<4>(j, n);
#endif
    for (; n + 2 <= end; n += 2) run_row_blocks<2>(j, n);
  }
  for (; n < end; ++n) run_row_blocks<1>(j, n);
}

}  // namespace

namespace specserve_native {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

#ifdef SPECSERVE_BF16_AVX512
const char* const kBf16Variant = "AVX-512 BF16";
bool bf16_cpu_supported() {
  __builtin_cpu_init();
  return avx2_supported() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
}
#else
const char* const kBf16Variant = "AVX2 / FMA / F16C";
bool bf16_cpu_supported() { return avx2_supported(); }
#endif

DenseWeight dense_weight(const Tensor& w, const char* what) {
  STD_TORCH_CHECK(w.is_cpu() && w.scalar_type() == ScalarType::BFloat16 && w.dim() == 2 &&
                      w.is_contiguous(),
                  what, ": the weight must be a contiguous CPU bf16 tensor [N, K]");
  STD_TORCH_CHECK(w.size(1) % kKMultiple == 0, what, ": K = ", w.size(1),
                  " is not a multiple of 16");
  return DenseWeight{static_cast<const uint16_t*>(w.const_data_ptr()), w.size(0), w.size(1)};
}

void bf16_matmul_many(const uint16_t* x, int64_t M, const DenseMatmul* parts, int count,
                      int64_t ldo, bool out_f32) {
  if (M == 0 || count == 0) return;
  const int64_t K = parts[0].w.K;
  for (int i = 0; i < count; ++i)
    STD_TORCH_CHECK(parts[i].w.K == K, "bf16_matmul_many: weights of different widths");
#ifdef SPECSERVE_BF16_AVX512
  const void* xp = x;  // vdpbf16ps takes the bf16 pairs as they are
  bool amx = false;
#ifdef SPECSERVE_BF16_AMX
  // The tiles take each row block's pairs interleaved; per calling thread, reused.
  amx = K % kAmxK == 0 && amx_on();
  thread_local std::vector<uint32_t> xi;
  if (amx) {
    xi.resize(static_cast<size_t>(M * K / 2));
    specserve_native::interleave_pairs(reinterpret_cast<const uint32_t*>(x), xi.data(), M,
                                       K / 2, kAmxRows);
  }
  const uint32_t* xip = xi.data();  // the worker threads have thread_locals of their own
#endif
  // The FMA pairs: x split once per call (per calling thread, reused).
  const bool fma = !amx && M >= kFmaFromRows && fma_pairs_on();
  thread_local std::vector<float> xs;
  if (fma) {
    xs.resize(static_cast<size_t>(M * padded_k(K)));
    split_odd_even(x, xs.data(), M, K);
    xp = xs.data();
  }
#else
  // Per calling thread, reused: the split inputs are small (M x K fp32).
  thread_local std::vector<float> xd;
  xd.resize(static_cast<size_t>(M * K));
  split_pairs(x, xd.data(), M, K);
  const void* xp = xd.data();  // the worker threads have thread_locals of their own
#endif
  const bool sweep = specserve_native::sweep_prefetch();  // read once per call
  // Units of kTaskRows weight rows, numbered across the parts in order; a task holds at
  // least 128 KiB / (M + 1) of weights, so small matrices stay on one thread.
  std::vector<int64_t> first_unit(count + 1, 0);
  for (int i = 0; i < count; ++i)
    first_unit[i + 1] = first_unit[i] + (parts[i].w.N + kTaskRows - 1) / kTaskRows;
  const int64_t unit_bytes = kTaskRows * K * 2;
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{128} << 10) / (unit_bytes * std::min<int64_t>(M + 1, 16)));
  torch::stable::parallel_for(0, first_unit[count], grain, [&](int64_t b, int64_t e) {
    for (int i = 0; i < count; ++i) {
      const int64_t lo = std::max(b, first_unit[i]), hi = std::min(e, first_unit[i + 1]);
      if (lo >= hi) continue;
      const DenseMatmul& p = parts[i];
      const int64_t u0 = lo - first_unit[i], u1 = hi - first_unit[i];
      const int64_t begin = u0 * kTaskRows, end = std::min(p.w.N, u1 * kTaskRows);
      const Job job{p.w.data, xp, p.bias, p.out, ldo, K, M, out_f32, end, sweep};
#ifdef SPECSERVE_BF16_AMX
      if (amx) {
        run_range_amx(job, xip, begin, end);
        continue;
      }
#endif
#ifdef SPECSERVE_BF16_AVX512
      if (fma) {
        run_range_fma(job, begin, end);
        continue;
      }
#endif
      run_range(job, begin, end);
    }
  });
}

void bf16_matmul(const uint16_t* x, int64_t M, const DenseWeight& w, const uint16_t* bias,
                 void* out, int64_t ldo, bool out_f32) {
  const DenseMatmul part{w, bias, out};
  bf16_matmul_many(x, M, &part, 1, ldo, out_f32);
}

}  // namespace specserve_native

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Tensor bf16_gemm(const Tensor& x_in, const Tensor& weight, const Tensor& bias) {
  STD_TORCH_CHECK(specserve_native::bf16_cpu_supported(), "bf16_gemm: this CPU lacks ",
                  specserve_native::kBf16Variant);
  STD_TORCH_CHECK(x_in.is_cpu() && x_in.dim() == 2, "bf16_gemm: x must be a CPU tensor [M, K]");
  const ScalarType xt = x_in.scalar_type();
  STD_TORCH_CHECK(xt == ScalarType::BFloat16 || xt == ScalarType::Float,
                  "bf16_gemm: x must be bf16 or fp32");
  const DenseWeight w = specserve_native::dense_weight(weight, "bf16_gemm");
  STD_TORCH_CHECK(x_in.size(1) == w.K, "bf16_gemm: x has ", x_in.size(1), " inputs, weight ",
                  w.K);
  const uint16_t* b = nullptr;
  if (bias.numel() > 0) {
    STD_TORCH_CHECK(bias.is_cpu() && bias.scalar_type() == ScalarType::BFloat16 &&
                        bias.is_contiguous() && bias.numel() == w.N,
                    "bf16_gemm: bias must be a contiguous CPU bf16 tensor of ", w.N, " values");
    b = static_cast<const uint16_t*>(bias.const_data_ptr());
  }
  Tensor x = xt == ScalarType::BFloat16 ? x_in : torch::stable::to(x_in, ScalarType::BFloat16);
  if (!x.is_contiguous()) x = torch::stable::contiguous(x);
  const bool f32 = xt == ScalarType::Float;
  Tensor out = specserve_native::empty_2d(x.size(0), w.N, f32);
  specserve_native::bf16_matmul(static_cast<const uint16_t*>(x.const_data_ptr()), x.size(0), w,
                                b, out.mutable_data_ptr(), w.N, f32);
  return out;
}

// Whether bf16 matmuls of 3 or more x rows on the AVX-512 BF16 kernel take the FMA pairs now
// (fma_pairs_on(); false on AVX2 builds).
bool bf16_fma_pairs() {
#ifdef SPECSERVE_BF16_AVX512
  return fma_pairs_on();
#else
  return false;
#endif
}

// Which kernel a bf16 matmul with K a multiple of 32 runs on now: 2 AMX tiles, 1 AVX-512
// BF16, 0 AVX2 (the AMX switch is read on every call, as bf16_matmul reads it).
int64_t bf16_kernel_variant() {
#ifdef SPECSERVE_BF16_AMX
  if (amx_on()) return 2;
#endif
#ifdef SPECSERVE_BF16_AVX512
  return 1;
#else
  return 0;
#endif
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(specserve, m) {
  m.def("bf16_gemm(Tensor x, Tensor weight, Tensor bias) -> Tensor");
  m.def("bf16_kernel_variant() -> int");
  m.def("bf16_fma_pairs() -> bool");
}

STABLE_TORCH_LIBRARY_IMPL(specserve, CPU, m) { m.impl("bf16_gemm", TORCH_BOX(&bf16_gemm)); }

STABLE_TORCH_LIBRARY_IMPL(specserve, CompositeExplicitAutograd, m) {
  m.impl("bf16_kernel_variant", TORCH_BOX(&bf16_kernel_variant));
  m.impl("bf16_fma_pairs", TORCH_BOX(&bf16_fma_pairs));
}
