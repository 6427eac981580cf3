// Fused elementwise layers for CPUs: one pass over memory where PyTorch makes several.
//
//   silu_and_mul(x [T, 2I]) -> [T, I]             silu(x[:, :I]) * x[:, I:]
//   rms_norm(x [T, H], w [H], eps)                -> w * (x * rsqrt(mean(x^2) + eps))
//   add_rms_norm(x, residual, w, eps)             -> (rms_norm(x + residual), x + residual)
//   rotary(positions [T], q [T, Hq, D], k [T, Hk, D], cos [P, D], sin [P, D])
//                                                 -> (q, k) rotated (neox style), contiguous
//
// float32 or bfloat16 (every tensor of a call the same), contiguous rows; parallel over rows
// with torch's thread pool (small batches stay on one thread: waking the pool costs more
// than the work). The arithmetic follows the order Hugging Face uses (normalise, then scale
// by the weight) so greedy outputs still match; in bfloat16 a value is rounded wherever
// PyTorch's bfloat16 ops round it (each op's result: the norm before the weight, silu before
// the product, both products of the rotation before their sum), the work between in float32
// as PyTorch does it, so the fused layers give what the unfused ones give, not a more
// precise answer that would move greedy tokens away from the reference's.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstring>

#include "vec_math.h"

namespace {

using bf16 = c10::BFloat16;

// bfloat16 <-> float32 without c10's branch on NaN, which keeps gcc from vectorising a loop:
// round to nearest even, NaN to the quiet NaN c10 gives.
inline uint16_t bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return v != v ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}
inline float wide(float v) { return v; }
inline float wide(bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T>
inline T narrow(float v);
template <>
inline float narrow<float>(float v) {
  return v;
}
template <>
inline bf16 narrow<bf16>(float v) {
  return bf16(bf16_bits(v), bf16::from_bits());
}
// A value as the element type `T` holds it: float32 keeps it, bfloat16 rounds it.
template <typename T>
inline float held(float v) {
  return wide(narrow<T>(v));
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
// One instruction rounds 8 lanes to bfloat16, to nearest even (the fused build prefers this
// ISA where the CPU has it: the integer version below took ~2.5x a float32 row's time).
inline __m128i bf16_8(__m256 v) { return (__m128i)_mm256_cvtneps_pbh(v); }
#else
// 8 lanes rounded as bf16_bits does.
inline __m128i bf16_8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i b = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}
#endif
inline __m256 held8(__m256 v, float) { return v; }
inline __m256 held8(__m256 v, bf16) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bf16_8(v)), 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(bf16* p, __m256 v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_8(v)); }
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// 16 lanes where the build has AVX-512 BF16 (the same lane math as the 8-lane helpers, so
// every value comes out as it did; the 256-token prefill's SiLU-and-mul / residual-add norms
// took 162 / 46 us a layer on 8 lanes, 124 / 32 on 16).
#define BATON_FUSED_16 1
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m256i bf16_16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
inline __m512 held16(__m512 v, float) { return v; }
inline __m512 held16(__m512 v, bf16) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_16(v)), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(bf16* p, __m512 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_16(v)); }
#endif

// silu(g) * u for a row, silu rounded as the element type holds it.
template <typename T>
inline void silu_mul_row(const T* g, const T* u, T* o, int64_t I) {
  int64_t i = 0;
#ifdef BATON_FUSED_16
  for (; i + 16 <= I; i += 16) {
    const __m512 gv = load16(g + i);
    const __m512 e = vexp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.f), e));
    store16(o + i, _mm512_mul_ps(held16(silu, T{}), load16(u + i)));
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= I; i += 8) {  // vexp8: see vec_math.h for why not an omp simd loop
    const __m256 gv = load8(g + i);
    const __m256 e = vexp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
    store8(o + i, _mm256_mul_ps(held8(silu, T{}), load8(u + i)));
  }
#endif
  for (; i < I; ++i) {
    const float gi = wide(g[i]);
    o[i] = narrow<T>(held<T>(gi / (1.f + vexp(-gi))) * wide(u[i]));
  }
}

int64_t grain_for(int64_t cols) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(cols, 1)); }

void check_rows(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16, what,
              ": float32 or bfloat16 expected");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), what, ": a contiguous 2-D tensor expected");
}

void check_same_type(const torch::Tensor& x, const torch::Tensor& other, const char* what) {
  TORCH_CHECK(other.scalar_type() == x.scalar_type(), what, ": ", x.scalar_type(), " and ",
              other.scalar_type(), " mixed");
}

// Calls fn(T{}) with T the C++ type of float32 or bfloat16 `type`.
template <typename Fn>
auto dispatch(c10::ScalarType type, Fn&& fn) {
  if (type == torch::kBFloat16) return fn(bf16{});
  return fn(float{});
}

