// Paged decode attention for CPUs: one query token per sequence, reading K/V straight from
// the paged cache (no gather copy), all query heads of a GQA group sharing each K/V read.
// One template over the cache's element type, built into two modules: float32 and bfloat16
// (paged_decode.cpp), and int8 (kv_int8.cpp).
//
//   q            [B, Hq, D]                       float32, or bfloat16 (widened per sequence
//                                                 into a float32 buffer), contiguous
//   kv_layer     [num_blocks, 2, bs, Hk, E]       float32 or bfloat16 (E = D), or int8 (E = D + 2: the
//                                                 values, then a float16 scale; see
//                                                 engine/kv_cache/quant.py), contiguous
//   block_tables [B, M] int64   seq_lens [B] int64
//   out          [B, Hq, D]                       float32, or bfloat16 (rounded once at the
//                                                 end), contiguous
//   lse          [B, Hq] float32, optional: log-sum-exp of each head's scaled scores
//
// Work item = one sequence: pass 1 scores every position for every query head (a GQA
// group's heads share each K row read), a softmax per head (vectorised exp; the 1/sum is
// applied to the output, not to every probability), pass 2 accumulates V. An int8 entry is
// widened to float32 in registers (never dequantized into a copy: that took 8-15x the
// float32 kernel's time; a bfloat16 entry likewise, a shift), and its scale multiplies the
// dot product (K) or the probability (V): one multiply per entry, not per value. Parallel over
// sequences on torch's own thread pool (work_queue.h), so torch.set_num_threads governs it.
// The inner loops are AVX2 (8 lanes), or AVX-512 (16) where the module is built for it: on
// the AMX Xeon, one layer of 16 sequences x 576 positions 0.349 -> 0.293 ms in bfloat16 (64 x
// 1,100: 3.13 -> 2.62), float32 2-10% (alternating runs of both builds; outputs within 2e-7).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "f32_lanes.h"
#include "vec_math.h"
#include "work_queue.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

// -- entries ---------------------------------------------------------------------------

template <typename T>
struct Entry;

template <>
struct Entry<float> {
  static constexpr int64_t kExtra = 0;
  static constexpr c10::ScalarType kType = torch::kFloat32;
  static inline float scale(const float*, int64_t) { return 1.f; }
};

template <>
struct Entry<c10::BFloat16> {
  static constexpr int64_t kExtra = 0;
  static constexpr c10::ScalarType kType = torch::kBFloat16;
  static inline float scale(const c10::BFloat16*, int64_t) { return 1.f; }
};

