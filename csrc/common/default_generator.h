// Borrowing PyTorch's default CPU generator for a random op that takes no
// generator argument, without changing what the user's code draws from it.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <mutex>
#include <optional>

namespace poptorch {

// While it lives, the default CPU generator is seeded with `seed` (if given);
// it gets its own state back when this ends. Borrowers take turns (the stages
// of a pipeline run random ops on several threads): a kernel locks the
// generator's own mutex while it draws, so that one cannot be held across.
class DefaultGeneratorBorrowed {
 public:
  explicit DefaultGeneratorBorrowed(std::optional<uint64_t> seed = std::nullopt)
      : one_at_a_time_(borrowers()), generator_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    saved_ = generator_.clone();
    if (seed) generator_.set_current_seed(*seed);
  }
  ~DefaultGeneratorBorrowed() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_.get_state());
  }
  DefaultGeneratorBorrowed(const DefaultGeneratorBorrowed&) = delete;
  DefaultGeneratorBorrowed& operator=(const DefaultGeneratorBorrowed&) = delete;

 private:
  static std::mutex& borrowers() {
    static std::mutex mutex;
    return mutex;
  }

  std::lock_guard<std::mutex> one_at_a_time_;
  at::Generator generator_;
  at::Generator saved_;
};

}  // namespace poptorch
