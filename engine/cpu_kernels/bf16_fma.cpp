// bfloat16 linear layers through float32 FMAs, for CPUs with AVX-512 whose `vdpbf16ps` is
// slower than two float32 FMAs (and which have no AMX): y = x @ w^T (+ bias), each output
// summed in float32 and rounded to bfloat16 once.
//
//   bf16_fma_linear(x [M, K], w [N, K], bias [N] or empty) -> [M, N]
//       K % 32 == 0 (the caller sends other shapes elsewhere)
//
// Why our own: on the Xeon this was written on (AVX-512 BF16, AMX hidden by the hypervisor)
// `vdpbf16ps` retires one every two cycles, 82 GFLOPS a core, against two float32 FMAs a
// cycle, 166 GFLOPS; torch's bf16 linear (oneDNN's avx512_core_bf16 brgemm) ran the 125M
// preset's layers at 124 GFLOPS on two cores, and float32 MKL at 240 with twice the bytes.
// Here the weights stay bfloat16 in memory, read in place from the checkpoint's [N, K] rows
// (no second, repacked copy), and become float32 in registers: bfloat16 is float32's top
// half, so interleaving a load of 32 with zeros (`vpunpck{l,h}wd`, one instruction each)
// gives 2 x 16 float32 in a lane order that x, packed per call into float32 the same way,
// matches value for value. A register tile is 6 rows of x by 4 weight rows, a dot product
// over K in 24 accumulators, summed across lanes once at the end; the 8 conversions of a
// 32-deep step feed 48 FMAs. A work item is a chunk of weight rows (in L2 after its first
// block) against a panel of x (at most 1 MB); each 6-row block of x stays in L1 while the
// chunk's weight rows stream past it, prefetched four steps ahead (without the prefetch one
// thread ran ~80 GFLOPS, with it ~90; the same loop on operands all in L1, ~118).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <chrono>

#include "work_queue.h"
#include "no_gil.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define BATON_BF16_FMA 1

namespace {

using bf16 = c10::BFloat16;

constexpr int64_t kDepth = 32;  // bfloat16 values of K a step: one 64-byte load a weight row
constexpr int kRowsX = 6;       // rows of x in a register tile
constexpr int kRowsW = 4;       // weight rows in a register tile (outputs per row of x)
// A panel of packed x at most this many bytes stays in L2 (2 MB a core here) while every
// pass of weight rows goes over it.
constexpr int64_t kPanelBytes = int64_t{1} << 20;

// x [M, K] bfloat16 -> float32 [M, K], each 32 values of a row in the order the weights'
// unpacking gives them: the low words of each 128-bit lane first, then the high.
// (A tensor's storage: 64-byte aligned, so no load of a row's 16 values crosses a cache
// line, as with `new float[]`'s 16-byte alignment.)
torch::Tensor pack_x(const bf16* x, int64_t M, int64_t K) {
  torch::Tensor packed_tensor = torch::empty({M, K}, torch::kFloat32);
  float* packed = packed_tensor.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t m = begin; m < end; ++m)
      for (int64_t k = 0; k < K; k += kDepth) {
        const __m512i v = _mm512_loadu_si512(x + m * K + k);
        _mm512_storeu_si512(packed + m * K + k, _mm512_unpacklo_epi16(zero, v));
        _mm512_storeu_si512(packed + m * K + k + 16, _mm512_unpackhi_epi16(zero, v));
      }
  });
  return packed_tensor;
}

// The four lanes' sums of a, b, c, d.
inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // [a0+a2, a1+a3, b0+b2, b1+b3] by 128-bit quarters, then [a, b, c, d] by quarters.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));  // within each quarter: (2, 3, 0, 1)
  s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));  // then (1, 0, 3, 2): lane 0 holds the sum
  return _mm512_castps512_ps128(
      _mm512_maskz_compress_ps(0x1111, s));  // lanes 0, 4, 8, 12: a's, b's, c's, d's sums
}

inline uint16_t rounded(float f) { return c10::BFloat16(f).x; }

// y[m][r] = x[m] . w[r] (+ bias[r]) for MX rows of packed x and RW weight rows.
template <int MX, int RW>
inline void tile(const float* x, const bf16* w, int64_t K, const bf16* bias, bf16* y, int64_t ldy) {
  __m512 acc[MX][4];  // sum4's four; those past RW stay zero
  for (int m = 0; m < MX; ++m)
    for (int r = 0; r < 4; ++r) acc[m][r] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += kDepth) {
    for (int r = 0; r < RW; ++r)  // the weight rows come from L2: ask four steps ahead
      _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k + 4 * kDepth), _MM_HINT_T0);
    for (int half = 0; half < 2; ++half) {
      __m512 wv[RW];
      for (int r = 0; r < RW; ++r) {
        const __m512i raw = _mm512_loadu_si512(w + r * K + k);
        wv[r] = _mm512_castsi512_ps(half ? _mm512_unpackhi_epi16(zero, raw) : _mm512_unpacklo_epi16(zero, raw));
      }
      for (int m = 0; m < MX; ++m) {
        const __m512 xv = _mm512_loadu_ps(x + m * K + k + half * 16);
        for (int r = 0; r < RW; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
      }
    }
  }
  float b[4] = {0.f, 0.f, 0.f, 0.f};
  if (bias)
    for (int r = 0; r < RW; ++r) b[r] = static_cast<float>(bias[r]);
  for (int m = 0; m < MX; ++m) {
    alignas(16) float sums[4];
    _mm_store_ps(sums, sum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
    for (int r = 0; r < RW; ++r) y[m * ldy + r].x = rounded(sums[r] + b[r]);
  }
}

