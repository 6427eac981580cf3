// The int8 KV cache's CPU kernels (engine/kv_cache/quant.py has the entry format):
//   paged_decode_q8  decode attention: paged_decode.h's template over int8 entries;
//   write_q8         a step's new K/V rows quantized into their cache slots, byte for byte
//                    what quant.quantize writes (float16 scale = max(amax / 127, 2^-14)
//                    rounded to nearest even, values divided by it and rounded half to even),
//                    in one pass: the torch ops took ~190 us a layer against float32's 15 us
//                    copy, ~9% of a batch-1 decode step of the 125M preset.
#include "paged_decode.h"

#include <c10/util/Half.h>
#include "no_gil.h"

void paged_decode_q8(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                     torch::Tensor seq_lens, double scale, torch::Tensor out) {
  paged_decode_impl<int8_t>(q, kv, block_tables, seq_lens, scale, out);
}

static inline void quantize_row(const float* x, int64_t D, int8_t* dst) {
  float amax = 0.f;
  for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
  const c10::Half half(std::max(amax / 127.f, 6.103515625e-05f));  // 2^-14
  const float s = static_cast<float>(half);
  for (int64_t d = 0; d < D; ++d) {
    const float y = std::nearbyint(x[d] / s);  // the default rounding: half to even
    dst[d] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, y)));
  }
  std::memcpy(dst + D, &half, 2);
}

void write_q8(torch::Tensor k, torch::Tensor v, torch::Tensor kv, torch::Tensor slot_blocks,
              torch::Tensor slot_offsets) {
  TORCH_CHECK(k.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32 &&
                  kv.scalar_type() == torch::kInt8,
              "cpu write q8: float32 K/V and an int8 cache expected");
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.stride(2) == 1 && v.stride(2) == 1,
              "cpu write q8: K and V [T, Hk, D], contiguous in D");
  TORCH_CHECK(kv.dim() == 5 && kv.is_contiguous(), "cpu write q8: a contiguous cache layer");
  TORCH_CHECK(slot_blocks.scalar_type() == torch::kInt64 && slot_offsets.scalar_type() == torch::kInt64,
              "cpu write q8: int64 slots expected");
  const int64_t T = k.size(0), Hk = k.size(1), D = k.size(2);
  const int64_t num_blocks = kv.size(0), bs = kv.size(2), E = kv.size(4);
  TORCH_CHECK(kv.size(3) == Hk && E == D + 2, "cpu write q8: head shape mismatch");
  TORCH_CHECK(slot_blocks.numel() == T && slot_offsets.numel() == T, "cpu write q8: one slot per token");
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  int8_t* kvp = kv.data_ptr<int8_t>();
  const int64_t* blocks = slot_blocks.data_ptr<int64_t>();
  const int64_t* offsets = slot_offsets.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(blocks[t] >= 0 && blocks[t] < num_blocks && offsets[t] >= 0 && offsets[t] < bs,
                "cpu write q8: slot outside the cache");
    int8_t* slot = kvp + (blocks[t] * 2 * bs + offsets[t]) * Hk * E;  // K of this token
    for (int64_t h = 0; h < Hk; ++h) {
      quantize_row(kp + t * k.stride(0) + h * k.stride(1), D, slot + h * E);
      quantize_row(vp + t * v.stride(0) + h * v.stride(1), D, slot + bs * Hk * E + h * E);
    }
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_q8", &paged_decode_q8,
        "paged decode attention (CPU, int8 KV cache)", NoGil());
  m.def("write_q8", &write_q8, "quantize new K/V rows into an int8 KV cache (CPU)", NoGil());
}
