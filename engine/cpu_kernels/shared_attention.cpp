// Attention of many queries over runs of cache blocks, on AMX or, on CPUs without it, on
// AVX-512 BF16, for a bfloat16 cache and queries: the shared part of cascade attention
// (engine/attention/cascade.py), and a step's prompt chunks over their cached context and
// themselves (engine/attention/cpu_paged.py). Built twice (engine/cpu_kernels/__init__.py):
// shared_attention_amx where the CPU has AMX, shared_attention_dot where it has AVX-512 BF16;
// the walk is one, the tile products two (AmxTiles, DotTiles).
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
//   prefill_bf16(q [T, Hq, D] bf16, kv, block_tables [C, M] int64, query_starts [C],
//                query_lens [C], seq_lens [C] int64, scale, out [T, Hq, D] bf16)
//
// Chunk c's rows query_starts[c] .. + query_lens[c] - 1 attend its blocks causally (row i
// up to position seq_lens[c] - query_lens[c] + i), their K / V already in the cache; out's
// other rows are left as they are. One call for a step's chunks: one pass of Python
// and one thread split for all of them.
//
// Why our own: cascade gathered the shared K / V into a copy every layer and ran torch's CPU
// flash attention over it. For a handful of decode rows that fixed cost was more than the
// paged kernel's reads it saved, so a tenant's few rows on one system prompt each read the
// whole prompt's K / V again; and a prompt chunk after cached context gathered that whole
// context into a copy and built a mask for torch's attention (a chunk without context ran
// torch's causal flash attention, which this is 2-2.6x faster than up to 2,048 tokens). Here
// K is read in place and V packed once per head and thread, with no gather:
//
//   values  V^T per KV head, 32 positions by D (A of the output's product), packed as the
//           first of a thread's items on the head walks them, reused by its next ones
//   scores  S [16 positions x 16 queries] = K rows (A: read from the cache, the token stride
//           apart) x queries (B: packed once an item into AMX's pairs layout)
//   softmax online over the positions in base 2, a running max and sum per query, on the 16
//           queries' lanes at once (S's rows are positions, so no horizontal reductions)
//   output  O^T [16 of D x 16 queries] += V^T (A) x P (B: two positions' probabilities
//           interleaved per query, rounded to bfloat16: one conversion and one permute per
//           two positions, no transpose), 32 positions a product
//
// The output transposed keeps the whole walk free of transposes and of per-query
// broadcasts: rescaling O^T multiplies its rows by the queries' lane vector. The first
// version computed O = P^T x V: two 16 x 16 transposes of P and a repack of V per 32
// positions and work item, a scalar query pack and a natural exp of 14 vector ops. One
// layer, 12 / 4 heads of 64, 2 threads, first version -> this: 2,048 queries over 1,024
// shared positions 9.4 -> 6.2 ms, a 64-token chunk over 1,088 positions 0.30 -> 0.20 ms,
// 8 decode rows over 1,024 0.045 -> 0.040.
//
// A work item is one KV head and 16 of its queries (a GQA group's heads of successive rows,
// and so on); each of torch's threads takes a contiguous run of items of about equal walked
// positions (see run_items). The scores' products are exact in float32 and summed in
// float32, as in the paged kernel; the probabilities meet V in bfloat16, as in flash
// attention over bfloat16 (their sum stays float32).
//
// Without AMX (DotTiles) each tile product is 256 `vdpbf16ps`, one per A row and B row, A's
// pair of values broadcast from memory, C's 16 rows in registers: the same layouts, exact
// products summed in float32 (in their own order). Why: torch's CPU flash attention runs its
// products through MKL, which on an AMD EPYC (Zen 5, AVX-512 BF16) takes bfloat16 through its
// float32 AVX2 kernels; there cascade's shared part and the prompt chunks' attention were 42%
// of shared-prefix decoding's samples (bench.engine's (c)), and this build runs them 4-5x
// faster (engine/attention/cascade.py, cpu_paged.py).
//
// Needs: block size a multiple of 16, head size a multiple of 32 up to 256 (the caller sends
// other shapes to the gather and flash attention path).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "amx.h"
#include "f32_lanes.h"
#include "no_gil.h"

