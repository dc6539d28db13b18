// Quantised weights on the AMX tiles (quant_amx.cpp), for the int4 and int8-group matmuls.
#pragma once

#include <cstdint>

#include "int4_gemv.h"

namespace specserve_native {

// PackedWeight::tiles: the AMX tiles (the low two bits) ...
constexpr int64_t kTilesNever = 0;
constexpr int64_t kTilesSwitched = 1;
constexpr int64_t kTilesPermitted = 2;
constexpr int64_t kTilesMask = 3;
// ... and whether a one-row call may quantise x to 8 bits (a draft model's weights: the AVX2
// int4 kernel's cheaper one-row path, int4_gemv.cpp; ignored by the other kernels).
constexpr int64_t kQuantisedX = 4;
// ... and whether per-group int4 constants keep bf16 activations where they would take int8
// ones (a GGUF file's Q4_0 / Q4_1 blocks: tile_stream.EXACT_X)
constexpr int64_t kExactX = 8;

// Whether the build has the tile kernels and the process may use the tiles (amx_permitted();
// SPECSERVE_QUANT_AMX aside).
bool quant_amx_permitted();

// Whether the build has the tile kernels (AMX BF16 and AVX-512 BW, BF16, VBMI, GFNI), the OS
// grants the tile state and SPECSERVE_QUANT_AMX is "1" (read on every call; off by default).
bool quant_amx_on();

// Whether a matmul with this weight runs on the AMX tiles now: the build has AMX BF16 (and
// AVX-512 BW, BF16, VBMI, GFNI), the OS grants the tile state, SPECSERVE_QUANT_AMX is "1"
// (read on every call; not for kTilesPermitted), and the weight allows them
// (PackedWeight::tiles) and is int4 with a group size a multiple of 32 up to 256 (either layout
// of its constants), or six-bit codes. A choice by weight and switch, never by M: every row of
// a weight gets the same arithmetic whatever the batch (a caller that passes kTilesPermitted
// for some calls only, a draft model, gives that up).
bool quant_amx_applies(const PackedWeight& w);

// One matmul's operands for the tiles. x: bf16 [M, K] row-major; xsum: [M, K / G] as the
// vdpbf16ps kernels compute it; out: [M, N], bf16 or fp32.
struct QuantTiles {
  const PackedWeight* w;
  const uint16_t* x;
  const float* xsum;
  void* out;
  bool out_f32;
  int64_t M;
  int64_t prefetch;  // bytes ahead in the tile's stream
};

// The prefetch distance of the tile kernels (bytes ahead in a tile's stream), and the grain
// of their split over tiles for K inputs, M rows and codes of `bits` bits: tasks of at least
// 128 KiB / (M + 1) of weights, so tiny layers stay on one thread.
int64_t amx_prefetch();
int64_t amx_grain(int64_t K, int64_t M, int bits);

// Tiles [begin, end) of the weight (16 output rows each), every row of x. Loads and releases
// the calling thread's tile configuration.
void quant_amx_range(const QuantTiles& p, int64_t begin, int64_t end);

}  // namespace specserve_native
