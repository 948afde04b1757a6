// torch.set_flush_denormal(on) sets two bits of the calling thread's MXCSR,
// flush-to-zero and denormals-are-zero, which floating-point kernels obey as
// they run: `x * 1.5` of 1e-39 gives 0 under it and 1.5e-39 without. A
// captured node runs later, maybe on another thread, so it carries the mode
// of its call and the runtime computes it in that mode (a per-thread setting:
// no other thread sees the change).
#pragma once

#include <cstdint>
#include <optional>

namespace poptorch {

// The calling thread's denormal mode: its flush-to-zero and
// denormals-are-zero bits (0 on a CPU without them).
uint32_t denormalMode();

// True if `mode` is a value denormalMode() can return (any mix of its bits).
bool isDenormalMode(uint32_t mode);

// While it lives, the calling thread computes in `mode` (a value of
// denormalMode()); cheap when it already does.
class DenormalModeAs {
 public:
  explicit DenormalModeAs(uint32_t mode);
  ~DenormalModeAs();
  DenormalModeAs(const DenormalModeAs&) = delete;
  DenormalModeAs& operator=(const DenormalModeAs&) = delete;

 private:
  uint32_t before_;
  bool changed_;
};

// A wrapped model's call replays nodes captured at an earlier call; the CPU
// model computes each call in the mode of that call. While it lives, the runs
// this thread starts compute in `mode` instead of their nodes' modes.
class DenormalModeOfCall {
 public:
  explicit DenormalModeOfCall(uint32_t mode);
  ~DenormalModeOfCall();
  DenormalModeOfCall(const DenormalModeOfCall&) = delete;
  DenormalModeOfCall& operator=(const DenormalModeOfCall&) = delete;

  // The mode of the call this thread runs for, if any.
  static std::optional<uint32_t> current();

 private:
  std::optional<uint32_t> outer_;
};

}  // namespace poptorch
