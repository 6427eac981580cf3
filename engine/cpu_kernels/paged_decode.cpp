// Paged decode attention over a float32 or bfloat16 cache: paged_decode.h's template.
#include "paged_decode.h"

void paged_decode(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                  torch::Tensor seq_lens, double scale, torch::Tensor out) {
  paged_decode_impl<float>(q, kv, block_tables, seq_lens, scale, out);
}

void paged_decode_bf16(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                       torch::Tensor seq_lens, double scale, torch::Tensor out) {
  paged_decode_impl<c10::BFloat16>(q, kv, block_tables, seq_lens, scale, out);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (CPU, float32 cache)");
  m.def("paged_decode_bf16", &paged_decode_bf16, "paged decode attention (CPU, bfloat16 cache)");
}