#if defined(BATON_AMX) || (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__))
#define BATON_SHARED_ATTENTION 1
namespace {

using bf16 = c10::BFloat16;
using amx::kDepth;  // bfloat16 values in a tile row: D per score product, positions per V product
using amx::kRows;   // a tile's rows: positions of S, D of O^T
using V16 = lanes::F32x16;

constexpr int64_t kMaxHead = 256;
constexpr int64_t kUnit = 2 * kRows;  // positions a V product takes: two sub-tiles of S

// One call's (or one prompt chunk's) walk: where its queries, positions and outputs are.
struct Layout {
  int64_t Hq, Hk, G, D, bs, tok_stride, blk_stride, v_offset, subtiles;
  const int64_t* blocks;  // the positions' blocks
  int64_t members;        // queries (rows of q) walking them, each with every head
  const int64_t* rows;    // the members' rows of q / out / lse (nullptr: row0, row0 + 1, ...)
  int64_t row0;
  bool merge;             // out / lse hold the attention over the rows' other positions
  const int64_t* last;    // per member, the last position it attends (nullptr: see last0)
  int64_t last0;          // without `last`: member m's last is last0 + m (causal), or all if < 0
  int64_t walk;           // positions any walk reaches (V^T's, zeros past them)
  float* out;             // float32 out and lse (cascade), or
  float* lse;
  bf16* out_bf16;         // q's dtype, no lse (a prompt chunk's attention, final)
  int64_t row(int64_t member) const { return rows ? rows[member] : row0 + member; }
  bool causal() const { return last || last0 >= 0; }
  int64_t last_of(int64_t member) const { return last ? last[member] : last0 + member; }
};

// Where position `pos` of head h starts, in K (V: + v_offset).
inline const bf16* position(const bf16* kv, const Layout& s, int64_t pos, int64_t h) {
  return kv + s.blocks[pos / s.bs] * s.blk_stride + (pos % s.bs) * s.tok_stride + h * s.D;
}

// B for the scores: per 32 values of D, row p holds each query's values 2p and 2p + 1: the
// queries' rows as 16 x 16 pairs of values, transposed as 32-bit lanes.
void pack_queries(const bf16* q, const Layout& s, int64_t h, int64_t col0, int64_t cols,
                  bf16* packed) {
  const bf16* src[kRows];
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t col = col0 + j;
    src[j] = q + (s.row(col / s.G) * s.Hq + h * s.G + col % s.G) * s.D;
  }
  for (int64_t k = 0; k < s.D / kDepth; ++k) {
    __m512 pairs[kRows];
    for (int64_t j = 0; j < kRows; ++j)
      pairs[j] = j < cols ? _mm512_loadu_ps(src[j] + k * kDepth) : _mm512_setzero_ps();
    amx::transpose16(pairs);
    for (int64_t p = 0; p < kRows; ++p) _mm512_store_ps(packed + (k * kRows + p) * kDepth, pairs[p]);
  }
}

// V^T of head h's positions unit * 32 .. + 31: D rows of 32 positions (A for the output,
// 16 rows a slice of D). Two positions' rows interleaved are 16 x 16 pairs (a position pair,
// a value of D); transposed as 32-bit lanes, row d holds the unit's 32 positions in order.
// The interleave is unpacklo / unpackhi within 128-bit lanes (cheaper shuffles than a
// full-width two-source permute), which leaves D in the order of `kUnpacked`: each transposed
// row is stored at the row of D it holds. Positions from `s.walk` on (past the furthest a
// walk attends, or past the blocks) are zeros: their probabilities are too, but the cache
// there may hold anything, NaN included, and 0 x NaN is NaN.
void pack_values_t(const bf16* kv, const Layout& s, int64_t h, int64_t unit, bf16* packed) {
  const int64_t end = s.walk;
  // Which of 32 values of D each 32-bit lane of unpacklo (then unpackhi) holds.
  static constexpr int64_t kUnpacked[2][kRows] = {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
                                                  {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}};
  const int64_t first = unit * kUnit;
  // The unit's two sub-tiles of 16 positions, each within one block (block size a multiple of 16).
  // (A second sub-tile past `end` is never read: the first's address stands in.)
  const bf16* sub[2] = {position(kv, s, first, h) + s.v_offset, nullptr};
  sub[1] = first + kRows < end ? position(kv, s, first + kRows, h) + s.v_offset : sub[0];
  for (int64_t k = 0; k < s.D / kDepth; ++k) {
    __m512 pairs[2][kRows];
    for (int64_t i = 0; i < kRows; ++i) {
      const int64_t p = 2 * i;  // in the unit
      const bf16* row = sub[p / kRows] + (p % kRows) * s.tok_stride + k * kDepth;
      __m512i a = _mm512_setzero_si512(), b = a;
      if (first + p < end) a = _mm512_loadu_si512(row);
      if (first + p + 1 < end) b = _mm512_loadu_si512(row + s.tok_stride);
      pairs[0][i] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(a, b));
      pairs[1][i] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(a, b));
    }
    for (int64_t half = 0; half < 2; ++half) {
      amx::transpose16(pairs[half]);
      for (int64_t j = 0; j < kRows; ++j)
        _mm512_storeu_ps(packed + (k * kDepth + kUnpacked[half][j]) * kUnit, pairs[half][j]);
    }
  }
}