template <>
struct Entry<int8_t> {
  static constexpr int64_t kExtra = 2;  // the float16 scale after the D values
  static constexpr c10::ScalarType kType = torch::kInt8;
  // IEEE half -> float without F16C (once per entry, not per value).
  static inline float scale(const int8_t* entry, int64_t D) {
    uint16_t h;
    std::memcpy(&h, entry + D, 2);
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float f;
    if (exp == 0) {
      f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    }
    const uint32_t bits =
        sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

template <typename T>
static inline float dot(const float* a, const T* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * static_cast<float>(b[i]);
  return acc;
}

template <typename T>
static inline void axpy(float alpha, const T* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * static_cast<float>(x[i]);
}

// -- walking the cache -----------------------------------------------------------------

// Blocks are scattered over the cache and span several pages, where hardware prefetchers
// stop: while reading row j of block i, fetch row j of block i + 1 (two ahead measured
// slower: the lines are evicted before use).
template <typename T>
static inline void prefetch_row(const T* row, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t i = 0; i < n * static_cast<int64_t>(sizeof(T)); i += 64) {
    __builtin_prefetch(bytes + i, 0, 3);
  }
}

// Calls row_fn(t, row) for each position t < L of a sequence, `row` pointing at that token's
// K rows (offset 0) or V rows (offset = V's distance from K in a block) for all KV heads,
// while prefetching the same row of the next block. Both passes walk the cache this way.
template <typename T, typename RowFn>
static inline void for_each_cached_row(const T* kv, const int64_t* table, int64_t L, int64_t bs,
                                       int64_t blk_stride, int64_t offset, int64_t tok_stride,
                                       RowFn&& row_fn) {
  const int64_t num_blocks = (L + bs - 1) / bs;
  for (int64_t i = 0; i < num_blocks; ++i) {
    const T* row = kv + table[i] * blk_stride + offset;
    const T* next = i + 1 < num_blocks ? kv + table[i + 1] * blk_stride + offset : nullptr;
    const int64_t n = std::min(bs, L - i * bs);
    for (int64_t j = 0; j < n; ++j, row += tok_stride) {
      if (next) prefetch_row(next + j * tok_stride, tok_stride);
      row_fn(i * bs + j, row);
    }
  }
}

// Softmax of each query head's L scores in place, unnormalised (exp(s - max)); 1/sum per
// head goes to inv_sum, applied to the output once rather than to every probability, and,
// when lse is given, log(sum of exp(score)) per head (what merging this attention with one
// over other positions needs: cascade attention, engine/attention/cascade.py).
static inline void softmax_unnormalised(float* probs, int64_t Hq, int64_t L, float* inv_sum,
                                        float* lse) {
  for (int64_t hq = 0; hq < Hq; ++hq) {
    float* p = probs + hq * L;
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
    if (lse) lse[hq] = mx + std::log(sum);
  }
}

// -- a GQA group against one row -------------------------------------------------------

// Calls fn(g, std::integral_constant<int, N>{}) for a GQA group's G heads in chunks of N <= 4
// heads from head g (registers: 4 accumulators + 1 row).
template <typename Fn>
static inline void for_head_chunks(int64_t G, Fn&& fn) {
  int64_t g = 0;
  for (; g + 4 <= G; g += 4) fn(g, std::integral_constant<int, 4>{});
  switch (G - g) {
    case 3: fn(g, std::integral_constant<int, 3>{}); break;
    case 2: fn(g, std::integral_constant<int, 2>{}); break;
    case 1: fn(g, std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

#ifdef BATON_LANES_8
// The group loops below run on f32_lanes.h's registers, the widest that divide D first (this
// module is built for AVX-512 on CPUs that have it, cpu_kernels/__init__.py's _PREFERS: half
// the loads, FMAs and stores of AVX2's for a head of 64 or 128); a cache entry (float32,
// bfloat16 or int8) is widened to float32 lanes as it loads.
using lanes::widest_dividing;

// The N query heads of a GQA group against one K row: the row is loaded once and the N dot
// products run as independent FMA chains (one chain per dot would wait on FMA latency at
// every step).
template <int N, typename V, typename T>
static inline void group_dots(const float* q, const T* k, int64_t D, float scale, float* dst,
                              int64_t dst_stride) {
  typename V::Reg acc[N];
  for (int j = 0; j < N; ++j) acc[j] = V::zero();
  for (int64_t d = 0; d < D; d += V::kWidth) {
    const typename V::Reg kv = V::load(k + d);
    for (int j = 0; j < N; ++j) acc[j] = V::fmadd(V::load(q + j * D + d), kv, acc[j]);
  }
  for (int j = 0; j < N; ++j) dst[j * dst_stride] = scale * V::sum(acc[j]);
}

// out[j] += w * p[j] * v for the N query heads of a group sharing one V row.
template <int N, typename V, typename T>
static inline void group_axpy(const float* p, int64_t p_stride, float w, const T* v, int64_t D,
                              float* out) {
  typename V::Reg wj[N];
  for (int j = 0; j < N; ++j) wj[j] = V::set1(w * p[j * p_stride]);
  for (int64_t d = 0; d < D; d += V::kWidth) {
    const typename V::Reg vv = V::load(v + d);
    for (int j = 0; j < N; ++j) {
      float* o = out + j * D + d;
      V::store(o, V::fmadd(wj[j], vv, V::load(o)));
    }
  }
}

// out[j] += sum over q < 4 of w[q] * p[j][q] * v[q]: four positions' V rows into the N heads'
// outputs at once, each output vector loaded and stored once for the four.
template <int N, typename V, typename T>
static inline void group_axpy4(const float* p, int64_t p_stride, const float* w, const T* const* v,
                               int64_t D, float* out) {
  typename V::Reg wj[4][N];
  for (int q = 0; q < 4; ++q)
    for (int j = 0; j < N; ++j) wj[q][j] = V::set1(w[q] * p[j * p_stride + q]);
  for (int64_t d = 0; d < D; d += V::kWidth) {
    const typename V::Reg v0 = V::load(v[0] + d), v1 = V::load(v[1] + d), v2 = V::load(v[2] + d),
                          v3 = V::load(v[3] + d);
    for (int j = 0; j < N; ++j) {
      float* o = out + j * D + d;
      typename V::Reg acc = V::fmadd(wj[0][j], v0, V::load(o));
      acc = V::fmadd(wj[1][j], v1, acc);
      acc = V::fmadd(wj[2][j], v2, acc);
      V::store(o, V::fmadd(wj[3][j], v3, acc));
    }
  }
}

// group_accumulate for four consecutive positions (D % 8 == 0).
template <typename T>
static inline void group_accumulate4(const float* p, int64_t p_stride, const float* w,
                                     const T* const* v, int64_t G, int64_t D, float* out) {
  widest_dividing(D, [&](auto lanes) {
    for_head_chunks(G, [&](int64_t g, auto n) {
      group_axpy4<decltype(n)::value, decltype(lanes)>(p + g * p_stride, p_stride, w, v, D,
                                                       out + g * D);
    });
  });
}
#endif

// Scores of a group's G heads against one K entry, into dst[g * dst_stride].
template <typename T>
static inline void group_scores(const float* q, const T* k, int64_t G, int64_t D, float scale,
                                float* dst, int64_t dst_stride) {
#ifdef BATON_LANES_8
  const bool vectorised = widest_dividing(D, [&](auto lanes) {
    for_head_chunks(G, [&](int64_t g, auto n) {
      group_dots<decltype(n)::value, decltype(lanes)>(q + g * D, k, D, scale,
                                                      dst + g * dst_stride, dst_stride);
    });
  });
  if (vectorised) return;
#endif
  for (int64_t g = 0; g < G; ++g) dst[g * dst_stride] = scale * dot(q + g * D, k, D);
}

// out[g] += w * p[g * p_stride] * v for a group's G heads and one V entry.
template <typename T>
static inline void group_accumulate(const float* p, int64_t p_stride, float w, const T* v,
                                    int64_t G, int64_t D, float* out) {
#ifdef BATON_LANES_8
  const bool vectorised = widest_dividing(D, [&](auto lanes) {
    for_head_chunks(G, [&](int64_t g, auto n) {
      group_axpy<decltype(n)::value, decltype(lanes)>(p + g * p_stride, p_stride, w, v, D,
                                                      out + g * D);
    });
  });
  if (vectorised) return;
#endif
  for (int64_t g = 0; g < G; ++g) axpy(w * p[g * p_stride], v, out + g * D, D);
}

// -- the kernel ------------------------------------------------------------------------

// Pass 1 row by row: each position's K entry against its GQA group's queries, for every
// entry type (paged_decode_amx.cpp brings a tile version for bfloat16 queries and cache).
struct RowScores {
  template <typename T>
  void operator()(const float* qb, const T* kv, const int64_t* table, int64_t L, int64_t bs,
                  int64_t blk_stride, int64_t tok_stride, int64_t entry, int64_t Hk, int64_t G,
                  int64_t D, float scale, float* probs) const {
    for_each_cached_row(kv, table, L, bs, blk_stride, 0, tok_stride, [&](int64_t t, const T* k) {
      for (int64_t h = 0; h < Hk; ++h) {
        const T* e = k + h * entry;
        group_scores(qb + h * G * D, e, G, D, scale * Entry<T>::scale(e, D), probs + h * G * L + t, L);
      }
    });
  }
};

template <typename T, typename Scores = RowScores>
void paged_decode_impl(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                       torch::Tensor seq_lens, double scale, torch::Tensor out,
                       c10::optional<torch::Tensor> lse = c10::nullopt) {
  using E = Entry<T>;
  // Queries and output may be bfloat16 (a bfloat16 model's): widening the queries and rounding
  // the output here, a sequence at a time, replaces four torch ops a layer around the call
  // (widen, allocate, narrow, copy into place: ~0.16 ms a layer of (b)'s 16-row decode step).
  const auto wide_or_bf16 = [](const torch::Tensor& x) {
    return x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16;
  };
  TORCH_CHECK(wide_or_bf16(q) && wide_or_bf16(out) && kv.scalar_type() == E::kType,
              "cpu paged decode: float32 or bfloat16 queries and output and a ",
              c10::toString(E::kType), " cache expected, got ", q.scalar_type(), ", ",
              out.scalar_type(), " and ", kv.scalar_type());
  TORCH_CHECK(q.is_contiguous() && kv.is_contiguous() && out.is_contiguous(),
              "cpu paged decode: contiguous tensors expected");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt64 && seq_lens.scalar_type() == torch::kInt64,
              "cpu paged decode: int64 block tables and lengths expected");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t bs = kv.size(2), Hk = kv.size(3), entry = kv.size(4);
  TORCH_CHECK(entry == D + E::kExtra && Hq % Hk == 0, "cpu paged decode: head shape mismatch");
  const int64_t G = Hq / Hk;
  const int64_t M = block_tables.size(1);
  TORCH_CHECK(out.sizes() == q.sizes(), "cpu paged decode: out must have q's shape");
  const bool q_bf16 = q.scalar_type() == torch::kBFloat16;
  const bool out_bf16 = out.scalar_type() == torch::kBFloat16;
  const void* qp = q.data_ptr();
  const T* kvp = kv.data_ptr<T>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* sl = seq_lens.data_ptr<int64_t>();
  void* op = out.data_ptr();
  float* lp = nullptr;
  if (lse.has_value() && lse->defined()) {
    TORCH_CHECK(lse->scalar_type() == torch::kFloat32 && lse->is_contiguous() && lse->numel() == B * Hq,
                "cpu paged decode: lse must be float32 [B, Hq], contiguous");
    lp = lse->data_ptr<float>();
  }
  const int64_t tok_stride = Hk * entry;
  const int64_t v_offset = bs * Hk * entry;
  const int64_t blk_stride = 2 * v_offset;
  const float fscale = static_cast<float>(scale);

  // One work item per sequence: a block's K (then V) rows for all heads are one contiguous
  // stretch of memory, so the cache is streamed, not strided. Sequences are taken one at a
  // time from a queue (work_queue.h), not split in halves.
  work_queue::run(B, 1, [&](work_queue::Chunks& sequences) {
    std::vector<float> probs;
    std::vector<float> inv_sum(Hq);
    std::vector<float> q_wide(q_bf16 ? Hq * D : 0), out_wide(out_bf16 ? Hq * D : 0);
    for (int64_t b, end; sequences.take(b, end);) {
      const int64_t L = sl[b];
      TORCH_CHECK(L >= 1 && L <= M * bs, "cpu paged decode: sequence length outside its table");
      const int64_t* table = bt + b * M;
      probs.assign(Hq * L, 0.f);
      const float* qb = q_wide.data();
      if (q_bf16) {
        const c10::BFloat16* src = static_cast<const c10::BFloat16*>(qp) + b * Hq * D;
        for (int64_t i = 0; i < Hq * D; ++i) q_wide[i] = static_cast<float>(src[i]);
      } else {
        qb = static_cast<const float*>(qp) + b * Hq * D;
      }
      // pass 1: scores[head][position]
      Scores{}(qb, kvp, table, L, bs, blk_stride, tok_stride, entry, Hk, G, D, fscale, probs.data());
      softmax_unnormalised(probs.data(), Hq, L, inv_sum.data(), lp ? lp + b * Hq : nullptr);
      // pass 2: weighted sum of V
      float* ob = out_bf16 ? out_wide.data() : static_cast<float*>(op) + b * Hq * D;
      for (int64_t i = 0; i < Hq * D; ++i) ob[i] = 0.f;
#ifdef BATON_LANES_8
      if (D % 8 == 0) {  // four positions of a block at a time (group_axpy4)
        const int64_t num_blocks = (L + bs - 1) / bs;
        for (int64_t i = 0; i < num_blocks; ++i) {
          const T* rows = kvp + table[i] * blk_stride + v_offset;
          const T* next = i + 1 < num_blocks ? kvp + table[i + 1] * blk_stride + v_offset : nullptr;
          const int64_t n = std::min(bs, L - i * bs);
          int64_t r = 0;
          for (; r + 4 <= n; r += 4) {
            if (next)
              for (int64_t q = 0; q < 4; ++q) prefetch_row(next + (r + q) * tok_stride, tok_stride);
            for (int64_t h = 0; h < Hk; ++h) {
              const T* v4[4];
              float w4[4];
              for (int64_t q = 0; q < 4; ++q) {
                v4[q] = rows + (r + q) * tok_stride + h * entry;
                w4[q] = E::scale(v4[q], D);
              }
              group_accumulate4(probs.data() + h * G * L + i * bs + r, L, w4, v4, G, D, ob + h * G * D);
            }
          }
          for (; r < n; ++r) {
            const T* v = rows + r * tok_stride;
            for (int64_t h = 0; h < Hk; ++h) {
              const T* e = v + h * entry;
              group_accumulate(probs.data() + h * G * L + i * bs + r, L, E::scale(e, D), e, G, D, ob + h * G * D);
            }
          }
        }
      } else
#endif
      {
        for_each_cached_row(kvp, table, L, bs, blk_stride, v_offset, tok_stride, [&](int64_t t, const T* v) {
          for (int64_t h = 0; h < Hk; ++h) {
            const T* e = v + h * entry;
            group_accumulate(probs.data() + h * G * L + t, L, E::scale(e, D), e, G, D, ob + h * G * D);
          }
        });
      }
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const float inv = inv_sum[hq];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ob[hq * D + d] *= inv;
      }
      if (out_bf16) {
        c10::BFloat16* dst = static_cast<c10::BFloat16*>(op) + b * Hq * D;
        for (int64_t i = 0; i < Hq * D; ++i) dst[i] = c10::BFloat16(ob[i]);
      }
    }
  });
}
