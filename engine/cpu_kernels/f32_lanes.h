// float32 registers of 8 or 16 lanes for the elementwise kernels (fused.cpp; bf16_amx.cpp's
// SiLU-and-mul epilogue) and paged decode's group loops (paged_decode.h): a loop is written
// once over either width, and runs on the widest the build has first. Values load from
// float32, bfloat16 or int8 (a quantized cache's entries, widened) and store to float32 or
// bfloat16 (16 lanes: where the build has AVX-512 BF16, its one rounding instruction); `held` is a
// value as the element type holds it (bfloat16: rounded to nearest even, NaN quiet). Every
// lane computes the same steps at either width, so a value comes out the same whichever
// width, or which kernel, computed it. (16 lanes against 8 at 256 rows: SiLU-and-mul 162 ->
// 124 us a layer, residual add + RMSNorm 46 -> 32.)
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "vec_math.h"

namespace lanes {

using bf16 = c10::BFloat16;

#if defined(__AVX2__) && defined(__FMA__)
#define BATON_LANES_8 1

struct F32x8 {
  using Reg = __m256;
  static constexpr int64_t kWidth = 8;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load(const bf16* p) {  // bfloat16 is float32's top half
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static Reg load(const int8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  }
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
  // One instruction (the fused build prefers this ISA where the CPU has it: the integer
  // version below took ~2.5x a float32 row's time).
  static __m128i round(Reg v) { return (__m128i)_mm256_cvtneps_pbh(v); }
#else
  // As fused.cpp's bf16_bits rounds one value.
  static __m128i round(Reg v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i b = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  }
#endif
  static Reg held(Reg v, float) { return v; }
  static Reg held(Reg v, bf16) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(round(v)), 16)); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static void store(bf16* p, Reg v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), round(v)); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm256_fnmadd_ps(a, b, c); }
  static Reg clamp(Reg x, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(x, set1(lo)), set1(hi)); }
  static Reg floor(Reg x) { return _mm256_floor_ps(x); }
  // 2^n for whole-valued n in float32's exponent range, built in the exponent bits.
  static Reg pow2(Reg n) {
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(bits);
  }
  static float sum(Reg v) { return hsum8(v); }
};
#endif

#if defined(__AVX512F__)
#define BATON_LANES_16 1

struct F32x16 {
  using Reg = __m512;
  static constexpr int64_t kWidth = 16;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load(const bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static Reg load(const int8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
  }
#if defined(__AVX512BF16__)
  // Rounding to bfloat16 only where the build has its instruction: the kernels that store
  // bfloat16 on 16 lanes (fused.cpp, the AMX ones) are built for AVX-512 BF16 or for AVX2.
  static __m256i round(Reg v) { return (__m256i)_mm512_cvtneps_pbh(v); }
  static Reg held(Reg v, bf16) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(round(v)), 16)); }
  static void store(bf16* p, Reg v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round(v)); }
#endif
  static Reg held(Reg v, float) { return v; }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm512_fnmadd_ps(a, b, c); }
  static Reg clamp(Reg x, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(x, set1(lo)), set1(hi)); }
  static Reg floor(Reg x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static Reg pow2(Reg n) {
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(bits);
  }
  static float sum(Reg v) { return _mm512_reduce_add_ps(v); }
};
#endif

// vexp's steps (vec_math.h) on V's lanes. Why not vexp in an `omp simd` loop where the result
// divides: gcc 12 specialises such a loop for clamped inputs and if-converts both paths, so
// SiLU's x / (1 + exp(87)) ran in every lane, its denormal results each a microcode assist:
// the vector loop took twice the scalar one's time (10.9 against 5.3 us for 2,048 values).
template <typename V>
inline typename V::Reg exp(typename V::Reg x) {
  x = V::clamp(x, -87.0f, 88.0f);
  const auto n = V::floor(V::fmadd(x, V::set1(1.44269504088896341f), V::set1(0.5f)));
  auto r = V::fnmadd(n, V::set1(0.693359375f), x);
  r = V::fmadd(n, V::set1(2.12194440e-4f), r);
  auto p = V::set1(1.9875691500e-4f);
  p = V::fmadd(p, r, V::set1(1.3981999507e-3f));
  p = V::fmadd(p, r, V::set1(8.3334519073e-3f));
  p = V::fmadd(p, r, V::set1(4.1665795894e-2f));
  p = V::fmadd(p, r, V::set1(1.6666665459e-1f));
  p = V::fmadd(p, r, V::set1(5.0000001201e-1f));
  p = V::add(V::fmadd(V::mul(p, r), r, r), V::set1(1.0f));
  return V::mul(p, V::pow2(n));
}

// silu(g) * u, silu rounded as the element type T holds it (PyTorch rounds each op's result).
template <typename V, typename T>
inline typename V::Reg silu_mul(typename V::Reg g, typename V::Reg u) {
  const auto silu = V::div(g, V::add(V::set1(1.f), exp<V>(V::sub(V::zero(), g))));
  return V::mul(V::held(silu, T{}), u);
}

// fn(V{}, i) -> the new i, for the 16-lane then the 8-lane registers the build has, from 0:
// each does the whole vectors it can; returns where they stopped (the caller's scalar loop
// does the rest, all of it where the build has neither).
template <typename Fn>
inline int64_t each_width(Fn&& fn) {
  int64_t i = 0;
#ifdef BATON_LANES_16
  i = fn(F32x16{}, i);
#endif
#ifdef BATON_LANES_8
  i = fn(F32x8{}, i);
#endif
  return i;
}

// fn(V{}) with the widest registers the build has whose width divides n; false if none does.
template <typename Fn>
inline bool widest_dividing(int64_t n, Fn&& fn) {
#ifdef BATON_LANES_16
  if (n % F32x16::kWidth == 0) {
    fn(F32x16{});
    return true;
  }
#endif
#ifdef BATON_LANES_8
  if (n % F32x8::kWidth == 0) {
    fn(F32x8{});
    return true;
  }
#endif
  return false;
}

}  // namespace lanes
