// The AMX tile unit, shared by the bf16 matmul (bf16_gemm.cpp) and the quantised matmuls on
// tiles (quant_amx.cpp): whether the process may use it, and the tile configuration record.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SPECSERVE_HAVE_AMX 1
#endif

namespace specserve_native {

// Whether Linux granted this process the AMX tile state (arch_prctl, asked once) and
// SPECSERVE_AMX is not "0" (read on every call: the switch takes every kernel off the tiles,
// as on a CPU without AMX); false in a build without AMX.
bool amx_permitted();

// Whether the environment switch `name` leaves a kernel on: anything but "0". Read on every
// call (a getenv is nothing beside a matmul), so a benchmark can alternate in one process.
bool switch_on(const char* name);
// Whether the environment switch `name` turns a kernel on: exactly "1" (read on every call).
bool switch_set(const char* name);

// ldtilecfg's 64-byte record, palette 1: per tile register its rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace specserve_native
