// Paged decode attention for CPUs: one query token per sequence, reading K/V straight from
// the paged cache (no gather copy), all query heads of a GQA group sharing each K/V read.
//
//   q            [B, Hq, D]                       float32, contiguous
//   kv_layer     [num_blocks, 2, bs, Hk, D]       float32, contiguous (one layer's cache)
//   block_tables [B, M] int64   seq_lens [B] int64   out [B, Hq, D]
//
// Work item = one sequence: pass 1 scores every position for every query head (a GQA
// group's heads share each K row read), a softmax per head (vectorised exp; the 1/sum is
// applied to the output, not to every probability), pass 2 accumulates V. Parallel over
// sequences with torch's own thread pool (at::parallel_for), so torch.set_num_threads
// governs it.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

static inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Blocks are scattered over the cache and span several pages, where hardware prefetchers
// stop: while reading row j of block i, fetch row j of block i + 1 (two ahead measured
// slower: the lines are evicted before use).
static inline void prefetch_row(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(row + i, 0, 3);
}

// Calls row_fn(t, row) for each position t < L of a sequence, `row` pointing at that token's
// K rows (offset 0) or V rows (offset = V's distance from K in a block) for all KV heads,
// while prefetching the same row of the next block. Both passes walk the cache this way.
template <typename RowFn>
static inline void for_each_cached_row(const float* kv, const int64_t* table, int64_t L,
                                       int64_t bs, int64_t blk_stride, int64_t offset,
                                       int64_t tok_stride, RowFn&& row_fn) {
  const int64_t num_blocks = (L + bs - 1) / bs;
  for (int64_t i = 0; i < num_blocks; ++i) {
    const float* row = kv + table[i] * blk_stride + offset;
    const float* next = i + 1 < num_blocks ? kv + table[i + 1] * blk_stride + offset : nullptr;
    const int64_t n = std::min(bs, L - i * bs);
    for (int64_t j = 0; j < n; ++j, row += tok_stride) {
      if (next) prefetch_row(next + j * tok_stride, tok_stride);
      row_fn(i * bs + j, row);
    }
  }
}

static inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The N query heads of a GQA group against one K row (D % 8 == 0): the row is loaded once
// and the N dot products run as independent FMA chains (one chain per dot would wait on
// FMA latency at every step).
template <int N>
static inline void group_dots(const float* q, const float* k, int64_t D, float scale,
                              float* dst, int64_t dst_stride) {
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 kv = _mm256_loadu_ps(k + d);
    for (int j = 0; j < N; ++j) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * D + d), kv, acc[j]);
  }
  for (int j = 0; j < N; ++j) dst[j * dst_stride] = scale * hsum(acc[j]);
}

// out[j] += p[j] * v for the N query heads of a group sharing one V row (D % 8 == 0).
template <int N>
static inline void group_axpy(const float* p, int64_t p_stride, const float* v, int64_t D,
                              float* out) {
  __m256 w[N];
  for (int j = 0; j < N; ++j) w[j] = _mm256_set1_ps(p[j * p_stride]);
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 vv = _mm256_loadu_ps(v + d);
    for (int j = 0; j < N; ++j) {
      float* o = out + j * D + d;
      _mm256_storeu_ps(o, _mm256_fmadd_ps(w[j], vv, _mm256_loadu_ps(o)));
    }
  }
}

// Dispatch a group of G heads in chunks of at most 4 (registers: 4 accumulators + 1 row).
static inline void dots(const float* q, const float* k, int64_t G, int64_t D, float scale,
                        float* dst, int64_t dst_stride) {
  int64_t g = 0;
  for (; g + 4 <= G; g += 4) group_dots<4>(q + g * D, k, D, scale, dst + g * dst_stride, dst_stride);
  switch (G - g) {
    case 3: group_dots<3>(q + g * D, k, D, scale, dst + g * dst_stride, dst_stride); break;
    case 2: group_dots<2>(q + g * D, k, D, scale, dst + g * dst_stride, dst_stride); break;
    case 1: group_dots<1>(q + g * D, k, D, scale, dst + g * dst_stride, dst_stride); break;
    default: break;
  }
}

