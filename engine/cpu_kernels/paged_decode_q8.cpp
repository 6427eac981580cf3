// Paged decode attention over an int8 cache (engine/attention/kv_quant.py): the kernel is
// paged_decode.h's template (one module per kernel file, as engine/cpu_kernels builds them).
#include "paged_decode.h"

void paged_decode_q8(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                     torch::Tensor seq_lens, double scale, torch::Tensor out) {
  paged_decode_impl<int8_t>(q, kv, block_tables, seq_lens, scale, out);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_q8", &paged_decode_q8, "paged decode attention (CPU, int8 KV cache)");
}
