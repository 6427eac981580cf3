// Over a float32 or bfloat16 cache: paged decode attention (paged_decode.h's template), and
// the write of a step's new K/V rows into their slots (one copy per token and K / V, where
// torch's indexed assignment took ~80 us a layer for a 256-token prompt chunk).
#include "paged_decode.h"
#include "no_gil.h"

void paged_decode(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                  torch::Tensor seq_lens, double scale, torch::Tensor out,
                  c10::optional<torch::Tensor> lse) {
  paged_decode_impl<float>(q, kv, block_tables, seq_lens, scale, out, lse);
}

void paged_decode_bf16(torch::Tensor q, torch::Tensor kv, torch::Tensor block_tables,
                       torch::Tensor seq_lens, double scale, torch::Tensor out,
                       c10::optional<torch::Tensor> lse) {
  paged_decode_impl<c10::BFloat16>(q, kv, block_tables, seq_lens, scale, out, lse);
}

// k, v [T, Hk, D] with each token's heads contiguous (the slices of a fused qkv row);
// kv [num_blocks, 2, bs, Hk, D] contiguous, of their dtype.
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor kv, torch::Tensor slot_blocks,
              torch::Tensor slot_offsets) {
  TORCH_CHECK(k.scalar_type() == kv.scalar_type() && v.scalar_type() == kv.scalar_type() &&
                  (kv.scalar_type() == torch::kFloat32 || kv.scalar_type() == torch::kBFloat16),
              "cpu write kv: K, V and the cache of one dtype, float32 or bfloat16");
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes(), "cpu write kv: K and V [T, Hk, D] expected");
  const int64_t T = k.size(0), Hk = k.size(1), D = k.size(2);
  TORCH_CHECK(k.stride(2) == 1 && k.stride(1) == D && v.stride(2) == 1 && v.stride(1) == D,
              "cpu write kv: each token's heads must be contiguous");
  TORCH_CHECK(kv.dim() == 5 && kv.is_contiguous() && kv.size(3) == Hk && kv.size(4) == D,
              "cpu write kv: a contiguous cache layer of the same head shape expected");
  TORCH_CHECK(slot_blocks.scalar_type() == torch::kInt64 && slot_offsets.scalar_type() == torch::kInt64 &&
                  slot_blocks.numel() == T && slot_offsets.numel() == T,
              "cpu write kv: one int64 slot per token expected");
  const int64_t num_blocks = kv.size(0), bs = kv.size(2), row = Hk * D;
  const int64_t bytes = row * k.element_size();
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  char* kvp = static_cast<char*>(kv.data_ptr());
  const int64_t* blocks = slot_blocks.data_ptr<int64_t>();
  const int64_t* offsets = slot_offsets.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(blocks[t] >= 0 && blocks[t] < num_blocks && offsets[t] >= 0 && offsets[t] < bs,
                "cpu write kv: slot outside the cache");
    char* slot = kvp + (blocks[t] * 2 * bs + offsets[t]) * bytes;  // K of this token
    std::memcpy(slot, kp + t * k.stride(0) * k.element_size(), bytes);
    std::memcpy(slot + bs * bytes, vp + t * v.stride(0) * v.element_size(), bytes);
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (CPU, float32 cache)", py::arg("q"),
        py::arg("kv"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("scale"), py::arg("out"),
        py::arg("lse") = py::none(), NoGil());
  m.def("paged_decode_bf16", &paged_decode_bf16, "paged decode attention (CPU, bfloat16 cache)",
        py::arg("q"), py::arg("kv"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("out"), py::arg("lse") = py::none(), NoGil());
  m.def("write_kv", &write_kv,
        "new K/V rows into their cache slots (CPU, float32 / bfloat16)", NoGil());
}
