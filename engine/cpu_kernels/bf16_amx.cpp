// bfloat16 linear layers on AMX for decode batches and prompt chunks up to ~1,300 rows:
// y = x @ w^T (+ bias), each output summed in float32 and rounded to bfloat16 once.
//
//   bf16_amx_linear(x [M, K], w [N, K], bias [N] or empty) -> [M, N]
//       K % 32 == 0, N % 32 == 0 (the caller sends other shapes elsewhere)
//   bf16_amx_silu_mul_linear(x [M, K], w [2I, K]) -> [M, I]
//       silu(x @ w[:I]^T) * (x @ w[I:]^T), the gate and up projections' outputs rounded to
//       bfloat16 and SiLU-and-mul computed from them exactly as the two separate ops do
//       (fused.cpp's), so nothing changes but the [M, 2I] intermediate, never written;
//       K % 32 == 0, I % 16 == 0
//
// Why our own: torch's bf16 linear (oneDNN) reorders the weights into AMX's layout on every
// call, so from 8 to ~64 rows it costs about what a full reorder costs (the 125M preset's
// layers: ~11-15 ms at 8-64 rows, twice the weights' read time), and keeping a second,
// prepacked copy of every weight doubles the model's memory. Here the roles are swapped:
// the weight is AMX's A operand (16 weight rows x 32 values, a tile loaded straight from
// the checkpoint's [N, K] rows), and x^T, packed per call into AMX's pairs layout (a few
// KB), is the B operand; a C tile is 16 outputs x 16 rows of x, transposed on the way out.
// The weights stream once per call at any batch up to 32 rows; larger batches loop over
// pairs of 16-row blocks with the weight tiles in L2, and larger still over panels of x that
// stay in L2 (run_groups).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cstring>
#include <memory>

#include "amx.h"
#include "f32_lanes.h"
#include "work_queue.h"
#include "no_gil.h"

#ifdef BATON_AMX
namespace {

using bf16 = c10::BFloat16;
using amx::kDepth;  // bfloat16 values of K per tile step
using amx::kRows;   // a tile's rows: weight rows in A and C, k pairs in B
using amx::transpose16;

// Every tile 16 rows of 64 bytes: A = 16 weight rows x 32 values, B = 16 k pairs x 16 rows
// of x, C = 16 x 16 float32.
struct TileConfig : amx::TileConfig {
  TileConfig() {
    for (int t = 0; t < 8; ++t) set(t, kRows, 64);
  }
};

// x [M, K] -> [ceil(M / 16)][K / 2][16][2]: for each block of 16 rows, row kp holds the pairs
// (x[m][2kp], x[m][2kp + 1]) of its 16 rows; rows past M repeat the last (their outputs are
// computed and dropped).
std::unique_ptr<bf16[]> pack_x(const bf16* x, int64_t M, int64_t K) {
  const int64_t blocks = (M + kRows - 1) / kRows, pairs = K / 2;
  std::unique_ptr<bf16[]> packed(new bf16[blocks * kRows * K]);  // every value written below
  // Parallel over blocks, and each block written in order (its 16 rows read side by side):
  // written row by row, each store hit another cache line (the 125M preset's layers at 64 /
  // 256 rows: 10.0 / 29 ms that way, 8.5 / 25 this way).
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint32_t* rows[kRows];
      for (int64_t j = 0; j < kRows; ++j) {
        const int64_t m = std::min(b * kRows + j, M - 1);  // past M: any row, never written out
        rows[j] = reinterpret_cast<const uint32_t*>(x + m * K);
      }
      uint32_t* dst = reinterpret_cast<uint32_t*>(packed.get() + b * kRows * K);
      for (int64_t kp = 0; kp < pairs; ++kp)
        for (int64_t j = 0; j < kRows; ++j) dst[kp * kRows + j] = rows[j][kp];
    }
  });
  return packed;
}

