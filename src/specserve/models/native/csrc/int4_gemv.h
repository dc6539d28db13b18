// Internal interface of the int4 kernel (int4_gemv.cpp) for the other native ops built into
// the same library (int8_gemv.cpp, decoder_layer.cpp): the packed-weight checks and the raw
// matmul. PackedWeight also describes the int8-group layout (int8_gemv.h).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

namespace specserve_native {

// A packed quantised weight, checked and as raw pointers: bits 4 is the int4 layout
// (int4_gemv.cpp, int4_native.py), bits 8 the int8-group layout and bits 6 its six-bit codes
// (int8_gemv.cpp, int8_native.py).
struct PackedWeight {
  // int4: [Np / 16, K / 8 (+ K / G), 64]; int8: [Np / 16, K / 4 (+ K / G), 64]; six-bit int8:
  // [Np / 16, K / G, 3 G / 16 + 1, 64]
  const uint8_t* qweight;
  const uint16_t* scales;  // fp16 bits [Np / 16, K / G, 2, 16]; nullptr when inline
  const float* row_scale;  // [Np]
  int64_t N, K, group_size;
  int bits;  // 4, 8 or 6
  // Each group's [2, 16] fp16 constants follow its code blocks in the tile's stream (one more
  // 64-byte block per group) instead of living in `scales`.
  bool inline_constants = false;
  int64_t tile_bytes = 0;  // bytes of one tile in qweight (its blocks times 64)
  // Whether the weight runs on the AMX tiles (quant_amx.h): kTilesNever; kTilesSwitched (a
  // target's weights: where SPECSERVE_QUANT_AMX is "1", for every M, so rows stay batch
  // invariant); kTilesPermitted (a draft model's calls of several rows: wherever the CPU and
  // OS have the tiles, since proposals need no batch invariance).
  int64_t tiles = 1;
  // Six-bit codes with superblock constants (int8_gemv.cpp, superblock.py): 0 for the
  // per-group fp16 constants; 1 when each superblock of group_size inputs opens with its rows'
  // fp32 scale d and int8 scale codes of its 16-input sub-groups; 2 when fp32 offsets e and
  // int8 offset codes follow them.
  // 3: int4 codes with superblock constants (int4_gemv.cpp: fp16 d and e, six-bit scale and
  // offset codes of 32-input sub-groups per superblock of 256 inputs; qweight
  // [Np / 16, K / 256, 36, 64]).
  int super_form = 0;
  // Super forms 1 and 2 with each six-bit unit's bytes in quad order (a five-dimensional
  // qweight [Np / 16, K / G, H + 3 G / 16, 2, 32]: run_block_quads in int8_gemv.cpp).
  bool quad_order = false;
};

// Checks dtype, shape and contiguity of a packed weight's three tensors, int4 (bits 4) or int8
// group (bits 8), either layout (empty scales: the constants inline), or int8 group with
// six-bit codes (bits 6: qweight [Np / 16, K / G, 3 G / 16 + 1, 64], the constants inline;
// or [Np / 16, K / G, 3 G / 16 + H, 64] with superblock constants, H header blocks:
// 1 + G / 64, or 2 + G / 32 with offsets),
// and returns their pointers. what: the caller's name for the weight, in the error messages.
PackedWeight tile_packed_weight(const torch::stable::Tensor& qweight,
                                const torch::stable::Tensor& scales,
                                const torch::stable::Tensor& row_scale, int64_t out_features,
                                int64_t group_size, const char* what, int bits);

// out[M, N] = x[M, K] @ w.T with x contiguous bf16; out bf16 (or fp32 when out_f32), row
// stride N. Splits N over torch's intra-op threads; the arithmetic of a row never depends on
// M or the split.
void int4_matmul(const uint16_t* x, int64_t M, const PackedWeight& w, void* out, bool out_f32);

// Whether this CPU runs the compiled kernel variant (AVX-512 BF16 + GFNI, or AVX2 + FMA + F16C).
bool cpu_supported();

// A new contiguous CPU tensor [rows, cols], fp32 or bf16.
torch::stable::Tensor empty_2d(int64_t rows, int64_t cols, bool f32);

}  // namespace specserve_native
