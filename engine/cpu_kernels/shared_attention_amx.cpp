// Attention of many queries over runs of cache blocks, on AMX, for a bfloat16 cache and
// queries: the shared part of cascade attention (engine/attention/cascade.py), and a prompt
// chunk over its cached context and itself (engine/attention/cpu_paged.py).
//
//   shared_attention_bf16(q [B, Hq, D] bf16, kv [num_blocks, 2, bs, Hk, D] bf16,
//                         blocks [P] int64, scale, out [B, Hq, D] f32, lse [B, Hq] f32,
//                         rows [n] int64 = all, merge = false, last [n] int64 = none)
//
// Each of `rows` (q's rows of one group; all of them by default) attends the positions of
// `blocks` with every head: all P * bs of them (cascade shares only positions before every
// query), or, given `last`, those up to its own last position (causal; the walk ends at the
// furthest, and what the cache holds past it is never used). Its out rows get the attention,
// its lse rows each head's log-sum-exp of the scaled scores; or, with `merge`, out / lse
// already hold the attention over the rows' own positions and get the attention over both
// (the softmax's two partial sums weighted together), so a decode step's groups need no
// gather, copy or merge outside the kernel.
//
// Why our own: cascade gathered the shared K / V into a copy every layer and ran torch's CPU
// flash attention over it. For a handful of decode rows that fixed cost was more than the
// paged kernel's reads it saved, so a tenant's few rows on one system prompt each read the
// whole prompt's K / V again; and a prompt chunk after cached context gathered that whole
// context into a copy and built a mask for torch's attention. Here the blocks are read in
// place, once per KV head and 16 queries, with no copy:
//
//   scores  S [16 positions x 16 queries] = K rows (A: read from the cache, the token stride
//           apart) x queries (B: packed once into AMX's pairs layout)
//   softmax online over the positions, a running max and sum per query, on the 16 queries'
//           lanes at once (S's rows are positions, so no horizontal reductions)
//   values  O [16 queries x 16 of D] += P^T (A: the probabilities transposed in registers,
//           rounded to bfloat16) x V (B: two positions' rows interleaved), 32 positions a
//           product
//
// A work item is one KV head and 16 of its queries (a GQA group's heads of successive rows,
// and so on); the items run on torch's thread pool. The scores' products are exact in
// float32 and summed in float32, as in the paged kernel; the probabilities meet V in
// bfloat16, as in flash attention over bfloat16 (their sum stays float32).
//
// Needs: block size a multiple of 16, head size a multiple of 32 up to 256 (the caller sends
// other shapes to the gather and flash attention path).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "amx.h"
#include "f32_lanes.h"

#ifdef BATON_AMX
namespace {

using bf16 = c10::BFloat16;
using amx::kDepth;  // bfloat16 values in a tile row: D per score product, positions per V product
using amx::kRows;   // a tile's rows: positions of S, queries of O
using V16 = lanes::F32x16;

// Tiles (the intrinsics take literal numbers): 0 scores (C), 1 keys / values (A / B), 2
// queries / values (B), 3 probabilities (A), 4 .. 7 the output (C; with D > 64, 4 values and
// 5 a product over V).
constexpr int kTiles = 8;
constexpr int64_t kMaxHead = 256;

struct Layout {
  int64_t Hq, Hk, G, D, bs, tok_stride, blk_stride, v_offset, subtiles;
  const int64_t* rows;  // the group's rows of q / out / lse (nullptr: all, in order)
  bool merge;           // out / lse hold the attention over the rows' other positions
  const int64_t* last;  // per member, the last position it attends (nullptr: all of them)
  int64_t row(int64_t member) const { return rows ? rows[member] : member; }
};

// Where the 16 positions of sub-tile t start, in K (V: + v_offset).
inline const bf16* subtile(const bf16* kv, const int64_t* blocks, const Layout& s, int64_t t,
                           int64_t h) {
  const int64_t pos = t * kRows;
  return kv + blocks[pos / s.bs] * s.blk_stride + (pos % s.bs) * s.tok_stride + h * s.D;
}

// B for the scores: per 32 values of D, row p holds each query's values 2p and 2p + 1.
void pack_queries(const bf16* q, const Layout& s, int64_t h, int64_t col0, int64_t cols,
                  bf16* packed) {
  std::fill(packed, packed + s.D * kRows, bf16(0.f));
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t col = col0 + j, n = s.row(col / s.G), g = col % s.G;
    const bf16* src = q + (n * s.Hq + h * s.G + g) * s.D;
    for (int64_t d = 0; d < s.D; ++d)
      packed[((d / kDepth) * kRows + d % kDepth / 2) * 2 * kRows + j * 2 + d % 2] = src[d];
  }
}

