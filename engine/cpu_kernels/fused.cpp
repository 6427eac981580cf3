// Fused elementwise layers for CPUs: one pass over memory where PyTorch makes several.
//
//   silu_and_mul(x [T, 2I]) -> [T, I]             silu(x[:, :I]) * x[:, I:]
//   rms_norm(x [T, H], w [H], eps)                -> w * (x * rsqrt(mean(x^2) + eps))
//   add_rms_norm(x, residual, w, eps)             -> (rms_norm(x + residual), x + residual)
//   rotary(positions [T], q [T, Hq, D], k [T, Hk, D], cos [P, D], sin [P, D])
//                                                 -> (q, k) rotated (neox style), contiguous
//
// float32, contiguous rows; parallel over rows with torch's thread pool (small batches stay
// on one thread: waking the pool costs more than the work). The arithmetic follows the order
// Hugging Face uses (normalise, then scale by the weight) so greedy outputs still match.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "vec_math.h"

namespace {

int64_t grain_for(int64_t cols) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(cols, 1)); }

void check_rows(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, what, ": float32 expected");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), what, ": a contiguous 2-D tensor expected");
}

inline void norm_row(const float* h, const float* w, float eps, int64_t H, float* out) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < H; ++i) ss += h[i] * h[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
#pragma omp simd
  for (int64_t i = 0; i < H; ++i) out[i] = w[i] * (h[i] * r);
}

}  // namespace

torch::Tensor silu_and_mul(torch::Tensor x) {
  check_rows(x, "silu_and_mul");
  TORCH_CHECK(x.size(1) % 2 == 0, "silu_and_mul: an even number of columns expected");
  const int64_t T = x.size(0), I = x.size(1) / 2;
  auto out = torch::empty({T, I}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain_for(I), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = xp + t * 2 * I;
      const float* u = g + I;
      float* o = op + t * I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.f + vexp(-g[i])) * u[i];
    }
  });
  return out;
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, "rms_norm");
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(w.numel() == H && w.is_contiguous() && w.scalar_type() == torch::kFloat32,
              "rms_norm: weight shape mismatch");
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain_for(H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) norm_row(xp + t * H, wp, eps, H, op + t * H);
  });
  return out;
}

std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor w,
                                        double eps) {
  check_rows(x, "add_rms_norm");
  check_rows(residual, "add_rms_norm");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_rms_norm: x and residual shapes differ");
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(w.numel() == H && w.is_contiguous() && w.scalar_type() == torch::kFloat32,
              "add_rms_norm: weight shape mismatch");
  auto out = torch::empty_like(x);
  auto sum = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* rp = residual.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* sp = sum.data_ptr<float>();
  at::parallel_for(0, T, grain_for(H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* h = sp + t * H;
#pragma omp simd
      for (int64_t i = 0; i < H; ++i) h[i] = xp[t * H + i] + rp[t * H + i];
      norm_row(h, wp, eps, H, op + t * H);
    }
  });
  return {out, sum};
}

namespace {

// x * cos + rotate_half(x) * sin for one head, rotate_half(x) = [-x[half:], x[:half]].
inline void rotate_head(const float* x, const float* c, const float* s, int64_t D, float* o) {
  const int64_t half = D / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) o[i] = x[i] * c[i] - x[i + half] * s[i];
#pragma omp simd
  for (int64_t i = half; i < D; ++i) o[i] = x[i] * c[i] + x[i - half] * s[i];
}

// A [T, H, D] view whose heads are contiguous rows of D (rows may be strided, as the q / k
// slices of a fused qkv projection are).
void check_heads(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 3, what, ": float32 [T, H, D]");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), what, ": heads must be contiguous");
}

torch::Tensor rotate_all(const torch::Tensor& x, const int64_t* pos, const float* cp,
                         const float* sp, int64_t P) {
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), row = x.stride(0);
  auto out = torch::empty({T, H, D}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain_for(H * D), [&](int64_t begin, int64_t end) {
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
  check_heads(q, "rotary q");
  check_heads(k, "rotary k");
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous() &&
                  positions.numel() == q.size(0) && k.size(0) == q.size(0),
              "rotary: one int64 position per token expected");
  const int64_t D = q.size(2);
  TORCH_CHECK(k.size(2) == D && D % 2 == 0, "rotary: q and k need the same even head size");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 && cos.size(1) == D &&
                  sin.sizes() == cos.sizes() && cos.scalar_type() == torch::kFloat32,
              "rotary: float32 [positions, head_dim] cos / sin tables expected");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  return {rotate_all(q, pos, cp, sp, cos.size(0)), rotate_all(k, pos, cp, sp, cos.size(0))};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up (CPU, float32)");
  m.def("rms_norm", &rms_norm, "RMSNorm (CPU, float32)");
  m.def("add_rms_norm", &add_rms_norm, "residual add + RMSNorm (CPU, float32)");
  m.def("rotary", &rotary, "rotary embedding, neox style (CPU, float32)");
}