template <typename T>
inline void norm_row(const T* h, const T* w, float eps, int64_t H, T* out) {
#ifdef BATON_FUSED_16
  if (H % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < H; i += 16) acc = _mm512_fmadd_ps(load16(h + i), load16(h + i), acc);
    const __m512 r = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(H) + eps));
    for (int64_t i = 0; i < H; i += 16)
      store16(out + i, _mm512_mul_ps(load16(w + i), held16(_mm512_mul_ps(load16(h + i), r), T{})));
    return;
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (H % 8 == 0) {  // intrinsics: gcc vectorised the bfloat16 loops below with integer rounding
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < H; i += 8) acc = _mm256_fmadd_ps(load8(h + i), load8(h + i), acc);
    const __m256 r = _mm256_set1_ps(1.f / std::sqrt(hsum8(acc) / static_cast<float>(H) + eps));
    for (int64_t i = 0; i < H; i += 8)
      store8(out + i, _mm256_mul_ps(load8(w + i), held8(_mm256_mul_ps(load8(h + i), r), T{})));
    return;
  }
#endif
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < H; ++i) ss += wide(h[i]) * wide(h[i]);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
#pragma omp simd
  for (int64_t i = 0; i < H; ++i) out[i] = narrow<T>(wide(w[i]) * held<T>(wide(h[i]) * r));
}

// dst = held(a + b), a row.
template <typename T>
inline void add_row(const T* a, const T* b, int64_t H, T* dst) {
  int64_t i = 0;
#ifdef BATON_FUSED_16
  for (; i + 16 <= H; i += 16) store16(dst + i, _mm512_add_ps(load16(a + i), load16(b + i)));
#endif
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= H; i += 8) store8(dst + i, _mm256_add_ps(load8(a + i), load8(b + i)));
#endif
  for (; i < H; ++i) dst[i] = narrow<T>(wide(a[i]) + wide(b[i]));
}

template <typename T>
inline T* ptr(const torch::Tensor& x) {
  return reinterpret_cast<T*>(x.data_ptr());
}

}  // namespace

torch::Tensor silu_and_mul(torch::Tensor x) {
  check_rows(x, "silu_and_mul");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: an even number of columns expected");
  const int64_t T = x.size(0), I = x.size(1) / 2;
  auto out = torch::empty({T, I}, x.options());
  dispatch(x.scalar_type(), [&](auto type) {
    using E = decltype(type);
    const E* xp = ptr<E>(x);
    E* op = ptr<E>(out);
    at::parallel_for(0, T, grain_for(I), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) silu_mul_row(xp + t * 2 * I, xp + t * 2 * I + I, op + t * I, I);
    });
  });
  return out;
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, "rms_norm");
  check_same_type(x, w, "rms_norm");
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(w.numel() == H && w.is_contiguous(), "rms_norm: weight shape mismatch");
  auto out = torch::empty_like(x);
  dispatch(x.scalar_type(), [&](auto type) {
    using E = decltype(type);
    const E *xp = ptr<E>(x), *wp = ptr<E>(w);
    E* op = ptr<E>(out);
    at::parallel_for(0, T, grain_for(H), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) norm_row(xp + t * H, wp, eps, H, op + t * H);
    });
  });
  return out;
}

std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor w,
                                        double eps) {
  check_rows(x, "add_rms_norm");
  check_rows(residual, "add_rms_norm");
  check_same_type(x, residual, "add_rms_norm");
  check_same_type(x, w, "add_rms_norm");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_rms_norm: x and residual shapes differ");
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(w.numel() == H && w.is_contiguous(), "add_rms_norm: weight shape mismatch");
  auto out = torch::empty_like(x);
  auto sum = torch::empty_like(x);
  dispatch(x.scalar_type(), [&](auto type) {
    using E = decltype(type);
    const E *xp = ptr<E>(x), *rp = ptr<E>(residual), *wp = ptr<E>(w);
    E *op = ptr<E>(out), *sp = ptr<E>(sum);
    at::parallel_for(0, T, grain_for(H), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        E* h = sp + t * H;
        add_row(xp + t * H, rp + t * H, H, h);
        norm_row(h, wp, eps, H, op + t * H);
      }
    });
  });
  return {out, sum};
}

