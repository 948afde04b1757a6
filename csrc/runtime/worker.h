// The device queue: compiled programs run in order on one worker thread, so
// that the host can capture the next ops while the emulated IPU computes.
// Fork-safe: fork() waits until the queue is empty, and the child, which has
// no worker thread, starts its own at its first submit (as PyTorch's thread
// pools do).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/program.h"

namespace poptorch::runtime {

class Worker {
 public:
  static Worker& get();

  // Queues `program`; it runs after every program queued before it.
  void submit(std::unique_ptr<Program> program);
  // Waits until every queued program has run. Their errors poison the
  // storages they write (see Program::tryRun).
  void waitIdle();
  // True when no queued program waits or runs.
  bool idle();
  // Errors of lazy graphs (run here, or by the capturing thread) are kept
  // until the next sync point takes the first (null if none).
  void noteError(std::exception_ptr error);
  std::exception_ptr takeFirstError();

  // True if anything but the queued programs and `ours` other references
  // holds `storage`: whether a value is still wanted must not depend on how
  // far the queue has got.
  bool referencedElsewhere(const c10::Storage& storage, long ours);

  ~Worker();

 private:
  Worker();
  void loop();
  // pthread_atfork handlers.
  void beforeFork();
  void afterForkInParent();
  void afterForkInChild();

  // What fork() does not carry into a child: the thread, and the waits other
  // threads had on the condition variables (signalling them there would hang).
  // A child leaks the parent's and makes its own.
  struct Threading {
    std::condition_variable wake;  // the worker waits for programs
    std::condition_variable idle;  // others wait for an empty queue
    std::thread thread;            // started by the first submit
  };

  std::mutex mutex_;
  std::unique_ptr<Threading> threading_ = std::make_unique<Threading>();
  std::deque<std::unique_ptr<Program>> queue_;
  absl::flat_hash_map<const c10::StorageImpl*, long> in_flight_;  // references held by the queue
  bool busy_ = false;
  std::exception_ptr first_error_;
  bool stopping_ = false;
  std::unique_lock<std::mutex> fork_lock_;  // held across fork()
};

}  // namespace poptorch::runtime