// 2^x for softmax arguments (at most the slack; masked scores are a large finite negative,
// so no inf - inf): n = round(x), 2^(x - n) by a degree-5 polynomial (relative error 1.9e-7
// on [-0.5, 0.5], fitted here), times 2^n by vscalefps, which takes n far below the smallest
// float to 0. 8 vector ops; the natural exp it replaced, 14.
inline __m512 exp2_softmax(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3264728e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6715130e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5507336e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022242e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314700e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// A query's reference max (base 2) moves only when a score passes it by more than this (its
// probabilities then reach 2^11 = 2,048 at most: float32 sums and bfloat16 products hold
// that exactly as well as values under 1). So after the first few units the output is seldom
// rescaled (FlashAttention-4's rule).
constexpr float kSlack = 11.f;
constexpr float kHidden = -1e30f;  // a masked score: finite, so 2^(x - ref) is 0, never NaN

// A thread's V^T of the head its items walk: units packed as its first item of the head reaches
// them (interleaved with that walk, as the cache is read anyway), reused by its next items of
// the head. Items are head-major, so a head is packed once by each thread that takes its items.
struct ValuesT {
  bf16* data;
  const Layout* walk = nullptr;  // whose positions (a call's, a chunk's),
  int64_t head = -1, packed = 0;  // which head, how many units packed
};

struct Scratch {
  alignas(64) float scores[2][kRows * kRows];
  alignas(64) bf16 probs[kRows * kDepth];  // P: 16 position pairs x 16 queries x 2
  alignas(64) float partial[kRows * kRows];
  alignas(64) bf16 queries[kMaxHead * kRows];
  alignas(64) float acc[kMaxHead * kRows];  // O^T, D x 16 queries
};

#ifdef BATON_AMX
// The tile products on AMX. Tiles (the intrinsics take literal numbers): 0 scores (C), 1
// keys / V^T (A), 2 queries (B) / V^T (A), 3 probabilities (B), 4 .. 7 the output (C; with
// D > 64, 4 V^T and 5 a product). With D <= 64 O^T stays in tiles 4 .. 7 the whole walk,
// stored only to be rescaled.
struct AmxTiles {
  static constexpr const char* kName = "AMX";
  static constexpr int64_t kOutTilesMax = 4;  // tiles 4 .. 7: O^T's 16-row slices of D <= 64

  static bool request() { return amx::request(); }

  // The tile configuration, held by a thread while it runs items.
  struct Thread {
    Thread() {
      amx::TileConfig config;
      for (int t = 0; t < 8; ++t) config.set(t, kRows, 64);
      _tile_loadconfig(&config);
    }
    ~Thread() { _tile_release(); }
  };

  // S [16 positions x 16 queries] = 16 keys (token_stride apart) x the packed queries, D deep.
  static void scores(const bf16* keys, int64_t token_stride, const bf16* queries, int64_t D, float* out) {
    _tile_zero(0);
    for (int64_t k = 0; k < D / kDepth; ++k) {
      _tile_loadd(1, keys + k * kDepth, token_stride * static_cast<int64_t>(sizeof(bf16)));
      _tile_loadd(2, queries + k * kRows * kDepth, 64);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, out, 64);
  }

  static void out_zero(float* acc, int64_t D) {
    if (!in_tiles(D)) return std::fill(acc, acc + D * kRows, 0.f);
    _tile_zero(4);
    _tile_zero(5);
    if (D / kRows > 2) {
      _tile_zero(6);
      _tile_zero(7);
    }
  }

  // O^T into acc (before a rescale, and at the end of the walk) and back.
  static void out_to_memory(float* acc, int64_t D) {
    if (!in_tiles(D)) return;
    constexpr int64_t slice = kRows * kRows, stride = kRows * sizeof(float);
    _tile_stored(4, acc, stride);
    _tile_stored(5, acc + slice, stride);
    if (D / kRows > 2) {
      _tile_stored(6, acc + 2 * slice, stride);
      _tile_stored(7, acc + 3 * slice, stride);
    }
  }

  static void out_from_memory(const float* acc, int64_t D) {
    if (!in_tiles(D)) return;
    constexpr int64_t slice = kRows * kRows, stride = kRows * sizeof(float);
    _tile_loadd(4, acc, stride);
    _tile_loadd(5, acc + slice, stride);
    if (D / kRows > 2) {
      _tile_loadd(6, acc + 2 * slice, stride);
      _tile_loadd(7, acc + 3 * slice, stride);
    }
  }

  // O^T += V^T (a slice of D at a time) x P; in tiles, alternating tiles 1 and 2 so a load
  // overlaps the previous product, or through `partial` into acc.
  static void out_accumulate(float* acc, const bf16* values_t, const bf16* probs, int64_t D, float* partial) {
    constexpr int64_t slice = kRows * kUnit, stride = kUnit * sizeof(bf16);
    _tile_loadd(3, probs, 64);
    if (in_tiles(D)) {
      _tile_loadd(1, values_t, stride);
      _tile_dpbf16ps(4, 1, 3);
      _tile_loadd(2, values_t + slice, stride);
      _tile_dpbf16ps(5, 2, 3);
      if (D / kRows > 2) {
        _tile_loadd(1, values_t + 2 * slice, stride);
        _tile_dpbf16ps(6, 1, 3);
        _tile_loadd(2, values_t + 3 * slice, stride);
        _tile_dpbf16ps(7, 2, 3);
      }
      return;
    }
    for (int64_t dc = 0; dc < D / kRows; ++dc) {
      _tile_zero(5);
      _tile_loadd(4, values_t + dc * slice, stride);
      _tile_dpbf16ps(5, 4, 3);
      _tile_stored(5, partial, 64);
      float* a = acc + dc * kRows * kRows;
      for (int64_t r = 0; r < kRows; ++r)
        V16::store(a + r * kRows, V16::add(V16::load(a + r * kRows), V16::load(partial + r * kRows)));
    }
  }

 private:
  static bool in_tiles(int64_t D) { return D / kRows <= kOutTilesMax; }
};
using Tiles = AmxTiles;
#else
// The tile products on AVX-512 BF16, in AMX's layouts: C [16 x 16 float32] += A [16 rows of
// 32 bfloat16] x B [16 rows of 16 pairs], C's rows in registers, A's pair r, p broadcast
// against B's row p: 256 `vdpbf16ps` a product. O^T lives in acc the whole walk (64
// registers for D = 64 would not fit), read and written once a slice and unit.
struct DotTiles {
  static constexpr const char* kName = "AVX-512 BF16";

  static bool request() { return true; }
  struct Thread {};

  static void scores(const bf16* keys, int64_t token_stride, const bf16* queries, int64_t D, float* out) {
    __m512 c[kRows];
    for (int64_t r = 0; r < kRows; ++r) c[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < D / kDepth; ++k) product(c, keys + k * kDepth, token_stride, queries + k * kRows * kDepth);
    for (int64_t r = 0; r < kRows; ++r) V16::store(out + r * kRows, c[r]);
  }

  static void out_zero(float* acc, int64_t D) { std::fill(acc, acc + D * kRows, 0.f); }
  static void out_to_memory(float*, int64_t) {}
  static void out_from_memory(const float*, int64_t) {}

  static void out_accumulate(float* acc, const bf16* values_t, const bf16* probs, int64_t D, float*) {
    for (int64_t dc = 0; dc < D / kRows; ++dc) {
      float* a = acc + dc * kRows * kRows;
      __m512 c[kRows];
      for (int64_t r = 0; r < kRows; ++r) c[r] = V16::load(a + r * kRows);
      product(c, values_t + dc * kRows * kUnit, kUnit, probs);
      for (int64_t r = 0; r < kRows; ++r) V16::store(a + r * kRows, c[r]);
    }
  }

 private:
  // c += A x B, A's rows a_stride values apart, B's rows 32 values apart.
  static inline void product(__m512 (&c)[kRows], const bf16* a, int64_t a_stride, const bf16* b) {
    for (int64_t p = 0; p < kRows; ++p) {
      const __m512bh row = (__m512bh)_mm512_loadu_si512(b + p * kDepth);
      for (int64_t r = 0; r < kRows; ++r) {
        int32_t pair;
        std::memcpy(&pair, a + r * a_stride + 2 * p, sizeof(pair));
        c[r] = _mm512_dpbf16_ps(c[r], (__m512bh)_mm512_set1_epi32(pair), row);
      }
    }
  }
};
using Tiles = DotTiles;
#endif

// O^T's rows (D of them, 16 query lanes) *= alpha.
inline void scale_rows(float* acc, int64_t D, __m512 alpha) {
  for (int64_t d = 0; d < D; ++d) V16::store(acc + d * kRows, V16::mul(V16::load(acc + d * kRows), alpha));
}

// One KV head and its queries col0 .. col0 + cols - 1 (cols <= 16, of the head's N * G) over
// every position: per unit of 32 positions, the scores, the softmax against each query's
// reference max, P (bfloat16) and the product with V^T.
void attend(const bf16* q, const bf16* kv, const Layout& s, int64_t h, int64_t col0, int64_t cols,
            float scale, Scratch& w, ValuesT& vt) {
  const int64_t D = s.D, slices = D / kRows;
  pack_queries(q, s, h, col0, cols, w.queries);
  // Causal: each query's last position in a lane (the lanes past `cols` attend everything
  // the others do, so they never hold back the walk's end).
  alignas(64) int32_t last[kRows];
  int64_t end = s.subtiles * kRows;  // positions this item walks
  int64_t nearest = end;             // from here on some query masks positions
  if (s.causal()) {
    int64_t furthest = 0;
    for (int64_t j = 0; j < kRows; ++j) {
      const int64_t lp = j < cols ? s.last_of((col0 + j) / s.G) : 0;
      last[j] = static_cast<int32_t>(lp);
      furthest = std::max(furthest, lp);
    }
    for (int64_t j = cols; j < kRows; ++j) last[j] = static_cast<int32_t>(furthest);
    end = furthest + 1;
    nearest = *std::min_element(last, last + kRows) + 1;
  }
  const __m512i last_lanes = _mm512_load_si512(last);
  Tiles::out_zero(w.acc, D);
  // Scores in base 2: 2^(s * scale * log2 e - ref) is e^(s * scale - ref * ln 2).
  const __m512 vscale = V16::set1(scale * 1.44269504088896341f);
  __m512 ref = V16::set1(kHidden), sum = V16::zero();
  const int64_t subtiles = (end + kRows - 1) / kRows;
  for (int64_t t0 = 0; t0 < subtiles; t0 += 2) {
    const int64_t here = std::min<int64_t>(2, subtiles - t0);
    __m512 top = V16::set1(kHidden);
    for (int64_t u = 0; u < here; ++u) {
      const int64_t first = (t0 + u) * kRows;
      const bf16* keys = position(kv, s, first, h);
      Tiles::scores(keys, s.tok_stride, w.queries, D, w.scores[u]);
      if (first + kRows > nearest) {
        // Positions past a query's last: hidden (a blend, so NaN read past the sequence goes too).
        const __m512 hidden = V16::set1(kHidden);
        for (int64_t r = 0; r < kRows; ++r) {
          const __mmask16 past = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(static_cast<int32_t>(first + r)), last_lanes);
          V16::store(w.scores[u] + r * kRows, _mm512_mask_blend_ps(past, V16::load(w.scores[u] + r * kRows), hidden));
        }
      }
      for (int64_t r = 0; r < kRows; ++r) top = _mm512_max_ps(top, V16::load(w.scores[u] + r * kRows));
    }
    top = V16::mul(top, vscale);
    if (_mm512_cmp_ps_mask(top, V16::add(ref, V16::set1(kSlack)), _CMP_GT_OQ)) {
      const __m512 raised = _mm512_max_ps(ref, top);
      const __m512 alpha = exp2_softmax(V16::sub(ref, raised));  // 0 at the first unit
      ref = raised;
      sum = V16::mul(sum, alpha);
      if (t0 > 0) {
        Tiles::out_to_memory(w.acc, D);
        scale_rows(w.acc, D, alpha);
        Tiles::out_from_memory(w.acc, D);
      }
    }
    // P, B of the output's product: row r holds positions 2r and 2r + 1 of every query.
    alignas(64) static const uint16_t pair_idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i pairs = _mm512_load_si512(pair_idx);
    for (int64_t u = 0; u < 2; ++u) {
      bf16* rows = w.probs + u * (kRows / 2) * kDepth;
      if (u >= here) {
        std::fill(rows, rows + (kRows / 2) * kDepth, bf16(0.f));
        continue;
      }
      for (int64_t r = 0; r < kRows; r += 2) {
        const __m512 p0 = exp2_softmax(_mm512_fmsub_ps(V16::load(w.scores[u] + r * kRows), vscale, ref));
        const __m512 p1 = exp2_softmax(_mm512_fmsub_ps(V16::load(w.scores[u] + (r + 1) * kRows), vscale, ref));
        sum = V16::add(sum, V16::add(p0, p1));
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // p0's 16, then p1's
        _mm512_store_si512(rows + r / 2 * kDepth, _mm512_permutexvar_epi16(pairs, both));
      }
    }
    bf16* unit_t = vt.data + (t0 / 2) * D * kUnit;
    if (vt.walk != &s || vt.head != h) vt = ValuesT{vt.data, &s, h, 0};
    if (t0 / 2 == vt.packed) pack_values_t(kv, s, h, vt.packed++, unit_t);
    Tiles::out_accumulate(w.acc, unit_t, w.probs, D, w.partial);
  }
  Tiles::out_to_memory(w.acc, D);
  alignas(64) float m[kRows], l[kRows];
  V16::store(m, ref);
  V16::store(l, sum);
  // O^T's 16 x 16 slices transposed back: a query's 16 values of D a vector.
  for (int64_t dc = 0; dc < slices; ++dc) {
    __m512 o[kRows];
    for (int64_t r = 0; r < kRows; ++r) o[r] = V16::load(w.acc + (dc * kRows + r) * kRows);
    amx::transpose16(o);
    for (int64_t r = 0; r < kRows; ++r) V16::store(w.acc + (dc * kRows + r) * kRows, o[r]);
  }
  constexpr float kLn2 = 0.693147180559945309f;
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t col = col0 + j, n = s.row(col / s.G), head = h * s.G + col % s.G;
    const float* a = w.acc + j * kRows;  // + dc * 256: values dc * 16 .. of D
    if (s.out_bf16) {
      bf16* o = s.out_bf16 + (n * s.Hq + head) * D;
      const __m512 inv = V16::set1(1.f / l[j]);
      for (int64_t dc = 0; dc < slices; ++dc) V16::store(o + dc * kRows, V16::mul(V16::load(a + dc * kRows * kRows), inv));
      continue;
    }
    float* o = s.out + (n * s.Hq + head) * D;
    const float shared_lse = m[j] * kLn2 + std::log(l[j]);
    float& own_lse = s.lse[n * s.Hq + head];
    float fs = 1.f / l[j], fo = 0.f;
    if (s.merge) {
      // The softmax over both parts: each part's output weighted by its share of the sum.
      const float top = std::max(shared_lse, own_lse);
      const float ws = std::exp(shared_lse - top), wo = std::exp(own_lse - top), total = ws + wo;
      fs = ws / (total * l[j]);
      fo = wo / total;
      own_lse = top + std::log(total);
    } else {
      own_lse = shared_lse;
    }
    for (int64_t dc = 0; dc < slices; ++dc) {
      const __m512 x = V16::load(a + dc * kRows * kRows);
      float* y = o + dc * kRows;
      V16::store(y, s.merge ? V16::fmadd(x, V16::set1(fs), V16::mul(V16::load(y), V16::set1(fo)))
                            : V16::mul(x, V16::set1(fs)));
    }
  }
}