namespace {

// x * cos + rotate_half(x) * sin for one head, rotate_half(x) = [-x[half:], x[:half]].
template <typename T>
inline void rotate_head(const T* x, const T* c, const T* s, int64_t D, T* o) {
  const int64_t half = D / 2;
#ifdef BATON_FUSED_16
  if (half % 16 == 0) {
    const T z{};
    for (int64_t i = 0; i < half; i += 16) {
      const __m512 lo = load16(x + i), hi = load16(x + i + half);
      store16(o + i, _mm512_sub_ps(held16(_mm512_mul_ps(lo, load16(c + i)), z),
                                   held16(_mm512_mul_ps(hi, load16(s + i)), z)));
      store16(o + i + half, _mm512_add_ps(held16(_mm512_mul_ps(hi, load16(c + i + half)), z),
                                          held16(_mm512_mul_ps(lo, load16(s + i + half)), z)));
    }
    return;
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (half % 8 == 0) {
    const T z{};
    for (int64_t i = 0; i < half; i += 8) {
      const __m256 lo = load8(x + i), hi = load8(x + i + half);
      store8(o + i, _mm256_sub_ps(held8(_mm256_mul_ps(lo, load8(c + i)), z),
                                  held8(_mm256_mul_ps(hi, load8(s + i)), z)));
      store8(o + i + half, _mm256_add_ps(held8(_mm256_mul_ps(hi, load8(c + i + half)), z),
                                         held8(_mm256_mul_ps(lo, load8(s + i + half)), z)));
    }
    return;
  }
#endif
#pragma omp simd
  for (int64_t i = 0; i < half; ++i)
    o[i] = narrow<T>(held<T>(wide(x[i]) * wide(c[i])) - held<T>(wide(x[i + half]) * wide(s[i])));
#pragma omp simd
  for (int64_t i = half; i < D; ++i)
    o[i] = narrow<T>(held<T>(wide(x[i]) * wide(c[i])) + held<T>(wide(x[i - half]) * wide(s[i])));
}

// A [T, H, D] view whose heads are contiguous rows of D (rows may be strided, as the q / k
// slices of a fused qkv projection are).
void check_heads(const torch::Tensor& x, const torch::Tensor& table, const char* what) {
  TORCH_CHECK(x.scalar_type() == table.scalar_type() && x.dim() == 3, what,
              ": [T, H, D] of the cos / sin tables' dtype expected");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), what, ": heads must be contiguous");
}

template <typename T>
torch::Tensor rotate_all(const torch::Tensor& x, const int64_t* pos, const T* cp, const T* sp,
                         int64_t P) {
  const int64_t Tn = x.size(0), H = x.size(1), D = x.size(2), row = x.stride(0);
  auto out = torch::empty({Tn, H, D}, x.options());
  const T* xp = ptr<T>(x);
  T* op = ptr<T>(out);
  at::parallel_for(0, Tn, grain_for(H * D), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t p = pos[t];
      TORCH_CHECK(p >= 0 && p < P, "rotary: position ", p, " outside the table of ", P);
      for (int64_t h = 0; h < H; ++h) {
        rotate_head(xp + t * row + h * D, cp + p * D, sp + p * D, D, op + (t * H + h) * D);
      }
    }
  });
  return out;
}

}  // namespace

std::vector<torch::Tensor> rotary(torch::Tensor positions, torch::Tensor q, torch::Tensor k,
                                  torch::Tensor cos, torch::Tensor sin) {
  check_heads(q, cos, "rotary q");
  check_heads(k, cos, "rotary k");
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous() &&
                  positions.numel() == q.size(0) && k.size(0) == q.size(0),
              "rotary: one int64 position per token expected");
  const int64_t D = q.size(2);
  TORCH_CHECK(k.size(2) == D && D % 2 == 0, "rotary: q and k need the same even head size");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 && cos.size(1) == D &&
                  sin.sizes() == cos.sizes() && sin.scalar_type() == cos.scalar_type() &&
                  (cos.scalar_type() == torch::kFloat32 || cos.scalar_type() == torch::kBFloat16),
              "rotary: float32 or bfloat16 [positions, head_dim] cos / sin tables expected");
  const int64_t* pos = positions.data_ptr<int64_t>();
  return dispatch(cos.scalar_type(), [&](auto type) {
    using E = decltype(type);
    const E *cp = ptr<E>(cos), *sp = ptr<E>(sin);
    return std::vector<torch::Tensor>{rotate_all(q, pos, cp, sp, cos.size(0)),
                                      rotate_all(k, pos, cp, sp, cos.size(0))};
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up (CPU, float32 or bfloat16)");
  m.def("rms_norm", &rms_norm, "RMSNorm (CPU, float32 or bfloat16)");
  m.def("add_rms_norm", &add_rms_norm, "residual add + RMSNorm (CPU, float32 or bfloat16)");
  m.def("rotary", &rotary, "rotary embedding, neox style (CPU, float32 or bfloat16)");
}
