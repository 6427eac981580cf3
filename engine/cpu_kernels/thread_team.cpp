// The calling thread's OpenMP team as the OS sees it: the engine thread and the workers its
// parallel regions run on. Why C++: the team's workers run no Python, so only code run on
// each of them (a parallel region of one item per thread) can name them or change them.
//
// Why a worker sets their nice value (worker/threads.py): every parallel region ends in a
// barrier, so a front door, a load client or an I/O thread that preempts one team thread for
// P ms stalls the whole team for P ms; on two cores a server's other threads then cost the
// engine twice their CPU time. Above those threads' priority, the team runs its regions
// through and the others run in its gaps.

#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <torch/extension.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "no_gil.h"

// Runs `f(thread id)` once on each thread of the team and returns its results in thread
// order. A team of n threads runs n items, one each: at::parallel_for gives thread t the
// items from t * ceil(n / threads), i.e. item t.
template <class F>
static std::vector<std::pair<int64_t, int64_t>> on_each_thread(const F& f) {
  const int64_t n = at::get_num_threads();
  std::vector<std::pair<int64_t, int64_t>> out(n, {-1, 0});
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    const auto tid = static_cast<pid_t>(syscall(SYS_gettid));
    const int64_t result = f(tid);
    for (int64_t i = begin; i < end; ++i) out[i] = {tid, result};
  });
  return out;
}

// Each team thread's (thread id, 0 or the errno its setpriority failed with).
std::vector<std::pair<int64_t, int64_t>> set_team_nice(int64_t nice) {
  return on_each_thread([nice](pid_t tid) -> int64_t {
    return setpriority(PRIO_PROCESS, tid, static_cast<int>(nice)) == 0 ? 0 : errno;
  });
}

std::vector<int64_t> team_thread_ids() {
  std::vector<int64_t> ids;
  for (const auto& [tid, _] : on_each_thread([](pid_t) -> int64_t { return 0; })) {
    ids.push_back(tid);
  }
  return ids;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_team_nice", &set_team_nice, py::arg("nice"),
        "Set the nice value of every thread of the calling thread's OpenMP team; returns "
        "each thread's (thread id, 0 or errno).", NoGil());
  m.def("team_thread_ids", &team_thread_ids,
        "The thread ids of the calling thread's OpenMP team, the caller's first.", NoGil());
}
