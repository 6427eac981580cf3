// Copy KV blocks between two mapped caches (the shm KV transfer's pull).
//
// Why our own: the shm KV transfer (kv_transfer/shm_driver.py) copies one region per run of
// consecutive blocks; a scattered 1 MiB layer is 16 regions of 64 KiB, and a Python loop of
// bounds checks and ctypes.memmove calls cost as much as the copy itself. Here every region
// is checked, then all are copied with the GIL released, in one call.
//
// Only pybind11 (no torch headers): this builds in seconds.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

using Region = std::tuple<int64_t, int64_t, int64_t>;

static void check(int64_t offset, int64_t nbytes, int64_t limit, const char* side) {
  if (offset < 0 || nbytes < 0 || offset > limit || nbytes > limit - offset) {
    throw py::index_error("region [" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                          ") outside the " + side + " buffer of " + std::to_string(limit) +
                          " bytes");
  }
}

static void copy_regions(uintptr_t dst, int64_t dst_nbytes, uintptr_t src, int64_t src_nbytes,
                         const std::vector<Region>& regions) {
  for (const auto& [src_off, dst_off, nbytes] : regions) {
    check(src_off, nbytes, src_nbytes, "source");
    check(dst_off, nbytes, dst_nbytes, "destination");
  }
  py::gil_scoped_release no_gil;
  for (const auto& [src_off, dst_off, nbytes] : regions) {
    std::memmove(reinterpret_cast<char*>(dst) + dst_off,
                 reinterpret_cast<const char*>(src) + src_off, static_cast<size_t>(nbytes));
  }
}

// Blocks src_ids[i] -> dst_ids[i] of each layer, between two caches laid out
// [layer][block][block_bytes] (core/kv_layout.py). Runs of consecutive ids on both sides
// merge into one memmove. Nothing per block is built in Python: a scattered 256 MiB layer is
// 4,096 regions, whose Python tuples alone set off full garbage collections of ~100 ms.
static void copy_blocks(uintptr_t dst, int64_t dst_nbytes, int64_t dst_layer_bytes, uintptr_t src,
                        int64_t src_nbytes, int64_t src_layer_bytes, int64_t block_bytes,
                        const std::vector<int64_t>& layers, const std::vector<int64_t>& src_ids,
                        const std::vector<int64_t>& dst_ids) {
  if (src_ids.size() != dst_ids.size()) {
    throw py::value_error(std::to_string(src_ids.size()) + " source blocks but " +
                          std::to_string(dst_ids.size()) + " destination blocks");
  }
  std::vector<Region> regions;
  for (size_t i = 0; i < src_ids.size();) {
    size_t j = i + 1;
    while (j < src_ids.size() && src_ids[j] == src_ids[j - 1] + 1 &&
           dst_ids[j] == dst_ids[j - 1] + 1) {
      ++j;
    }
    for (int64_t layer : layers) {
      regions.emplace_back(layer * src_layer_bytes + src_ids[i] * block_bytes,
                           layer * dst_layer_bytes + dst_ids[i] * block_bytes,
                           static_cast<int64_t>(j - i) * block_bytes);
    }
    i = j;
  }
  copy_regions(dst, dst_nbytes, src, src_nbytes, regions);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("copy_blocks", &copy_blocks, py::arg("dst"), py::arg("dst_nbytes"),
        py::arg("dst_layer_bytes"), py::arg("src"), py::arg("src_nbytes"),
        py::arg("src_layer_bytes"), py::arg("block_bytes"), py::arg("layers"),
        py::arg("src_ids"), py::arg("dst_ids"),
        "copy blocks src_ids[i] -> dst_ids[i] of each layer, runs merged, bounds-checked "
        "first (IndexError), GIL released while copying");
}