// A work item: one walk's KV head and 16 of its queries.
struct Item {
  const Layout* walk;
  int64_t head, col0, cols;
};

// The walks' items, head-major within a walk, run on torch's threads: each thread one
// contiguous run of items of about equal cost (units walked, plus one for the item's fixed
// work), so a causal chunk's short early items and a long context's items balance, and a
// thread's consecutive items share a head's V^T.
void run_items(const bf16* q, const bf16* kv, const std::vector<Layout>& walks, float scale) {
  if (walks.empty()) return;
  std::vector<Item> items;
  std::vector<int64_t> cost{0};  // prefix sums
  for (const Layout& s : walks) {
    const int64_t cols = s.members * s.G;
    for (int64_t h = 0; h < s.Hk; ++h)
      for (int64_t col0 = 0; col0 < cols; col0 += kRows) {
        const int64_t n = std::min(kRows, cols - col0);
        const int64_t reach = s.causal() ? s.last_of((col0 + n - 1) / s.G) + 1 : s.subtiles * kRows;
        items.push_back({&s, h, col0, n});
        cost.push_back(cost.back() + (reach + kUnit - 1) / kUnit + 1);
      }
  }
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items.size()));
  const int64_t total = cost.back();
  int64_t longest = 0;
  for (const Layout& s : walks) longest = std::max(longest, (s.walk + kUnit - 1) / kUnit);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    const Tiles::Thread tiles;
    auto scratch = std::make_unique<Scratch>();
    thread_local std::vector<bf16> values_t;  // kept across calls: no allocation a layer
    values_t.resize(std::max<size_t>(values_t.size(), longest * walks.front().D * kUnit));
    ValuesT vt{values_t.data()};
    for (int64_t t = begin; t < end; ++t) {
      // Items [from, to): those whose cost starts in this thread's share.
      const auto from = std::lower_bound(cost.begin(), cost.end() - 1, total * t / threads);
      const auto to = std::lower_bound(cost.begin(), cost.end() - 1, total * (t + 1) / threads);
      for (auto i = from - cost.begin(); i < to - cost.begin(); ++i) {
        const Item& it = items[i];
        attend(q, kv, *it.walk, it.head, it.col0, it.cols, scale, *scratch, vt);
      }
    }
  });
}

}  // namespace

