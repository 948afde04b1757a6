#include "runtime/worker.h"

#include <omp.h>
#include <pthread.h>

namespace poptorch::runtime {

Worker& Worker::get() {
  static Worker worker;
  return worker;
}

Worker::Worker() : fork_lock_(mutex_, std::defer_lock) {
  pthread_atfork([] { get().beforeFork(); }, [] { get().afterForkInParent(); },
                 [] { get().afterForkInChild(); });
}

void Worker::beforeFork() {
  // The child gets a copy of memory, not of threads: programs queued or
  // running now would never finish there, and their results are its data.
  fork_lock_.lock();
  threading_->idle.wait(fork_lock_, [this] { return queue_.empty() && !busy_; });
}

void Worker::afterForkInParent() { fork_lock_.unlock(); }

void Worker::afterForkInChild() {
  // The worker thread did not survive the fork: forget it (joining or
  // destroying a thread that is not ours would abort) and its condition
  // variables; another thread starts at the next submit.
  static_cast<void>(threading_.release());
  threading_ = std::make_unique<Threading>();
  fork_lock_.unlock();
}

void Worker::submit(std::unique_ptr<Program> program) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!threading_->thread.joinable()) threading_->thread = std::thread([this] { loop(); });
  for (const c10::Storage& s : program->storages()) {
    if (s) ++in_flight_[s.unsafeGetStorageImpl()];
  }
  queue_.push_back(std::move(program));
  threading_->wake.notify_one();
}

void Worker::waitIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  threading_->idle.wait(lock, [this] { return queue_.empty() && !busy_; });
}

bool Worker::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.empty() && !busy_;
}

void Worker::noteError(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!first_error_) first_error_ = std::move(error);
}

std::exception_ptr Worker::takeFirstError() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(first_error_, nullptr);
}

bool Worker::referencedElsewhere(const c10::Storage& storage, long ours) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_flight_.find(storage.unsafeGetStorageImpl());
  const long queued = it == in_flight_.end() ? 0 : it->second;
  return static_cast<long>(storage.use_count()) - ours - queued > 0;
}

void Worker::loop() {
  // The capturing thread keeps the other core busy: one thread for kernels here.
  omp_set_num_threads(1);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    threading_->wake.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    std::unique_ptr<Program> program = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    // A program's errors poison what it writes, and the programs after it
    // that read those storages poison what they write in turn.
    std::exception_ptr error = program->tryRun();
    lock.lock();
    if (!first_error_) first_error_ = std::move(error);
    // Counts and references go together, under the lock.
    for (const c10::Storage& s : program->storages()) {
      if (!s) continue;
      auto it = in_flight_.find(s.unsafeGetStorageImpl());
      if (--it->second == 0) in_flight_.erase(it);
    }
    program.reset();
    busy_ = false;
    if (queue_.empty()) threading_->idle.notify_all();
  }
}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    threading_->wake.notify_one();
  }
  if (threading_->thread.joinable()) threading_->thread.join();
}

}  // namespace poptorch::runtime
