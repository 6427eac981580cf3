// bfloat16 linear layers for a few rows (decode): y = x @ w^T (+ bias), on AVX-512 BF16.
//
//   x [M, K] bfloat16 contiguous      w [N, K] bfloat16 contiguous      bias [N] or empty
//   y [M, N] bfloat16: each output summed in float32, rounded to bfloat16 once
//
// Why our own: at one row torch's bf16 linear (oneDNN) read the 125M preset's weights at
// ~18 GB/s on an AMX Xeon, little faster than float32 with twice the bytes; a decode step is
// that read. Here each 64-byte load of a weight row feeds up to four rows of x through
// `vdpbf16ps` (32 products per instruction, pairs summed in float32, as oneDNN's bf16 GEMM
// does: exact bf16 products, float32 sums), over four weight rows at a time so four
// accumulator chains hide the instruction's latency, while the next four rows are
// prefetched (without it the reads and the products took turns: 17.9 ms instead of 8.7
// for the 125M preset's layers at four rows). Only the order of the float32 sums differs
// from oneDNN's.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "row_tiles.h"
#include "no_gil.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define BATON_BF16 1

namespace {

using bf16 = c10::BFloat16;

template <int M, int R>
inline void rows_pass(const bf16* x, const bf16* w, int64_t K, const bf16* bias, bf16* y,
                      int64_t ldy) {
  __m512 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * K + k), _MM_HINT_T0);
      wv[r] = (__m512bh)_mm512_loadu_si512(w + r * K + k);
    }
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
  if (k < K) {  // the tail: zeros on both sides add nothing
    const __mmask32 mask = _cvtu32_mask32((~0U) >> (32 - (K - k)));
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + r * K + k);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) {
      const float sum = _mm512_reduce_add_ps(acc[m][r]);
      y[m * ldy + r] = bf16(bias ? sum + static_cast<float>(bias[r]) : sum);
    }
}

}  // namespace

torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "bf16_linear: contiguous bfloat16 x [M, K] expected");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == x.size(1),
              "bf16_linear: contiguous bfloat16 w [N, K] expected");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const bf16* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kBFloat16 && bias->is_contiguous() &&
                    bias->numel() == N,
                "bf16_linear: bias of N bfloat16 expected");
    bp = reinterpret_cast<const bf16*>(bias->data_ptr());
  }
  auto y = torch::empty({M, N}, x.options());
  const bf16* xp = reinterpret_cast<const bf16*>(x.data_ptr());
  const bf16* wp = reinterpret_cast<const bf16*>(w.data_ptr());
  bf16* yp = reinterpret_cast<bf16*>(y.data_ptr());
  baton::for_each_tile(M, N, [&](int64_t m, int64_t n, auto rows, auto cols) {
    rows_pass<decltype(rows)::value, decltype(cols)::value>(
        xp + m * K, wp + n * K, K, bp ? bp + n : nullptr, yp + m * N + n, N);
  });
  return y;
}
#else
torch::Tensor bf16_linear(torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "bf16_linear: built without AVX-512 BF16");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf16_linear", &bf16_linear,
        "x @ w.T (+ bias) in bfloat16 (CPU, AVX-512 BF16, a few rows)", NoGil());
#ifdef BATON_BF16
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
