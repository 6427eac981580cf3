// Paged decode attention for CPUs: one query token per sequence, reading K/V straight from
// the paged cache (no gather copy), all query heads of a GQA group sharing each K/V read.
//
//   q            [B, Hq, D]                       float32, contiguous
//   kv_layer     [num_blocks, 2, bs, Hk, D]       float32, contiguous (one layer's cache)
//   block_tables [B, M] int64   seq_lens [B] int64   out [B, Hq, D]
//
// Work item = one sequence: pass 1 scores every position for every query head (a GQA
// group's heads share each K row read), a softmax per head, pass 2 accumulates V. Parallel
// over sequences with torch's own thread pool (at::parallel_for), so torch.set_num_threads
// governs it.
#include <torch/extension.h>
#include <ATen/Parallel.h>

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

static inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

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
      const int64_t num_blocks = (L + bs - 1) / bs;
      const int64_t* table = bt + b * M;
      probs.assign(Hq * L, 0.f);
      const float* qb = qp + b * Hq * D;
      // pass 1: scores[head][position]
      for (int64_t i = 0; i < num_blocks; ++i) {
        const float* k = kvp + table[i] * blk_stride;
        const int64_t n = std::min(bs, L - i * bs);
        for (int64_t j = 0; j < n; ++j, k += tok_stride) {
          const int64_t t = i * bs + j;
          for (int64_t hq = 0; hq < Hq; ++hq) {
            probs[hq * L + t] = fscale * dot(qb + hq * D, k + (hq / G) * D, D);
          }
        }
      }
      // softmax per query head
      for (int64_t hq = 0; hq < Hq; ++hq) {
        float* p = probs.data() + hq * L;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < L; ++t) mx = p[t] > mx ? p[t] : mx;
        float sum = 0.f;
        for (int64_t t = 0; t < L; ++t) {
          p[t] = std::exp(p[t] - mx);
          sum += p[t];
        }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < L; ++t) p[t] *= inv;
      }
      // pass 2: weighted sum of V
      float* ob = op + b * Hq * D;
      for (int64_t i = 0; i < Hq * D; ++i) ob[i] = 0.f;
      for (int64_t i = 0; i < num_blocks; ++i) {
        const float* v = kvp + table[i] * blk_stride + v_offset;
        const int64_t n = std::min(bs, L - i * bs);
        for (int64_t j = 0; j < n; ++j, v += tok_stride) {
          const int64_t t = i * bs + j;
          for (int64_t hq = 0; hq < Hq; ++hq) {
            axpy(probs[hq * L + t], v + (hq / G) * D, ob + hq * D, D);
          }
        }
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (CPU, float32)");
}
