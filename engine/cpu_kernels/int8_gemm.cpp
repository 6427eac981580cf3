// y = (x @ Wq^T) * scale (+ bias) with INT8 weight-only, per-output-channel quantization.
//
//   x [M, K] float32 contiguous      wq [N, K] int8 contiguous (W ~= wq * scale[:, None])
//   scale [N] float32                bias [N] or empty          y [M, N] float32
//
// Why our own: torch's CPU op for this (`torch._weight_int8pack_mm`) took 3.3x the time of
// our float32 skinny GEMM at one row and 50x at 64 on this AVX2-only CPU (125M preset's
// shapes). Decode reads every weight once per step, so a quarter of the bytes is the point;
// the int8 -> float32 widening happens in registers, once per weight per strip, and serves
// all MR rows of x (the same register tiling as skinny_gemm.cpp). One row of x (batch-1
// decode) has its own loop: with the row tiles' NR FMA chains it read 15 GB/s of int8, with
// 32-byte loads and four chains per weight row 25 GB/s (the 125M preset's layers in 4.1 ms
// against float32's 12-13 ms). The scale is applied once per output, after the dot product.
// This uses AVX2's sign-extending loads; int8 x int8 products on VNNI / AMX, which quantize
// the activations too, are `--quantization w8a8` (int8_vnni.cpp and oneDNN).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "no_gil.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "vec_math.h"
#define BATON_INT8 1

namespace {

constexpr int MR = 4;  // rows of x per tile
constexpr int NR = 3;  // rows of W per strip

// Eight int8 weights widened to eight floats.
inline __m256 widen8(const int8_t* w) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

template <int MR_, int NR_>
inline void tile(const float* x, const int8_t* w, int64_t K, const float* scale,
                 const float* bias, float* y, int64_t ldy) {
  __m256 acc[MR_][NR_];
  for (int i = 0; i < MR_; ++i)
    for (int j = 0; j < NR_; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[NR_];
    for (int j = 0; j < NR_; ++j) wv[j] = widen8(w + j * K + k);
    for (int i = 0; i < MR_; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * K + k);
      for (int j = 0; j < NR_; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR_; ++i)
    for (int j = 0; j < NR_; ++j)
      y[i * ldy + j] = hsum8(acc[i][j]) * scale[j] + (bias ? bias[j] : 0.f);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// One row of x (a batch-1 decode step) on AVX-512: each weight row in 64-byte loads widened
// 16 at a time, four independent FMA chains. Where the weights sit in cache the widening, not
// the reading, bounds this loop, and 16 lanes do it in half the instructions of 8 (the 125M
// preset's layers on an AVX-512 Xeon: see engine/layers/quant.py).
inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

inline void gemv_row(const float* x, const int8_t* w, int64_t K, float scale, float bias,
                     float* y) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512i v = _mm512_loadu_si512(w + k);
    const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(v)));
    const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 1)));
    const __m512 w2 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 2)));
    const __m512 w3 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 3)));
    acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), w0, acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), w1, acc[1]);
    acc[2] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 32), w2, acc[2]);
    acc[3] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 48), w3, acc[3]);
  }
  __m256 tail = _mm256_setzero_ps();
  for (; k < K; k += 8) tail = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), widen8(w + k), tail);
  const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  *y = (hsum16(sum) + hsum8(tail)) * scale + bias;
}
#else
// One row of x (a batch-1 decode step): each weight row in 32-byte loads, four independent
// FMA chains per row.
inline void gemv_row(const float* x, const int8_t* w, int64_t K, float scale, float bias,
                     float* y) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int u = 0; u < 4; ++u) {
      const __m256 wv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[u]));
      acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8 * u), wv, acc[u]);
    }
  }
  for (; k < K; k += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), widen8(w + k), acc[0]);
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  *y = hsum8(sum) * scale + bias;
}
#endif

template <int NR_>
inline void strip(const float* x, int64_t M, const int8_t* w, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t ldy) {
  int64_t m = 0;
  for (; m + MR <= M; m += MR) tile<MR, NR_>(x + m * K, w, K, scale, bias, y + m * ldy, ldy);
  // The rest in one tile too (not a pass over the strip per row): a batch of 5-7 rows,
  // or a speculating request's 1 + k positions, costs one extra pass, not up to three.
  switch (M - m) {
    case 3: tile<3, NR_>(x + m * K, w, K, scale, bias, y + m * ldy, ldy); break;
    case 2: tile<2, NR_>(x + m * K, w, K, scale, bias, y + m * ldy, ldy); break;
    case 1: tile<1, NR_>(x + m * K, w, K, scale, bias, y + m * ldy, ldy); break;
    default: break;
  }
}

}  // namespace

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor wq, torch::Tensor scale,
                          c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "int8_linear: float32 x expected");
  TORCH_CHECK(wq.scalar_type() == torch::kInt8, "int8_linear: int8 weights expected");
  TORCH_CHECK(x.dim() == 2 && wq.dim() == 2 && x.size(1) == wq.size(1),
              "int8_linear: x [M, K] and wq [N, K] expected");
  TORCH_CHECK(x.is_contiguous() && wq.is_contiguous(), "int8_linear: contiguous inputs expected");
  const int64_t M = x.size(0), K = x.size(1), N = wq.size(0);
  TORCH_CHECK(K % 8 == 0, "int8_linear: K must be a multiple of 8");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == N,
              "int8_linear: scale of N float32 expected");
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
                    bias->numel() == N,
                "int8_linear: bias of N float32 expected");
    bp = bias->data_ptr<float>();
  }
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = wq.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (M == 1) {
    at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        gemv_row(xp, wp + n * K, K, sp[n], bp ? bp[n] : 0.f, yp + n);
    });
    return y;
  }
  const int64_t strips = (N + NR - 1) / NR;
  at::parallel_for(0, strips, 16, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t n0 = s * NR;
      const float* b = bp ? bp + n0 : nullptr;
      switch (std::min<int64_t>(NR, N - n0)) {
        case 3: strip<3>(xp, M, wp + n0 * K, K, sp + n0, b, yp + n0, N); break;
        case 2: strip<2>(xp, M, wp + n0 * K, K, sp + n0, b, yp + n0, N); break;
        default: strip<1>(xp, M, wp + n0 * K, K, sp + n0, b, yp + n0, N); break;
      }
    }
  });
  return y;
}
#else
torch::Tensor int8_linear(torch::Tensor, torch::Tensor, torch::Tensor,
                          c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "int8_linear: built without AVX2/FMA");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear,
        "(x @ wq.T) * scale (+ bias), int8 weights (CPU, AVX2)", NoGil());
#ifdef BATON_INT8
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
