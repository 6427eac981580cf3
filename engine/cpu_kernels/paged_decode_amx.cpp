// Paged decode attention over a bfloat16 cache for bfloat16 queries, its first pass (the
// scores) on AMX; the softmax and the pass over V are paged_decode.h's.
//
// Why: pass 1 row by row costs a horizontal sum per dot product (12 a position for 12 query
// heads over 4 KV heads); here, for 16 positions of a block and one KV head, the scores of
// the GQA group's heads are D / 32 tile products: the block's 16 K rows of that head are AMX's
// A operand read in place from the cache (a 64-byte row each, the cache's token stride apart),
// the group's queries, packed once per sequence into AMX's pairs layout, are B, and C holds 16
// positions x G scores. The products of bfloat16 values are exact in float32 and summed in
// float32, as in the row-by-row pass; only the order of the sums differs.
//
// Needs: block size a multiple of 16, head size a multiple of 32, at most 16 query heads per
// KV head (the caller sends other shapes to paged_decode.cpp).
#include "paged_decode.h"

#include "amx.h"
#include "no_gil.h"

#ifdef BATON_AMX
namespace {

using bf16 = c10::BFloat16;
using amx::kDepth;
using amx::kRows;

struct AmxScores {
  void operator()(const float* qb, const bf16* kv, const int64_t* table, int64_t L, int64_t bs,
                  int64_t blk_stride, int64_t tok_stride, int64_t entry, int64_t Hk, int64_t G,
                  int64_t D, float scale, float* probs) const {
    const int64_t chunks = D / kDepth, pair_bytes = G * 2 * static_cast<int64_t>(sizeof(bf16));
    // B per (KV head, 32 values of D): row p holds each group head's values 2p and 2p + 1
    // of those 32. The queries were bfloat16 before the caller widened them: narrowing is
    // exact.
    thread_local std::vector<bf16> pairs;
    pairs.resize(Hk * chunks * kRows * G * 2);
    for (int64_t h = 0; h < Hk; ++h)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t tile = h * chunks + d / kDepth, row = d % kDepth / 2;
          pairs[((tile * kRows + row) * G + g) * 2 + d % 2] = bf16(qb[(h * G + g) * D + d]);
        }
    amx::TileConfig config;
    config.set(0, kRows, static_cast<int>(pair_bytes));  // C: 16 positions x G float32 scores
    config.set(1, kRows, 64);                             // A: 16 positions x 32 K values
    config.set(2, kRows, static_cast<int>(pair_bytes));  // B: 16 pairs x G heads
    _tile_loadconfig(&config);
    alignas(64) float scores[kRows * kRows];
    const int64_t num_blocks = (L + bs - 1) / bs, row_bytes = tok_stride * sizeof(bf16);
    for (int64_t i = 0; i < num_blocks; ++i) {
      const bf16* block = kv + table[i] * blk_stride;
      // The next block's K, all of it now (blocks are scattered; hardware prefetchers stop at
      // their ends): 16 x 576 positions, cache cold, 0.61 -> 0.49 ms a layer with it, 0.63
      // without (the row-by-row kernel); level at 64 x 1,100.
      if (i + 1 < num_blocks) {
        const char* next = reinterpret_cast<const char*>(kv + table[i + 1] * blk_stride);
        for (int64_t b = 0; b < bs * row_bytes; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
      }
      for (int64_t t0 = i * bs; t0 < std::min(L, (i + 1) * bs); t0 += kRows) {
        // Rows past L are read (they lie inside the block) and their scores dropped.
        const bf16* rows = block + (t0 - i * bs) * tok_stride;
        const int64_t n = std::min(kRows, L - t0);
        for (int64_t h = 0; h < Hk; ++h) {
          _tile_zero(0);
          for (int64_t c = 0; c < chunks; ++c) {
            _tile_loadd(1, rows + h * entry + c * kDepth, row_bytes);
            _tile_loadd(2, pairs.data() + (h * chunks + c) * kRows * G * 2, pair_bytes);
            _tile_dpbf16ps(0, 1, 2);
          }
          _tile_stored(0, scores, pair_bytes);
          for (int64_t g = 0; g < G; ++g) {
            float* dst = probs + (h * G + g) * L + t0;
            for (int64_t r = 0; r < n; ++r) dst[r] = scale * scores[r * G + g];
          }
        }
      }
    }
    _tile_release();
  }
};

}  // namespace

void paged_decode_bf16(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                       torch::Tensor seq_lens, double scale, torch::Tensor out,
                       c10::optional<torch::Tensor> lse) {
  TORCH_CHECK(kv.dim() == 5 && q.dim() == 3, "paged decode (AMX): q [B, Hq, D], kv [N, 2, bs, Hk, D]");
  const int64_t bs = kv.size(2), D = q.size(2), G = q.size(1) / kv.size(3);
  TORCH_CHECK(bs % kRows == 0 && D % kDepth == 0 && G <= kRows,
              "paged decode (AMX): block size a multiple of 16, head size of 32 and at most 16 "
              "query heads per KV head expected, got ", bs, ", ", D, ", ", G);
  TORCH_CHECK(amx::request(), "paged decode (AMX): the kernel refused AMX's tile state");
  paged_decode_impl<c10::BFloat16, AmxScores>(q, kv, block_tables, seq_lens, scale, out, lse);
}
#else
void paged_decode_bf16(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, double,
                       torch::Tensor, c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "paged decode (AMX): built without AMX");
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_bf16", &paged_decode_bf16,
        "paged decode attention, bfloat16 cache and queries, scores on AMX (CPU)", py::arg("q"),
        py::arg("kv"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("scale"), py::arg("out"),
        py::arg("lse") = py::none(), NoGil());
#ifdef BATON_AMX
  m.attr("available") = true;
#else
  m.attr("available") = false;
#endif
}