// B for the values: for each 16 of D, row p holds the unit's positions 2p and 2p + 1
// interleaved. Positions from `end` on (a missing second sub-tile; past the last a causal
// walk attends) are zeros: their probabilities are too, but the cache there may hold
// anything, NaN included, and 0 x NaN is NaN.
void pack_values(const bf16* v0, const bf16* v1, int64_t tok_stride, int64_t D, int64_t end,
                 bf16* packed) {
  alignas(64) static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                 8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                 24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  for (int64_t p = 0; p < kRows; ++p) {
    const bf16* base = p < kRows / 2 ? v0 : v1;
    const int64_t r = 2 * p % kRows;
    for (int64_t k = 0; k < D / kDepth; ++k) {
      __m512i a = _mm512_setzero_si512(), b = a;
      if (base && 2 * p < end) a = _mm512_loadu_si512(base + r * tok_stride + k * kDepth);
      if (base && 2 * p + 1 < end) b = _mm512_loadu_si512(base + (r + 1) * tok_stride + k * kDepth);
      _mm512_store_si512(packed + ((2 * k) * kRows + p) * kDepth, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_store_si512(packed + ((2 * k + 1) * kRows + p) * kDepth, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// exp(x) for softmax arguments (a score less its query's reference max: at most kSlack),
// ~1 ulp: the range reduction and polynomial of lanes::exp with 2^n by vscalefps, which
// takes x far below the smallest float to 0 (x is first raised to -150, so -inf, the first
// unit's old max less the new, gives 0 without passing through inf - inf): 11 vector ops,
// lanes::exp's clamps and exponent arithmetic 16.
inline __m512 exp_softmax(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-150.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// A query's reference max moves only when a score passes it by more than this (its
// probabilities then reach e^8 ~ 3,000 at most: float32 sums and bfloat16 products hold
// that exactly as well as values under 1). So after the first few units the output is seldom
// rescaled, and with D <= 64 it stays in tiles the whole walk (FlashAttention-4's rule).
constexpr float kSlack = 8.f;
constexpr int64_t kOutTilesMax = 4;  // tiles 4 .. 7: the output's 16-wide slices of D <= 64

struct Scratch {
  alignas(64) float scores[2][kRows * kRows];
  alignas(64) bf16 probs[kRows * kDepth];  // P^T: 16 queries x 32 positions
  alignas(64) float partial[kRows * kRows];
  alignas(64) bf16 values[kMaxHead * kDepth];
  alignas(64) bf16 queries[kMaxHead * kRows];
  alignas(64) float acc[kRows * kMaxHead];  // the output, 16 queries x D
};

// Tiles 4 .. 3 + n (n = D / 16 <= 4) hold the output across units; the intrinsics take
// literal tile numbers, so each use is spelled out.
inline void out_tiles_zero(int64_t n) {
  _tile_zero(4);
  _tile_zero(5);
  if (n > 2) {
    _tile_zero(6);
    _tile_zero(7);
  }
}

inline void out_tiles_store(float* acc, int64_t D, int64_t n) {
  const int64_t stride = D * static_cast<int64_t>(sizeof(float));
  _tile_stored(4, acc, stride);
  _tile_stored(5, acc + kRows, stride);
  if (n > 2) {
    _tile_stored(6, acc + 2 * kRows, stride);
    _tile_stored(7, acc + 3 * kRows, stride);
  }
}

inline void out_tiles_load(const float* acc, int64_t D, int64_t n) {
  const int64_t stride = D * static_cast<int64_t>(sizeof(float));
  _tile_loadd(4, acc, stride);
  _tile_loadd(5, acc + kRows, stride);
  if (n > 2) {
    _tile_loadd(6, acc + 2 * kRows, stride);
    _tile_loadd(7, acc + 3 * kRows, stride);
  }
}

// Output tiles += P^T (tile 3) x V, a slice of D at a time (V's slices alternate tiles 1 and 2
// so a load overlaps the previous product).
inline void out_tiles_accumulate(const bf16* values, int64_t n) {
  constexpr int64_t slice = kRows * kDepth;
  _tile_loadd(1, values, 64);
  _tile_dpbf16ps(4, 3, 1);
  _tile_loadd(2, values + slice, 64);
  _tile_dpbf16ps(5, 3, 2);
  if (n > 2) {
    _tile_loadd(1, values + 2 * slice, 64);
    _tile_dpbf16ps(6, 3, 1);
    _tile_loadd(2, values + 3 * slice, 64);
    _tile_dpbf16ps(7, 3, 2);
  }
}

// out rows j (16 x D floats) *= alpha[j].
inline void scale_rows(float* acc, int64_t D, __m512 alpha) {
  alignas(64) float a[kRows];
  V16::store(a, alpha);
  for (int64_t j = 0; j < kRows; ++j)
    for (int64_t d = 0; d < D; d += kRows) {
      float* x = acc + j * D + d;
      V16::store(x, V16::mul(V16::load(x), V16::set1(a[j])));
    }
}

// One KV head and its queries col0 .. col0 + cols - 1 (cols <= 16, of the head's N * G) over
// every position: per unit of 32 positions, the scores, the softmax against each query's
// reference max, P^T (bfloat16) and the product with V.
void attend(const bf16* q, const bf16* kv, const int64_t* blocks, const Layout& s, int64_t h,
            int64_t col0, int64_t cols, float scale, float* out, float* lse, Scratch& w) {
  const int64_t D = s.D, row_bytes = s.tok_stride * static_cast<int64_t>(sizeof(bf16));
  const int64_t slices = D / kRows;
  const bool in_tiles = slices <= kOutTilesMax;  // else the output accumulates in w.acc
  pack_queries(q, s, h, col0, cols, w.queries);
  // Causal: each query's last position in a lane (the lanes past `cols` attend everything
  // the others do, so they never hold back the walk's end).
  alignas(64) int32_t last[kRows];
  int64_t end = s.subtiles * kRows;  // positions this item walks
  int64_t nearest = end;             // from here on some query masks positions
  if (s.last) {
    int64_t furthest = 0;
    for (int64_t j = 0; j < kRows; ++j) {
      const int64_t lp = j < cols ? s.last[(col0 + j) / s.G] : 0;
      last[j] = static_cast<int32_t>(lp);
      furthest = std::max(furthest, lp);
    }
    for (int64_t j = cols; j < kRows; ++j) last[j] = static_cast<int32_t>(furthest);
    end = furthest + 1;
    nearest = *std::min_element(last, last + kRows) + 1;
  }
  const __m512i last_lanes = _mm512_load_si512(last);
  if (in_tiles)
    out_tiles_zero(slices);
  else
    std::fill(w.acc, w.acc + kRows * D, 0.f);
  const __m512 vscale = V16::set1(scale);
  __m512 ref = V16::set1(-std::numeric_limits<float>::infinity()), sum = V16::zero();
  const int64_t subtiles = (end + kRows - 1) / kRows;
  for (int64_t t0 = 0; t0 < subtiles; t0 += 2) {
    const int64_t here = std::min<int64_t>(2, subtiles - t0);
    const bf16* keys[2] = {subtile(kv, blocks, s, t0, h),
                           here == 2 ? subtile(kv, blocks, s, t0 + 1, h) : nullptr};
    __m512 top = V16::set1(-std::numeric_limits<float>::infinity());
    for (int64_t u = 0; u < here; ++u) {
      _tile_zero(0);
      for (int64_t k = 0; k < D / kDepth; ++k) {
        _tile_loadd(1, keys[u] + k * kDepth, row_bytes);
        _tile_loadd(2, w.queries + k * kRows * kDepth, 64);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, w.scores[u], 64);
      const int64_t first = (t0 + u) * kRows;
      if (first + kRows > nearest) {
        // Positions past a query's last: -inf (a blend, so NaN read past the sequence goes too).
        const __m512 hidden = V16::set1(-std::numeric_limits<float>::infinity());
        for (int64_t r = 0; r < kRows; ++r) {
          const __mmask16 past = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(static_cast<int32_t>(first + r)), last_lanes);
          V16::store(w.scores[u] + r * kRows, _mm512_mask_blend_ps(past, V16::load(w.scores[u] + r * kRows), hidden));
        }
      }
      for (int64_t r = 0; r < kRows; ++r) top = _mm512_max_ps(top, V16::load(w.scores[u] + r * kRows));
    }
    top = V16::mul(top, vscale);
    __m512 alpha = V16::set1(1.f);
    if (_mm512_cmp_ps_mask(top, V16::add(ref, V16::set1(kSlack)), _CMP_GT_OQ)) {
      const __m512 raised = _mm512_max_ps(ref, top);
      alpha = exp_softmax(V16::sub(ref, raised));  // 0 at the first unit: nothing to keep
      ref = raised;
      sum = V16::mul(sum, alpha);
      if (in_tiles && t0 > 0) {  // the output leaves its tiles only to be rescaled
        out_tiles_store(w.acc, D, slices);
        scale_rows(w.acc, D, alpha);
        out_tiles_load(w.acc, D, slices);
      }
    }
    for (int64_t u = 0; u < 2; ++u) {
      __m512 p[kRows];
      for (int64_t r = 0; r < kRows; ++r) p[r] = V16::zero();
      if (u < here)
        for (int64_t r = 0; r < kRows; ++r) {
          p[r] = exp_softmax(_mm512_fmsub_ps(V16::load(w.scores[u] + r * kRows), vscale, ref));
          sum = V16::add(sum, p[r]);
        }
      amx::transpose16(p);  // p[j]: query j's 16 positions
      for (int64_t j = 0; j < kRows; ++j) V16::store(w.probs + j * kDepth + u * kRows, p[j]);
    }
    pack_values(keys[0] + s.v_offset, keys[1] ? keys[1] + s.v_offset : nullptr, s.tok_stride, D,
                end - t0 * kRows, w.values);
    _tile_loadd(3, w.probs, 64);
    if (in_tiles) {
      out_tiles_accumulate(w.values, slices);
      continue;
    }
    alignas(64) float a[kRows];
    V16::store(a, alpha);
    for (int64_t dc = 0; dc < slices; ++dc) {
      _tile_zero(5);
      _tile_loadd(4, w.values + dc * kRows * kDepth, 64);
      _tile_dpbf16ps(5, 3, 4);
      _tile_stored(5, w.partial, 64);
      for (int64_t j = 0; j < kRows; ++j) {
        float* x = w.acc + j * D + dc * kRows;
        V16::store(x, V16::fmadd(V16::load(x), V16::set1(a[j]), V16::load(w.partial + j * kRows)));
      }
    }
  }
  if (in_tiles) out_tiles_store(w.acc, D, slices);
  alignas(64) float m[kRows], l[kRows];
  V16::store(m, ref);
  V16::store(l, sum);
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t col = col0 + j, n = s.row(col / s.G), head = h * s.G + col % s.G;
    float* o = out + (n * s.Hq + head) * D;
    const float* a = w.acc + j * D;
    const float shared_lse = m[j] + std::log(l[j]);
    float& own_lse = lse[n * s.Hq + head];
    if (!s.merge) {
      const float inv = 1.f / l[j];
      for (int64_t d = 0; d < D; ++d) o[d] = a[d] * inv;
      own_lse = shared_lse;
      continue;
    }
    // The softmax over both parts: each part's output weighted by its share of the sum.
    const float top = std::max(shared_lse, own_lse);
    const float ws = std::exp(shared_lse - top), wo = std::exp(own_lse - top), total = ws + wo;
    const float fs = ws / (total * l[j]), fo = wo / total;
    for (int64_t d = 0; d < D; ++d) o[d] = a[d] * fs + o[d] * fo;
    own_lse = top + std::log(total);
  }
}

}  // namespace

void shared_attention_bf16(torch::Tensor q, torch::Tensor kv, torch::Tensor blocks, double scale,
                           torch::Tensor out, torch::Tensor lse, c10::optional<torch::Tensor> rows,
                           bool merge, c10::optional<torch::Tensor> last) {
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && kv.scalar_type() == torch::kBFloat16,
              "shared attention (AMX): bfloat16 queries and cache expected, got ", q.scalar_type(),
              " and ", kv.scalar_type());
  TORCH_CHECK(q.dim() == 3 && kv.dim() == 5 && q.is_contiguous() && kv.is_contiguous(),
              "shared attention (AMX): contiguous q [N, Hq, D] and kv [num_blocks, 2, bs, Hk, D] expected");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t num_blocks = kv.size(0), bs = kv.size(2), Hk = kv.size(3);
  TORCH_CHECK(kv.size(4) == D && Hq % Hk == 0, "shared attention (AMX): head shape mismatch");
  TORCH_CHECK(bs % kRows == 0 && D % kDepth == 0 && D <= kMaxHead,
              "shared attention (AMX): block size a multiple of 16 and head size a multiple of 32 "
              "up to 256 expected, got ", bs, " and ", D);
  TORCH_CHECK(blocks.scalar_type() == torch::kInt64 && blocks.dim() == 1 && blocks.numel() >= 1 &&
                  blocks.is_contiguous(),
              "shared attention (AMX): one or more int64 block ids expected");
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.sizes() == q.sizes() &&
                  lse.scalar_type() == torch::kFloat32 && lse.is_contiguous() && lse.numel() == B * Hq,
              "shared attention (AMX): float32 out [B, Hq, D] and lse [B, Hq] expected");
  const int64_t* members = nullptr;
  int64_t N = B;
  if (rows.has_value() && rows->defined()) {
    TORCH_CHECK(rows->scalar_type() == torch::kInt64 && rows->dim() == 1 && rows->is_contiguous(),
                "shared attention (AMX): rows must be int64 [n], contiguous");
    members = rows->data_ptr<int64_t>();
    N = rows->numel();
    std::vector<bool> seen(B);
    for (int64_t i = 0; i < N; ++i) {
      TORCH_CHECK(members[i] >= 0 && members[i] < B && !seen[members[i]],
                  "shared attention (AMX): rows must be distinct rows of q");
      seen[members[i]] = true;
    }
  }
  const int64_t* lasts = nullptr;
  if (last.has_value() && last->defined()) {
    TORCH_CHECK(last->scalar_type() == torch::kInt64 && last->dim() == 1 && last->numel() == N &&
                    last->is_contiguous(),
                "shared attention (AMX): last must be int64 [n], one position per row, contiguous");
    lasts = last->data_ptr<int64_t>();
    for (int64_t i = 0; i < N; ++i)
      TORCH_CHECK(lasts[i] >= 0 && lasts[i] < blocks.numel() * bs,
                  "shared attention (AMX): a last position outside the blocks: ", lasts[i]);
  }
  const int64_t* ids = blocks.data_ptr<int64_t>();
  for (int64_t i = 0; i < blocks.numel(); ++i)
    TORCH_CHECK(ids[i] >= 0 && ids[i] < num_blocks, "shared attention (AMX): block id ", ids[i],
                " outside the cache");
  TORCH_CHECK(amx::request(), "shared attention (AMX): the kernel refused AMX's tile state");
  const Layout s{Hq, Hk, Hq / Hk, D, bs, Hk * D, 2 * bs * Hk * D, bs * Hk * D,
                 blocks.numel() * bs / kRows, members, merge, lasts};
  const int64_t cols = N * s.G, items = (cols + kRows - 1) / kRows;
  const bf16* qp = q.data_ptr<bf16>();
  const bf16* kvp = kv.data_ptr<bf16>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // Items head-major: a thread's consecutive items read the same head's K / V (in cache).
  at::parallel_for(0, Hk * items, 1, [&](int64_t begin, int64_t end) {
    amx::TileConfig config;
    for (int t = 0; t < kTiles; ++t) config.set(t, kRows, 64);
    _tile_loadconfig(&config);
    auto scratch = std::make_unique<Scratch>();
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / items, col0 = item % items * kRows;
      attend(qp, kvp, ids, s, h, col0, std::min(kRows, cols - col0), fscale, op, lp, *scratch);
    }
    _tile_release();
  });
}
#else
void shared_attention_bf16(torch::Tensor, torch::Tensor, torch::Tensor, double, torch::Tensor,
                           torch::Tensor, c10::optional<torch::Tensor>, bool,
                           c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "shared attention (AMX): built without AMX");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("shared_attention_bf16", &shared_attention_bf16,
        "attention of many queries over shared cache blocks, bfloat16, on AMX (CPU)", py::arg("q"),
        py::arg("kv"), py::arg("blocks"), py::arg("scale"), py::arg("out"), py::arg("lse"),
        py::arg("rows") = py::none(), py::arg("merge") = false, py::arg("last") = py::none());
#ifdef BATON_AMX
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
