// W8A8 for a few rows (decode): y = (quantize(x) @ wq^T) * sx[m] * scale[n], on AVX-512 VNNI.
//
//   x [M, K] float32 contiguous               wq [N, K] int8 contiguous
//   wsum [N] int32: sum_k wq[n, k]            scale [N] float32         y [M, N] float32
//
// Why our own: oneDNN (`torch._int_mm`, the path for more rows) spends most of a one-row
// GEMM in setup, and the per-row quantization around it is five torch ops per layer; at
// batch 1 that left W8A8 no faster than the weight-only kernel. Here each row of x is
// quantized once per call (the arithmetic of engine/layers/quant.py's
// `quantize_activations`: sx = max(max |x|, 1e-12) / 127, xq = round-half-even(x / sx)
// clamped to +-127), and each 64-byte load of a weight row feeds up to four rows of x through
// `vpdpbusd` (64 int8 products per instruction); more rows take the same weight rows again
// in groups of four while they are still in L1, and the next weight rows are prefetched
// meanwhile (without it the reads and the products took turns: 6.9 ms instead of 2.7 for
// the 125M preset's layers at four rows). vpdpbusd multiplies unsigned
// by signed bytes, so x goes in as xq + 128 and the sum loses 128 * wsum[n] again. The
// int32 sums are exact and the scaling is the torch path's, in its order, so the result is
// bit for bit what `torch._int_mm` and the same scaling give (tests/engine/test_quant.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "row_tiles.h"
#include "no_gil.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define BATON_VNNI 1

namespace {

// Row m of x as unsigned bytes (xq + 128), and its scale.
float quantize_row(const float* x, int64_t K, uint8_t* out) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float sx = std::max(amax, 1e-12f) / 127.0f;
  for (int64_t k = 0; k < K; ++k) {
    float q = std::nearbyint(x[k] / sx);
    q = std::min(127.f, std::max(-127.f, q));
    out[k] = static_cast<uint8_t>(static_cast<int>(q) + 128);
  }
  return sx;
}

template <int M, int R>
inline void rows_pass(const uint8_t* xu, const int8_t* w, int64_t K, const int32_t* wsum,
                      const float* sx, const float* scale, float* y, int64_t ldy) {
  __m512i acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    __m512i wv[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * K + k), _MM_HINT_T0);
      wv[r] = _mm512_loadu_si512(w + r * K + k);
    }
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_loadu_si512(xu + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_dpbusd_epi32(acc[m][r], xv, wv[r]);
    }
  }
  if (k < K) {  // the tail: zeros on both sides add nothing
    const __mmask64 mask = _cvtu64_mask64((~0ULL) >> (64 - (K - k)));
    __m512i wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi8(mask, w + r * K + k);
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_maskz_loadu_epi8(mask, xu + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_dpbusd_epi32(acc[m][r], xv, wv[r]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) {
      const int32_t sum = _mm512_reduce_add_epi32(acc[m][r]) - 128 * wsum[r];
      y[m * ldy + r] = static_cast<float>(sum) * sx[m] * scale[r];
    }
}

void gemm(const uint8_t* xu, int64_t M, const int8_t* wq, int64_t K, int64_t N,
          const int32_t* wsum, const float* sx, const float* scale, float* y) {
  baton::for_each_tile(M, N, [&](int64_t m, int64_t n, auto rows, auto cols) {
    rows_pass<decltype(rows)::value, decltype(cols)::value>(
        xu + m * K, wq + n * K, K, wsum + n, sx + m, scale + n, y + m * N + n, N);
  });
}

}  // namespace

torch::Tensor w8a8_linear(torch::Tensor x, torch::Tensor wq, torch::Tensor wsum,
                          torch::Tensor scale) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "w8a8_linear: contiguous float32 x [M, K] expected");
  TORCH_CHECK(wq.scalar_type() == torch::kInt8 && wq.dim() == 2 && wq.is_contiguous() &&
                  wq.size(1) == x.size(1),
              "w8a8_linear: contiguous int8 wq [N, K] expected");
  const int64_t M = x.size(0), K = x.size(1), N = wq.size(0);
  TORCH_CHECK(M >= 1, "w8a8_linear: a row of x at least expected");
  TORCH_CHECK(wsum.scalar_type() == torch::kInt32 && wsum.is_contiguous() && wsum.numel() == N,
              "w8a8_linear: wsum of N int32 expected");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == N,
              "w8a8_linear: scale of N float32 expected");
  std::vector<uint8_t> xu(M * K);
  std::vector<float> sx(M);
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) sx[m] = quantize_row(xp + m * K, K, xu.data() + m * K);
  auto y = torch::empty({M, N}, x.options());
  const int8_t* wp = wq.data_ptr<int8_t>();
  const int32_t* sp = wsum.data_ptr<int32_t>();
  const float* cp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  gemm(xu.data(), M, wp, K, N, sp, sx.data(), cp, yp);
  return y;
}
#else
torch::Tensor w8a8_linear(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "w8a8_linear: built without AVX-512 VNNI");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("w8a8_linear", &w8a8_linear,
        "quantize(x) @ wq.T, scaled per row and channel (CPU, AVX-512 VNNI, a few rows)", NoGil());
#ifdef BATON_VNNI
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
