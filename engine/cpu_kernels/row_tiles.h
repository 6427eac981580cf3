// The tiling of the few-row GEMM kernels (int8_vnni.cpp, bf16_gemv.cpp): y [M, N] = x [M, K]
// times w [N, K]^T, in tiles of up to 4 rows of x by up to 4 rows of w. The threads split
// the passes over w's rows; a pass takes every group of x's rows in turn while its weight
// rows are in L1. `tile(m, n, rows, cols)` gets the tile's shape as compile-time constants
// (std::integral_constant), so each kernel's register tile is a template of fixed size.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace baton {

constexpr int64_t TILE = 4;

// f(std::integral_constant<int, k>) for k = min(n, 4) >= 1.
template <class F>
inline void with_size(int64_t n, F&& f) {
  switch (std::min<int64_t>(n, TILE)) {
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

template <class Tile>
void for_each_tile(int64_t M, int64_t N, Tile&& tile) {
  const int64_t passes = (N + TILE - 1) / TILE;
  at::parallel_for(0, passes, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n = p * TILE;
      for (int64_t m = 0; m < M; m += TILE)
        with_size(M - m, [&](auto rows) {
          with_size(N - n, [&](auto cols) { tile(m, n, rows, cols); });
        });
    }
  });
}

}  // namespace baton