// f(std::integral_constant<int, n>) for n = min(count, kMax) >= 1.
template <int kMax, class F>
inline void with_count(int64_t count, F&& f) {
  if constexpr (kMax > 1) {
    if (count < kMax) return with_count<kMax - 1>(count, f);
  }
  f(std::integral_constant<int, kMax>{});
}

}  // namespace

// How many float32 FLOPs a second `vdpbf16ps` gives against float32 FMAs on this core: 12
// independent chains of each, a few hundred microseconds apiece. Our kernel pays one
// conversion for six FMAs; torch's bf16 linear runs on `vdpbf16ps`, so where this comes
// out well below 1 (0.49 on the Xeon above) the FMAs win. Only called where the CPU has
// AVX-512 BF16 (the function is built for it alone).
__attribute__((target("avx512bf16"))) double dpbf16_over_fma() {
  constexpr int kChains = 12;
  constexpr int64_t kSteps = 20000;
  using clock = std::chrono::steady_clock;
  const __m512bh pairs = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1, 1) in bfloat16
  const __m512 one = _mm512_set1_ps(1.f), tiny = _mm512_set1_ps(1e-9f);
  __m512 acc[kChains];
  float sink = 0.f;
  double best_dp = 1e9, best_fma = 1e9;
  // (Written out twice: a lambda would not be built for AVX-512 BF16 as this function is.)
  for (int round = 0; round < 3; ++round) {  // best of three: a preemption costs one round
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
    auto start = clock::now();
    for (int64_t i = 0; i < kSteps; ++i) {
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], pairs, pairs);
      __asm__ volatile("" : "+v"(acc[0]));  // every step done, none folded away
    }
    best_dp = std::min(best_dp, std::chrono::duration<double>(clock::now() - start).count());
    for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
    start = clock::now();
    for (int64_t i = 0; i < kSteps; ++i) {
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], one, tiny);
      __asm__ volatile("" : "+v"(acc[0]));
    }
    best_fma = std::min(best_fma, std::chrono::duration<double>(clock::now() - start).count());
    for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
  }
  __asm__ volatile("" : : "x"(sink));
  // 64 FLOPs a `vdpbf16ps` (16 lanes, two products and their sum), 32 an FMA.
  return (64.0 / best_dp) / (32.0 / best_fma);
}

torch::Tensor bf16_fma_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "bf16_fma_linear: contiguous bfloat16 x [M, K] expected");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == x.size(1),
              "bf16_fma_linear: contiguous bfloat16 w [N, K] expected");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % kDepth == 0, "bf16_fma_linear: K a multiple of 32 expected, got K=", K);
  const bf16* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kBFloat16 && bias->is_contiguous() &&
                    bias->numel() == N,
                "bf16_fma_linear: bias of N bfloat16 expected");
    bp = reinterpret_cast<const bf16*>(bias->data_ptr());
  }
  auto y = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const bf16* wp = reinterpret_cast<const bf16*>(w.data_ptr());
  bf16* yp = reinterpret_cast<bf16*>(y.data_ptr());
  const torch::Tensor packed_tensor = pack_x(reinterpret_cast<const bf16*>(x.data_ptr()), M, K);
  const float* packed = packed_tensor.data_ptr<float>();
  const int64_t panel = std::max<int64_t>(kRowsX, kPanelBytes / (K * int64_t{sizeof(float)}) / kRowsX * kRowsX);
  const int64_t panels = (M + panel - 1) / panel;
  const int64_t passes = (N + kRowsW - 1) / kRowsW;
  // A work item is a chunk of passes against one panel, panel after panel; eight chunks a
  // thread and panel, so that a preempted thread leaves little for the other to wait on.
  const int64_t chunk = std::max<int64_t>(1, passes / (8 * at::get_num_threads()));
  const int64_t chunks_a_panel = (passes + chunk - 1) / chunk;
  work_queue::run(panels * chunks_a_panel, 1, [&](work_queue::Chunks& items) {
    for (int64_t item, item_end; items.take(item, item_end);) {
      const int64_t m_begin = item / chunks_a_panel * panel, m_end = std::min(m_begin + panel, M);
      const int64_t p_begin = item % chunks_a_panel * chunk, p_end = std::min(p_begin + chunk, passes);
      for (int64_t m = m_begin; m < m_end; m += kRowsX)
        with_count<kRowsX>(m_end - m, [&](auto mx) {
          for (int64_t p = p_begin; p < p_end; ++p) {
            const int64_t n = p * kRowsW;
            with_count<kRowsW>(N - n, [&](auto rw) {
              tile<decltype(mx)::value, decltype(rw)::value>(packed + m * K, wp + n * K, K,
                                                             bp ? bp + n : nullptr, yp + m * N + n, N);
            });
          }
        });
    }
  });
  return y;
}
#else
torch::Tensor bf16_fma_linear(torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "bf16_fma_linear: built without AVX-512");
}
double dpbf16_over_fma() { TORCH_CHECK(false, "dpbf16_over_fma: built without AVX-512"); }
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf16_fma_linear", &bf16_fma_linear,
        "x @ w.T (+ bias) in bfloat16 through float32 FMAs (CPU, AVX-512)", NoGil());
  m.def("dpbf16_over_fma", &dpbf16_over_fma,
        "vdpbf16ps's float32 FLOPs a second over float32 FMAs' (call only with AVX-512 BF16)",
        NoGil());
#ifdef BATON_BF16_FMA
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
