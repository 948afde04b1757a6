#include "runtime/inter_op.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "profiling/profiler.h"
#include "runtime/kernel_threads.h"

namespace poptorch::runtime {
namespace {

// The nodes of one segment that are ready to run, and what is left of it.
class ReadyNodes {
 public:
  ReadyNodes(const compiler::NodeDependencies& deps, compiler::NodeDependencies::Segment segment)
      : deps_(deps), segment_(segment), waiting_(static_cast<size_t>(segment.end - segment.begin)) {
    for (int32_t i = segment.begin; i < segment.end; ++i) {
      for (int32_t s : deps.successors[i]) {
        if (s < segment.end) ++waiting_[s - segment.begin];
      }
    }
    for (int32_t i = segment.begin; i < segment.end; ++i) {
      if (waiting_[i - segment.begin] == 0) ready_.push_back(i);
    }
    std::make_heap(ready_.begin(), ready_.end(), std::greater<>());
    unfinished_ = waiting_.size();
  }

  // The next node to run (its index), -1 when none is ready now, or -2 when
  // the segment is over for this thread.
  int32_t take(uint32_t& epoch) {
    std::lock_guard<std::mutex> lock(mutex_);
    epoch = epoch_.load(std::memory_order_relaxed);
    if (unfinished_ == 0 || (stopping_ && running_ == 0)) return -2;
    if (stopping_ || ready_.empty()) return -1;
    std::pop_heap(ready_.begin(), ready_.end(), std::greater<>());
    const int32_t node = ready_.back();
    ready_.pop_back();
    ++running_;
    return node;
  }

  // Node `node` returned; `stop`: no node starts after it.
  void finished(int32_t node, bool stop) {
    std::lock_guard<std::mutex> lock(mutex_);
    --running_;
    --unfinished_;
    stopping_ = stopping_ || stop;
    for (int32_t s : deps_.successors[node]) {
      if (s < segment_.end && --waiting_[s - segment_.begin] == 0) {
        ready_.push_back(s);
        std::push_heap(ready_.begin(), ready_.end(), std::greater<>());
      }
    }
    epoch_.fetch_add(1, std::memory_order_release);
  }

  // Waits until a node finishes after `epoch` was read: briefly spinning
  // (a node of a replayed step takes microseconds), then yielding the core.
  void waitForChange(uint32_t epoch) const {
    for (int spins = 0; epoch_.load(std::memory_order_acquire) == epoch; ++spins) {
      if (spins < 4096) {
        __builtin_ia32_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  const compiler::NodeDependencies& deps_;
  const compiler::NodeDependencies::Segment segment_;
  std::mutex mutex_;
  std::vector<int32_t> waiting_;  // per node of the segment: predecessors yet to return
  std::vector<int32_t> ready_;    // a min-heap of node indices
  size_t unfinished_ = 0;
  size_t running_ = 0;
  bool stopping_ = false;
  std::atomic<uint32_t> epoch_{0};  // counts the nodes that returned
};

// The second thread of every segment: one persistent thread, its kernels on
// one thread each (as the pipeline's IPU threads set theirs). Not an OpenMP
// team: oneDNN kernels made for two threads wait at barriers for both, and
// inside a team only one would come. A child of fork(), which has no such
// thread, runs its segments on the calling thread alone.
class SecondThread {
 public:
  static SecondThread& get() {
    static SecondThread thread;
    return thread;
  }

  // Runs `theirs` on the second thread and `mine` here, and returns when both
  // have; false, having run neither, when another caller has the thread.
  bool tryRun(const std::function<void()>& theirs, const std::function<void()>& mine) {
    const pid_t owner = owner_.load();
    if (owner != 0 && owner != getpid()) return false;
    std::unique_lock<std::mutex> caller(caller_, std::try_to_lock);
    if (!caller) return false;
    Threading& t = *threading_;
    {
      std::lock_guard<std::mutex> lock(t.mutex);
      if (!t.thread.joinable()) {
        owner_ = getpid();
        t.thread = std::thread([this] { loop(); });
      }
      job_ = &theirs;
      done_ = false;
    }
    t.changed.notify_all();
    mine();  // does not throw (see runSegmentOnTwoThreads)
    std::unique_lock<std::mutex> lock(t.mutex);
    t.changed.wait(lock, [this] { return done_; });
    return true;
  }

  ~SecondThread() {
    if (owner_.load() != 0 && owner_.load() != getpid()) {
      // A child of fork() holds copies of its parent's thread handle and
      // condition variable, not a thread: destroying the joinable handle would
      // abort, and the condition variable counts the parent's waiting thread,
      // so destroying it would wait for ever. Both are let go.
      static_cast<void>(threading_.release());
      return;
    }
    {
      std::lock_guard<std::mutex> lock(threading_->mutex);
      stopping_ = true;
    }
    threading_->changed.notify_all();
    if (threading_->thread.joinable()) threading_->thread.join();
  }

 private:
  SecondThread() = default;

  void loop() {
    at::internal::lazy_init_num_threads();  // which would set the count again
    omp_set_num_threads(1);
    Threading& t = *threading_;
    std::unique_lock<std::mutex> lock(t.mutex);
    while (true) {
      t.changed.wait(lock, [this] { return stopping_ || job_ != nullptr; });
      if (stopping_) return;
      const std::function<void()>* job = std::exchange(job_, nullptr);
      lock.unlock();
      (*job)();
      lock.lock();
      done_ = true;
      t.changed.notify_all();
    }
  }

  struct Threading {
    std::mutex mutex;
    std::condition_variable changed;
    std::thread thread;  // started by the first tryRun
  };

  std::mutex caller_;  // held by the caller whose segment runs
  std::unique_ptr<Threading> threading_ = std::make_unique<Threading>();
  const std::function<void()>* job_ = nullptr;
  bool done_ = true;
  bool stopping_ = false;
  std::atomic<pid_t> owner_{0};  // the process that started the thread
};

}  // namespace

bool interOpAvailable() { return at::get_num_threads() >= 2 && !omp_in_parallel(); }

void runSegmentOnTwoThreads(const compiler::NodeDependencies& deps,
                            compiler::NodeDependencies::Segment segment, bool stop_on_failure,
                            const std::function<bool(size_t, int)>& run_node) {
  ReadyNodes nodes(deps, segment);
  std::exception_ptr errors[2];
  auto work = [&](int thread) {
    uint32_t epoch = 0;
    for (int32_t node; (node = nodes.take(epoch)) != -2;) {
      if (node < 0) {
        nodes.waitForChange(epoch);
        continue;
      }
      bool ok = false;
      try {
        ok = run_node(static_cast<size_t>(node), thread);
      } catch (...) {
        if (!errors[thread]) errors[thread] = std::current_exception();
      }
      nodes.finished(node, !ok && (stop_on_failure || errors[thread]));
    }
  };
  const at::ThreadLocalState caller_state;
  const int64_t session = profiling::currentSession();
  const std::function<void()> theirs = [&] {
    const at::ThreadLocalStateGuard state(caller_state);
    const profiling::SessionScope in_session(session, 1);
    work(1);
  };
  bool ran = false;
  {
    const KernelThreads one(1);
    ran = SecondThread::get().tryRun(theirs, [&] { work(0); });
  }
  if (!ran) work(0);  // alone, its kernels on every core
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace poptorch::runtime
