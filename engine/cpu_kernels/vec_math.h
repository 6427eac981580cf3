// Math the compiler can vectorise inside `#pragma omp simd` loops (libm's expf cannot be).
#pragma once

#include <cstdint>
#include <cstring>

// exp(x) for float32, within ~2 ulp on [-87, 88] (Cephes' expf: Cody-Waite range reduction
// to r in [-ln2/2, ln2/2], a degree-6 polynomial, then a 2^n scale built in the exponent
// bits). Inputs are clamped, so exp(-inf) gives ~1e-38, not 0: harmless wherever the
// result is added to at least one exp(0) term (softmax) or to 1 (SiLU).
#pragma omp declare simd
static inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// The sum of 8 lanes (every kernel's dot products end in one).
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

