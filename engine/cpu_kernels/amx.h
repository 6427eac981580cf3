// What the AMX kernels share (bf16_amx.cpp, paged_decode_amx.cpp): the tile shape, the
// request Linux wants before a process may use tiles, and a tile configuration.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#define BATON_AMX 1

namespace amx {

constexpr int64_t kRows = 16;   // a tile's rows
constexpr int64_t kDepth = 32;  // bfloat16 values in a 64-byte tile row

// Linux hands out AMX's tile state only to a process that asks for it once.
inline bool request() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// Palette 1 with each tile's rows and bytes per row set by the kernel.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void set(int tile, int num_rows, int bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(num_rows);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }
};

}  // namespace amx
#endif