namespace {

// q and the cache as the kernel reads them -> a Layout with the shapes filled in.
Layout cache_layout(const torch::Tensor& q, const torch::Tensor& kv, const char* what) {
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && kv.scalar_type() == torch::kBFloat16, what,
              " (", Tiles::kName, "): bfloat16 queries and cache expected, got ", q.scalar_type(), " and ", kv.scalar_type());
  TORCH_CHECK(q.dim() == 3 && kv.dim() == 5 && q.is_contiguous() && kv.is_contiguous(), what,
              " (", Tiles::kName, "): contiguous q [N, Hq, D] and kv [num_blocks, 2, bs, Hk, D] expected");
  const int64_t Hq = q.size(1), D = q.size(2), bs = kv.size(2), Hk = kv.size(3);
  TORCH_CHECK(kv.size(4) == D && Hq % Hk == 0, what, " (", Tiles::kName, "): head shape mismatch");
  TORCH_CHECK(bs % kRows == 0 && D % kDepth == 0 && D <= kMaxHead, what,
              " (", Tiles::kName, "): block size a multiple of 16 and head size a multiple of 32 up to 256 expected, got ",
              bs, " and ", D);
  TORCH_CHECK(Tiles::request(), what, " (", Tiles::kName, "): the kernel refused AMX's tile state");
  Layout s{};
  s.Hq = Hq, s.Hk = Hk, s.G = Hq / Hk, s.D = D, s.bs = bs;
  s.tok_stride = Hk * D, s.blk_stride = 2 * bs * Hk * D, s.v_offset = bs * Hk * D;
  s.last0 = -1;
  return s;
}

