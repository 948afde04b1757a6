// The size of the OpenMP team a kernel on this thread forks. OpenMP keeps it
// per thread (omp_set_num_threads sets the calling thread's), unlike
// at::set_num_threads, which also sets a process-wide count.
#pragma once

#include <omp.h>

namespace poptorch::runtime {

// Sets this thread's kernels to `threads` threads while it lives.
class KernelThreads {
 public:
  explicit KernelThreads(int threads) : outer_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~KernelThreads() { omp_set_num_threads(outer_); }
  KernelThreads(const KernelThreads&) = delete;
  KernelThreads& operator=(const KernelThreads&) = delete;

 private:
  int outer_;
};

}  // namespace poptorch::runtime
