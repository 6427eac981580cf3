// Every kernel here runs without holding Python's GIL (each module's m.def takes NoGil(); the
// shm transport's copy_blocks.cpp releases it itself, after its checks).
//
// Why: a served worker's engine thread spends most of a step inside these kernels while the
// worker's other Python threads (the actor's event loop taking new requests and handing out
// each step's tokens, Ray's callbacks, the KV transport) wait for the GIL: they ran only when
// the engine thread came back to Python between two kernels, and then only after the
// interpreter's 5 ms switch interval had passed. Measured beside an engine serving the
// 256 -> 64 workload at 8 req/s: a side thread that sleeps 2 ms woke 1.1-1.2 ms late at p90
// and up to 7 ms (a side process: 0.12 ms at p90). Kernels touch no Python object, and a
// C++ exception reaches pybind11 after the guard has taken the GIL back.
#pragma once

#include <torch/extension.h>

using NoGil = py::call_guard<py::gil_scoped_release>;
