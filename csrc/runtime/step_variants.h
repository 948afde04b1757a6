// The micro-step of a trainingModel/inferenceModel as one program per set of
// values the host read while it was captured (`.item()`, `.cpu()`, an op whose
// output shape depends on the data). Each program is specialised on the values
// it saw and guarded; like torch.compile's guards, a run takes the first
// variant whose guards hold and, when none does, captures another one.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "runtime/guard_failure.h"
#include "runtime/program.h"

namespace poptorch::runtime {

class StepVariants {
 public:
  // Captures the step again for the data now in the device inputs, after
  // `failure`; may throw (e.g. when the values change too often).
  using Capture = std::function<std::shared_ptr<Program>(const GuardFailure& failure)>;

  StepVariants(std::shared_ptr<Program> first, Capture capture);

  // Runs one micro-step (see Program::run for `seed_salt`); returns the
  // variant that ran.
  const Program& run(uint64_t seed_salt);

  // The variants that ran since the last call, by capture index (the first
  // is 0, each capture the next; ascending): what an iteration's update
  // depends on (see UpdateVariants).
  std::vector<size_t> takeRan();

  // True if a variant writes `storage` in place.
  bool writes(const c10::StorageImpl* storage) const;

  // The only program, when the step read nothing on the host.
  const Program* unguarded() const;
  // The only variant, guarded or not.
  const Program* only() const;
  size_t size() const { return variants_.size(); }

 private:
  struct Variant {
    std::shared_ptr<Program> program;
    size_t index;  // of its capture
  };
  // Marks the front variant as run; returns it.
  const Program& ranFront();

  std::vector<Variant> variants_;  // most recently run first
  Capture capture_;
  size_t captures_ = 1;    // the first program was the first capture
  std::vector<bool> ran_;  // by capture index, since takeRan()
};

}  // namespace poptorch::runtime