static inline void axpys(const float* p, int64_t p_stride, const float* v, int64_t G, int64_t D,
                         float* out) {
  int64_t g = 0;
  for (; g + 4 <= G; g += 4) group_axpy<4>(p + g * p_stride, p_stride, v, D, out + g * D);
  switch (G - g) {
    case 3: group_axpy<3>(p + g * p_stride, p_stride, v, D, out + g * D); break;
    case 2: group_axpy<2>(p + g * p_stride, p_stride, v, D, out + g * D); break;
    case 1: group_axpy<1>(p + g * p_stride, p_stride, v, D, out + g * D); break;
    default: break;
  }
}
#define BATON_HAVE_AVX2 1
#endif

void paged_decode(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                  torch::Tensor seq_lens, double scale, torch::Tensor out) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && kv.scalar_type() == torch::kFloat32,
              "cpu paged decode: float32 only");
  TORCH_CHECK(q.is_contiguous() && kv.is_contiguous() && out.is_contiguous(),
              "cpu paged decode: contiguous tensors expected");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt64 && seq_lens.scalar_type() == torch::kInt64,
              "cpu paged decode: int64 block tables and lengths expected");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t bs = kv.size(2), Hk = kv.size(3);
  TORCH_CHECK(kv.size(4) == D && Hq % Hk == 0, "cpu paged decode: head shape mismatch");
  const int64_t G = Hq / Hk;
  const int64_t M = block_tables.size(1);
  const float* qp = q.data_ptr<float>();
  const float* kvp = kv.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* sl = seq_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t tok_stride = Hk * D;
  const int64_t v_offset = bs * Hk * D;
  const int64_t blk_stride = 2 * v_offset;
  const float fscale = static_cast<float>(scale);

  // One work item per sequence: a block's K (then V) rows for all heads are one contiguous
  // stretch of memory, so the cache is streamed, not strided.
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> probs;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t L = sl[b];
      TORCH_CHECK(L >= 1 && L <= M * bs, "cpu paged decode: sequence length outside its table");
      const int64_t* table = bt + b * M;
      probs.assign(Hq * L, 0.f);
      const float* qb = qp + b * Hq * D;
      // pass 1: scores[head][position]
      for_each_cached_row(kvp, table, L, bs, blk_stride, 0, tok_stride,
                          [&](int64_t t, const float* k) {
#ifdef BATON_HAVE_AVX2
        if (D % 8 == 0) {
          for (int64_t h = 0; h < Hk; ++h) {
            dots(qb + h * G * D, k + h * D, G, D, fscale, probs.data() + h * G * L + t, L);
          }
          return;
        }
#endif
        for (int64_t hq = 0; hq < Hq; ++hq) {
          probs[hq * L + t] = fscale * dot(qb + hq * D, k + (hq / G) * D, D);
        }
      });
      // softmax per query head, unnormalised: out is scaled by 1/sum at the end
      std::vector<float> inv_sum(Hq);
      for (int64_t hq = 0; hq < Hq; ++hq) {
        float* p = probs.data() + hq * L;
        float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t t = 0; t < L; ++t) mx = p[t] > mx ? p[t] : mx;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < L; ++t) {
          p[t] = vexp(p[t] - mx);
          sum += p[t];
        }
        inv_sum[hq] = 1.f / sum;
      }
      // pass 2: weighted sum of V
      float* ob = op + b * Hq * D;
      for (int64_t i = 0; i < Hq * D; ++i) ob[i] = 0.f;
      for_each_cached_row(kvp, table, L, bs, blk_stride, v_offset, tok_stride,
                          [&](int64_t t, const float* v) {
#ifdef BATON_HAVE_AVX2
        if (D % 8 == 0) {
          for (int64_t h = 0; h < Hk; ++h) {
            axpys(probs.data() + h * G * L + t, L, v + h * D, G, D, ob + h * G * D);
          }
          return;
        }
#endif
        for (int64_t hq = 0; hq < Hq; ++hq) {
          axpy(probs[hq * L + t], v + (hq / G) * D, ob + hq * D, D);
        }
      });
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const float inv = inv_sum[hq];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ob[hq * D + d] *= inv;
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (CPU, float32)");
}