// C tile (16 outputs x 16 rows of x, float32) -> y[m][n0 .. n0 + 15] for the rows of x that
// exist: a column of the tile is a row's 16 outputs, plus bias, rounded to bfloat16 to
// nearest even (what bf16(float) does) in one instruction. The columns come from a register
// transpose instead of a gather per row: the 125M preset's layers at 16 / 64 / 128 / 192 rows
// 6.74 / 9.3 / 17.0 / 22.2 -> 6.6 / 9.0 / 15.0 / 19.1 ms (alternating runs x2).
inline void store_tile(const float* c, int64_t rows_of_x, const bf16* bias, bf16* y, int64_t ldy) {
  const __m512 b = bias ? _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias)))
                        : _mm512_setzero_ps();
  __m512 r[kRows];
  for (int64_t i = 0; i < kRows; ++i) r[i] = _mm512_load_ps(c + i * kRows);
  transpose16(r);
  for (int64_t m = 0; m < rows_of_x; ++m) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * ldy), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(r[m], b)));
  }
}

// Weight rows a few tile steps ahead, toward L1: 32 rows read side by side are more streams
// than the hardware prefetchers follow (the 125M preset's layers at 16 rows: 6.7 -> 4.9 ms;
// 2 or 8 steps ahead measured no better than 4).
constexpr int64_t kPrefetchSteps = 4;
inline void prefetch_rows(const bf16* w, int64_t K, int64_t k, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k), _MM_HINT_T0);
}

// Gate and up C tiles (16 outputs x 16 rows of x each) -> y[m][n0 .. n0 + 15] = silu(gate) *
// up, every rounding where the unfused path has one: each projection's output (store_tile's,
// + 0 included, which turns -0 into +0 as there), then fused.cpp's SiLU-and-mul (the same
// lanes::silu_mul, so the same bits).
inline void store_silu_mul(const float* gate, const float* up, int64_t rows_of_x, bf16* y, int64_t ldy) {
  using V = lanes::F32x16;
  __m512 g[kRows], u[kRows];
  for (int64_t i = 0; i < kRows; ++i) {
    g[i] = _mm512_load_ps(gate + i * kRows);
    u[i] = _mm512_load_ps(up + i * kRows);
  }
  transpose16(g);
  transpose16(u);
  for (int64_t m = 0; m < rows_of_x; ++m) {
    const __m512 gv = V::held(V::add(g[m], V::zero()), bf16{}), uv = V::held(V::add(u[m], V::zero()), bf16{});
    V::store(y + m * ldy, lanes::silu_mul<V, bf16>(gv, uv));
  }
}

// A pass's 32 weight rows: 16 from `first`, 16 from `second` (first + 16 rows for a plain
// product; the gate's and the up projection's rows for SiLU-and-mul).
struct WeightRows {
  const bf16* first;
  const bf16* second;
};

inline void prefetch_pair(WeightRows w, int64_t K, int64_t k) {
  prefetch_rows(w.first, K, k, kRows);
  prefetch_rows(w.second, K, k, kRows);
}

// A pass's C tiles as they came out of AMX, written out to y during the next pass's tile
// products: AMX runs on its own while the vector units are free, so the epilogue (transposes,
// and for SiLU-and-mul an exp and a division a value) overlaps the products instead of
// following them. The 125M preset's gate-up with SiLU-and-mul at 256 rows: 1,015 us a layer
// with the epilogue after its pass, slower than the two ops apart (957); 912 this way; a
// 256-token prefill 41.0 / 42.0 -> 38.8 / 38.8 ms (alternating builds x2).
template <bool kSiluMul>
struct Pending {
  alignas(64) float c[4][kRows * kRows];
  int units = 0, done = 0;  // 16 x 16 outputs each: 4 tiles, or 2 tile pairs for SiLU-and-mul
  int64_t rows[2] = {0, 0}, ldy = 0;
  const bf16* bias = nullptr;
  bf16* y = nullptr;

  void write(int u) {
    if constexpr (kSiluMul) {
      store_silu_mul(c[2 * u], c[2 * u + 1], rows[u], y + u * kRows * ldy, ldy);
    } else {
      const int64_t n = (u % 2) * kRows;
      store_tile(c[u], rows[u / 2], bias ? bias + n : nullptr, y + (u / 2) * kRows * ldy + n, ldy);
    }
  }
  void write_next() {
    if (done < units) write(done++);
  }
  void flush() {
    while (done < units) write(done++);
  }
};