void check_blocks(const int64_t* ids, int64_t n, int64_t num_blocks, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(ids[i] >= 0 && ids[i] < num_blocks, what, " (", Tiles::kName, "): block id ", ids[i], " outside the cache");
}

}  // namespace

void shared_attention_bf16(torch::Tensor q, torch::Tensor kv, torch::Tensor blocks, double scale,
                           torch::Tensor out, torch::Tensor lse, c10::optional<torch::Tensor> rows,
                           bool merge, c10::optional<torch::Tensor> last) {
  Layout s = cache_layout(q, kv, "shared attention");
  const int64_t B = q.size(0);
  TORCH_CHECK(blocks.scalar_type() == torch::kInt64 && blocks.dim() == 1 && blocks.numel() >= 1 &&
                  blocks.is_contiguous(),
              "shared attention (", Tiles::kName, "): one or more int64 block ids expected");
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.sizes() == q.sizes() &&
                  lse.scalar_type() == torch::kFloat32 && lse.is_contiguous() && lse.numel() == B * s.Hq,
              "shared attention (", Tiles::kName, "): float32 out [B, Hq, D] and lse [B, Hq] expected");
  int64_t N = B;
  if (rows.has_value() && rows->defined()) {
    TORCH_CHECK(rows->scalar_type() == torch::kInt64 && rows->dim() == 1 && rows->is_contiguous(),
                "shared attention (", Tiles::kName, "): rows must be int64 [n], contiguous");
    s.rows = rows->data_ptr<int64_t>();
    N = rows->numel();
    std::vector<bool> seen(B);
    for (int64_t i = 0; i < N; ++i) {
      TORCH_CHECK(s.rows[i] >= 0 && s.rows[i] < B && !seen[s.rows[i]],
                  "shared attention (", Tiles::kName, "): rows must be distinct rows of q");
      seen[s.rows[i]] = true;
    }
  }
  if (last.has_value() && last->defined()) {
    TORCH_CHECK(last->scalar_type() == torch::kInt64 && last->dim() == 1 && last->numel() == N &&
                    last->is_contiguous(),
                "shared attention (", Tiles::kName, "): last must be int64 [n], one position per row, contiguous");
    s.last = last->data_ptr<int64_t>();
    for (int64_t i = 0; i < N; ++i)
      TORCH_CHECK(s.last[i] >= 0 && s.last[i] < blocks.numel() * s.bs,
                  "shared attention (", Tiles::kName, "): a last position outside the blocks: ", s.last[i]);
  }
  s.blocks = blocks.data_ptr<int64_t>();
  check_blocks(s.blocks, blocks.numel(), kv.size(0), "shared attention");
  if (N == 0) return;  // an empty group: nothing to attend (and no furthest last position)
  s.members = N, s.merge = merge, s.subtiles = blocks.numel() * s.bs / kRows;
  s.walk = s.last ? *std::max_element(s.last, s.last + N) + 1 : blocks.numel() * s.bs;
  s.out = out.data_ptr<float>(), s.lse = lse.data_ptr<float>();
  run_items(q.data_ptr<bf16>(), kv.data_ptr<bf16>(), {s}, static_cast<float>(scale));
}

