// bfloat16 linear layers on AMX for decode batches and small prompt chunks:
// y = x @ w^T (+ bias), each output summed in float32 and rounded to bfloat16 once.
//
//   x [M, K] bfloat16 contiguous      w [N, K] bfloat16 contiguous      bias [N] or empty
//   K % 32 == 0, N % 32 == 0 (the caller sends other shapes elsewhere)
//
// Why our own: torch's bf16 linear (oneDNN) reorders the weights into AMX's layout on every
// call, so from 8 to ~64 rows it costs about what a full reorder costs (the 125M preset's
// layers: ~11-15 ms at 8-64 rows, twice the weights' read time), and keeping a second,
// prepacked copy of every weight doubles the model's memory. Here the roles are swapped:
// the weight is AMX's A operand (16 weight rows x 32 values, a tile loaded straight from
// the checkpoint's [N, K] rows), and x^T, packed per call into AMX's pairs layout (a few
// KB), is the B operand; a C tile is 16 outputs x 16 rows of x, transposed on the way out.
// The weights stream once per call at any batch up to 32 rows; larger batches loop over
// pairs of 16-row blocks with the weight tiles in L2.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cstring>
#include <memory>

#include "amx.h"

#ifdef BATON_AMX
namespace {

using bf16 = c10::BFloat16;
using amx::kDepth;  // bfloat16 values of K per tile step
using amx::kRows;   // a tile's rows: weight rows in A and C, k pairs in B

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

// 16 x 16 float32 in registers, transposed in place: r[j] becomes column j (three rounds of
// interleaves, 64 shuffles).
inline void transpose16(__m512 r[kRows]) {
  __m512 t[kRows];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < 4; ++c) {
      t[8 * i + c] = _mm512_shuffle_f32x4(r[8 * i + c], r[8 * i + 4 + c], 0x88);
      t[8 * i + 4 + c] = _mm512_shuffle_f32x4(r[8 * i + c], r[8 * i + 4 + c], 0xdd);
    }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
  }
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

// 32 weight rows against two 16-row blocks of x (the second may be absent): C in tiles 0-3,
// weights in 4-5, x in 6-7.
void pass_32(const bf16* w, const bf16* next_w, const bf16* xp0, const bf16* xp1, int64_t K,
             int64_t rows0, int64_t rows1, const bf16* bias, bf16* y, int64_t ldy) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t w_stride = K * sizeof(bf16);
  for (int64_t k = 0; k < K; k += kDepth) {
    const int64_t ahead = k + kPrefetchSteps * kDepth;
    if (ahead < K) {
      prefetch_rows(w, K, ahead, 2 * kRows);
    } else if (next_w) {  // the next group's first values, so its first steps do not stall
      prefetch_rows(next_w, K, ahead - K, 2 * kRows);
    }
    _tile_loadd(4, w + k, w_stride);
    _tile_loadd(5, w + kRows * K + k, w_stride);
    _tile_loadd(6, xp0 + k * kRows, 64);  // the block's 16 k pairs from k: 16 x 64 bytes
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if (xp1) {
      _tile_loadd(7, xp1 + k * kRows, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float c[kRows * kRows];
  _tile_stored(0, c, 64);
  store_tile(c, rows0, bias, y, ldy);
  _tile_stored(1, c, 64);
  store_tile(c, rows0, bias ? bias + kRows : nullptr, y + kRows, ldy);
  if (xp1) {
    _tile_stored(2, c, 64);
    store_tile(c, rows1, bias, y + kRows * ldy, ldy);
    _tile_stored(3, c, 64);
    store_tile(c, rows1, bias ? bias + kRows : nullptr, y + kRows * ldy + kRows, ldy);
  }
}

}  // namespace

torch::Tensor bf16_amx_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "bf16_amx_linear: contiguous bfloat16 x [M, K] expected");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == x.size(1),
              "bf16_amx_linear: contiguous bfloat16 w [N, K] expected");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % kDepth == 0 && N % (2 * kRows) == 0,
              "bf16_amx_linear: K a multiple of 32 and N of 32 expected, got K=", K, ", N=", N);
  TORCH_CHECK(amx::request(), "bf16_amx_linear: the kernel refused AMX's tile state");
  const bf16* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kBFloat16 && bias->is_contiguous() &&
                    bias->numel() == N,
                "bf16_amx_linear: bias of N bfloat16 expected");
    bp = reinterpret_cast<const bf16*>(bias->data_ptr());
  }
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const bf16* wp = reinterpret_cast<const bf16*>(w.data_ptr());
  bf16* yp = reinterpret_cast<bf16*>(y.data_ptr());
  const std::unique_ptr<bf16[]> packed = pack_x(reinterpret_cast<const bf16*>(x.data_ptr()), M, K);
  const int64_t blocks = (M + kRows - 1) / kRows, groups = N / (2 * kRows);
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    const TileConfig config;
    _tile_loadconfig(&config);
    for (int64_t g = begin; g < end; ++g) {
      const int64_t n = g * 2 * kRows;
      const bf16* wg = wp + n * K;
      for (int64_t b = 0; b < blocks; b += 2) {
        const bool pair = b + 1 < blocks;
        // The next weights this thread reads: the next pair of blocks' pass rereads these.
        const bf16* next_w = b + 2 < blocks ? wg : (g + 1 < end ? wg + 2 * kRows * K : nullptr);
        pass_32(wg, next_w, packed.get() + b * kRows * K, pair ? packed.get() + (b + 1) * kRows * K : nullptr,
                K, std::min(kRows, M - b * kRows), pair ? std::min(kRows, M - (b + 1) * kRows) : 0,
                bp ? bp + n : nullptr, yp + b * kRows * N + n, N);
      }
    }
    _tile_release();
  });
  return y;
}
#else
torch::Tensor bf16_amx_linear(torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "bf16_amx_linear: built without AMX");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf16_amx_linear", &bf16_amx_linear, "x @ w.T (+ bias) in bfloat16 (CPU, AMX)");
#ifdef BATON_AMX
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