// 32 weight rows against two 16-row blocks of x (the second may be absent): C in tiles 0-3,
// weights in 4-5, x in 6-7. `next`: the rows this thread reads after these, or null. The
// previous pass's outputs in `pending` go out one unit per tile step; this pass's wait there.
template <bool kSiluMul>
void pass_32(WeightRows w, const WeightRows* next, const bf16* xp0, const bf16* xp1, int64_t K,
             int64_t rows0, int64_t rows1, const bf16* bias, bf16* y, int64_t ldy,
             Pending<kSiluMul>& pending) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t w_stride = K * sizeof(bf16);
  for (int64_t k = 0; k < K; k += kDepth) {
    const int64_t ahead = k + kPrefetchSteps * kDepth;
    if (ahead < K) {
      prefetch_pair(w, K, ahead);
    } else if (next) {  // the next rows' first values, so their first steps do not stall
      prefetch_pair(*next, K, ahead - K);
    }
    _tile_loadd(4, w.first + k, w_stride);
    _tile_loadd(5, w.second + k, w_stride);
    _tile_loadd(6, xp0 + k * kRows, 64);  // the block's 16 k pairs from k: 16 x 64 bytes
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if (xp1) {
      _tile_loadd(7, xp1 + k * kRows, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    pending.write_next();
  }
  pending.flush();
  _tile_stored(0, pending.c[0], 64);
  _tile_stored(1, pending.c[1], 64);
  if (xp1) {
    _tile_stored(2, pending.c[2], 64);
    _tile_stored(3, pending.c[3], 64);
  }
  pending.units = (xp1 ? 2 : 1) * (kSiluMul ? 1 : 2);
  pending.done = 0;
  pending.rows[0] = rows0;
  pending.rows[1] = rows1;
  pending.ldy = ldy;
  pending.bias = bias;
  pending.y = y;
}

void check_operands(const torch::Tensor& x, const torch::Tensor& w, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(), what,
              ": contiguous bfloat16 x [M, K] expected");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == x.size(1),
              what, ": contiguous bfloat16 w [N, K] expected");
  TORCH_CHECK(amx::request(), what, ": the kernel refused AMX's tile state");
}

// Packed x is taken in panels of at most this many bytes, each panel against every weight
// group before the next, so the panel stays in L2 (2 MB a core here) while the groups pass
// over it: a pass reads its two x blocks from L2, where without panels, past ~1,000 rows (the
// MLP's down projection, K = 3,072: past ~300), it read them from L3. A 2,048-token prompt's
// prefill, the 125M preset, 2 threads: 518-551 ms without panels, 388-412 with them.
constexpr int64_t kPanelBytes = int64_t{1} << 20;