void prefill_bf16(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                  torch::Tensor query_starts, torch::Tensor query_lens, torch::Tensor seq_lens,
                  double scale, torch::Tensor out) {
  const Layout shape = cache_layout(q, kv, "prefill attention");
  const int64_t T = q.size(0), C = query_starts.numel();
  for (const torch::Tensor* t : {&block_tables, &query_starts, &query_lens, &seq_lens})
    TORCH_CHECK(t->scalar_type() == torch::kInt64 && t->is_contiguous(),
                "prefill attention (", Tiles::kName, "): int64 contiguous block tables, starts and lengths expected");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == C && query_lens.numel() == C &&
                  seq_lens.numel() == C,
              "prefill attention (", Tiles::kName, "): block_tables [C, M], query_starts, query_lens, seq_lens [C] expected");
  TORCH_CHECK(out.scalar_type() == torch::kBFloat16 && out.is_contiguous() && out.sizes() == q.sizes(),
              "prefill attention (", Tiles::kName, "): bfloat16 out shaped as q expected");
  const int64_t M = block_tables.size(1);
  const int64_t *tables = block_tables.data_ptr<int64_t>(), *starts = query_starts.data_ptr<int64_t>();
  const int64_t *lens = query_lens.data_ptr<int64_t>(), *seqs = seq_lens.data_ptr<int64_t>();
  std::vector<Layout> walks;
  for (int64_t c = 0; c < C; ++c) {
    TORCH_CHECK(lens[c] >= 1 && lens[c] <= seqs[c] && starts[c] >= 0 && starts[c] + lens[c] <= T,
                "prefill attention (", Tiles::kName, "): chunk ", c, " has rows ", starts[c], " + ", lens[c],
                " of ", T, " and context ", seqs[c]);
    const int64_t used = (seqs[c] + shape.bs - 1) / shape.bs;
    TORCH_CHECK(used <= M, "prefill attention (", Tiles::kName, "): chunk ", c, " needs ", used, " blocks, its table has ", M);
    Layout s = shape;
    s.blocks = tables + c * M;
    check_blocks(s.blocks, used, kv.size(0), "prefill attention");
    s.members = lens[c], s.row0 = starts[c], s.last0 = seqs[c] - lens[c];
    s.subtiles = used * shape.bs / kRows, s.walk = seqs[c];
    s.out_bf16 = out.data_ptr<bf16>();
    walks.push_back(s);
  }
  run_items(q.data_ptr<bf16>(), kv.data_ptr<bf16>(), walks, static_cast<float>(scale));
}
#else
void shared_attention_bf16(torch::Tensor, torch::Tensor, torch::Tensor, double, torch::Tensor,
                           torch::Tensor, c10::optional<torch::Tensor>, bool,
                           c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "shared attention (AMX / AVX-512 BF16): built without either");
}
void prefill_bf16(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                  torch::Tensor, double, torch::Tensor) {
  TORCH_CHECK(false, "prefill attention (AMX / AVX-512 BF16): built without either");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("shared_attention_bf16", &shared_attention_bf16,
        "attention of many queries over shared cache blocks, bfloat16, on AMX or AVX-512 BF16 (CPU)", py::arg("q"),
        py::arg("kv"), py::arg("blocks"), py::arg("scale"), py::arg("out"), py::arg("lse"),
        py::arg("rows") = py::none(), py::arg("merge") = false, py::arg("last") = py::none(),
        NoGil());
  m.def("prefill_bf16", &prefill_bf16,
        "prompt chunks' causal attention over their cached context and themselves, bfloat16, on AMX or AVX-512 BF16 (CPU)",
        py::arg("q"), py::arg("kv"), py::arg("block_tables"), py::arg("query_starts"), py::arg("query_lens"),
        py::arg("seq_lens"), py::arg("scale"), py::arg("out"), NoGil());
#ifdef BATON_SHARED_ATTENTION
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
