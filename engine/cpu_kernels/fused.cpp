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

#include "f32_lanes.h"
#include "vec_math.h"
#include "no_gil.h"

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

// silu(g) * u for a row, silu rounded as the element type holds it.
template <typename T>
inline void silu_mul_row(const T* g, const T* u, T* o, int64_t I) {
  int64_t i = lanes::each_width([&](auto v, int64_t i) {
    using V = decltype(v);
    for (; i + V::kWidth <= I; i += V::kWidth) V::store(o + i, lanes::silu_mul<V, T>(V::load(g + i), V::load(u + i)));
    return i;
  });
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
  // Intrinsics: gcc vectorised the bfloat16 loops below with integer rounding.
  const bool vectors = lanes::widest_dividing(H, [&](auto v) {
    using V = decltype(v);
    auto acc = V::zero();
    for (int64_t i = 0; i < H; i += V::kWidth) acc = V::fmadd(V::load(h + i), V::load(h + i), acc);
    const auto r = V::set1(1.f / std::sqrt(V::sum(acc) / static_cast<float>(H) + eps));
    for (int64_t i = 0; i < H; i += V::kWidth)
      V::store(out + i, V::mul(V::load(w + i), V::held(V::mul(V::load(h + i), r), T{})));
  });
  if (vectors) return;
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
  int64_t i = lanes::each_width([&](auto v, int64_t i) {
    using V = decltype(v);
    for (; i + V::kWidth <= H; i += V::kWidth) V::store(dst + i, V::add(V::load(a + i), V::load(b + i)));
    return i;
  });
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

// x * cos + rotate_half(x) * sin for one head, rotate_half(x) = [-x[half:], x[:half]], on V's
// lanes (`half` a multiple of their width)...
template <typename V, typename T>
inline void rotate_head(const T* x, const T* c, const T* s, int64_t half, T* o) {
  const T z{};
  for (int64_t i = 0; i < half; i += V::kWidth) {
    const auto lo = V::load(x + i), hi = V::load(x + i + half);
    V::store(o + i, V::sub(V::held(V::mul(lo, V::load(c + i)), z), V::held(V::mul(hi, V::load(s + i)), z)));
    V::store(o + i + half,
             V::add(V::held(V::mul(hi, V::load(c + i + half)), z), V::held(V::mul(lo, V::load(s + i + half)), z)));
  }
}

// ... and one value at a time, for head sizes no register width divides.
template <typename T>
inline void rotate_head_scalar(const T* x, const T* c, const T* s, int64_t D, T* o) {
  const int64_t half = D / 2;
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
  auto each_head = [&](auto rotate) {
    at::parallel_for(0, Tn, grain_for(H * D), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t p = pos[t];
        TORCH_CHECK(p >= 0 && p < P, "rotary: position ", p, " outside the table of ", P);
        for (int64_t h = 0; h < H; ++h) rotate(xp + t * row + h * D, cp + p * D, sp + p * D, op + (t * H + h) * D);
      }
    });
  };
  // The register width chosen once a call, not once a head (chosen per head, the choice kept
  // the head's loop from being inlined: 58 -> 68 us for 256 tokens' q and k, one thread).
  const bool vectors = lanes::widest_dividing(D / 2, [&](auto v) {
    each_head([&](const T* x, const T* c, const T* s, T* o) { rotate_head<decltype(v)>(x, c, s, D / 2, o); });
  });
  if (!vectors) each_head([&](const T* x, const T* c, const T* s, T* o) { rotate_head_scalar(x, c, s, D, o); });
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
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up (CPU, float32 or bfloat16)", NoGil());
  m.def("rms_norm", &rms_norm, "RMSNorm (CPU, float32 or bfloat16)", NoGil());
  m.def("add_rms_norm", &add_rms_norm,
        "residual add + RMSNorm (CPU, float32 or bfloat16)", NoGil());
  m.def("rotary", &rotary, "rotary embedding, neox style (CPU, float32 or bfloat16)", NoGil());
}