// x against `groups` pairs of 16 weight rows (rows(g)); group g's 32 outputs, or 16 for
// SiLU-and-mul, land at column out_col(g) of y.
template <bool kSiluMul, typename Rows, typename Col>
void run_groups(const torch::Tensor& x, int64_t groups, Rows rows, Col out_col, const bf16* bias,
                torch::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), ldy = y.size(1);
  if (M == 0) return;
  bf16* yp = reinterpret_cast<bf16*>(y.data_ptr());
  const std::unique_ptr<bf16[]> packed = pack_x(reinterpret_cast<const bf16*>(x.data_ptr()), M, K);
  const int64_t blocks = (M + kRows - 1) / kRows;
  // An even number of blocks a panel (passes take them in pairs), at least one pair.
  const int64_t panel = std::max<int64_t>(2, kPanelBytes / (kRows * K * int64_t{sizeof(bf16)}) & ~int64_t{1});
  const int64_t panels = (blocks + panel - 1) / panel;
  // A work item is a chunk of groups against one panel, panel after panel. Eight chunks a
  // thread and panel: few enough that a thread still reads runs of neighbouring weight rows,
  // enough that one preempted thread leaves little for the other to wait on.
  const int64_t chunk = std::max<int64_t>(1, groups / (8 * at::get_num_threads()));
  const int64_t chunks_a_panel = (groups + chunk - 1) / chunk;
  work_queue::run(panels * chunks_a_panel, 1, [&](work_queue::Chunks& items) {
    const TileConfig config;
    _tile_loadconfig(&config);
    Pending<kSiluMul> pending;
    for (int64_t item, item_end; items.take(item, item_end);) {
      const int64_t b_begin = item / chunks_a_panel * panel, b_end = std::min(b_begin + panel, blocks);
      const int64_t begin = item % chunks_a_panel * chunk, end = std::min(begin + chunk, groups);
      for (int64_t g = begin; g < end; ++g) {
        const WeightRows w = rows(g);
        const WeightRows after = g + 1 < end ? rows(g + 1) : w;
        const int64_t n = out_col(g);
        for (int64_t b = b_begin; b < b_end; b += 2) {
          const bool pair = b + 1 < b_end;
          // The next weights this thread reads: the next pair of blocks' pass rereads these.
          const WeightRows* next = b + 2 < b_end ? &w : (g + 1 < end ? &after : nullptr);
          pass_32<kSiluMul>(w, next, packed.get() + b * kRows * K,
                            pair ? packed.get() + (b + 1) * kRows * K : nullptr, K,
                            std::min(kRows, M - b * kRows), pair ? std::min(kRows, M - (b + 1) * kRows) : 0,
                            bias ? bias + n : nullptr, yp + b * kRows * ldy + n, ldy, pending);
        }
      }
    }
    pending.flush();
    _tile_release();
  });
}

}  // namespace

torch::Tensor bf16_amx_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  check_operands(x, w, "bf16_amx_linear");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % kDepth == 0 && N % (2 * kRows) == 0,
              "bf16_amx_linear: K a multiple of 32 and N of 32 expected, got K=", K, ", N=", N);
  const bf16* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kBFloat16 && bias->is_contiguous() &&
                    bias->numel() == N,
                "bf16_amx_linear: bias of N bfloat16 expected");
    bp = reinterpret_cast<const bf16*>(bias->data_ptr());
  }
  auto y = torch::empty({M, N}, x.options());
  const bf16* wp = reinterpret_cast<const bf16*>(w.data_ptr());
  run_groups<false>(
      x, N / (2 * kRows), [&](int64_t g) { return WeightRows{wp + g * 2 * kRows * K, wp + (g * 2 + 1) * kRows * K}; },
      [](int64_t g) { return g * 2 * kRows; }, bp, y);
  return y;
}

torch::Tensor bf16_amx_silu_mul_linear(torch::Tensor x, torch::Tensor w) {
  check_operands(x, w, "bf16_amx_silu_mul_linear");
  const int64_t M = x.size(0), K = x.size(1), I = w.size(0) / 2;
  TORCH_CHECK(K % kDepth == 0 && w.size(0) % (2 * kRows) == 0,
              "bf16_amx_silu_mul_linear: K a multiple of 32 and [gate | up] rows of 32 expected, got K=", K,
              ", rows=", w.size(0));
  auto y = torch::empty({M, I}, x.options());
  const bf16* wp = reinterpret_cast<const bf16*>(w.data_ptr());
  run_groups<true>(
      x, I / kRows, [&](int64_t g) { return WeightRows{wp + g * kRows * K, wp + (I + g * kRows) * K}; },
      [](int64_t g) { return g * kRows; }, nullptr, y);
  return y;
}
#else
torch::Tensor bf16_amx_linear(torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "bf16_amx_linear: built without AMX");
}
torch::Tensor bf16_amx_silu_mul_linear(torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "bf16_amx_silu_mul_linear: built without AMX");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf16_amx_linear", &bf16_amx_linear, "x @ w.T (+ bias) in bfloat16 (CPU, AMX)", NoGil());
  m.def("bf16_amx_silu_mul_linear", &bf16_amx_silu_mul_linear,
        "silu(x @ gate.T) * (x @ up.T) for w = [gate | up] in bfloat16 (CPU, AMX)", NoGil());
#ifdef BATON_AMX
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
