#include "runtime/step_variants.h"

#include <algorithm>
#include <optional>

#include "common/logging.h"
#include "common/metrics.h"

namespace poptorch::runtime {

StepVariants::StepVariants(std::shared_ptr<Program> first, Capture capture)
    : capture_(std::move(capture)) {
  variants_.push_back({std::move(first), 0});
}

std::vector<size_t> StepVariants::takeRan() {
  std::vector<size_t> ran;
  for (size_t i = 0; i < ran_.size(); ++i) {
    if (ran_[i]) ran.push_back(i);
  }
  ran_.assign(ran_.size(), false);
  return ran;
}

const Program& StepVariants::ranFront() {
  const size_t index = variants_.front().index;
  if (ran_.size() <= index) ran_.resize(index + 1, false);
  ran_[index] = true;
  return *variants_.front().program;
}

const Program* StepVariants::unguarded() const {
  const Program* program = only();
  return program != nullptr && !program->hasGuards() ? program : nullptr;
}

const Program* StepVariants::only() const {
  return variants_.size() == 1 ? variants_[0].program.get() : nullptr;
}

bool StepVariants::writes(const c10::StorageImpl* storage) const {
  return std::any_of(variants_.begin(), variants_.end(), [storage](const Variant& variant) {
    return variant.program->writes(storage);
  });
}

const Program& StepVariants::run(uint64_t seed_salt) {
  std::optional<GuardFailure> failure;
  for (size_t i = 0; i < variants_.size(); ++i) {
    try {
      variants_[i].program->run(seed_salt);
      // Data tends to repeat: the variant that applied is tried first next time.
      std::rotate(variants_.begin(), variants_.begin() + static_cast<std::ptrdiff_t>(i),
                  variants_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return ranFront();
    } catch (const GuardFailure& f) {
      Metrics::get().guardFailed();
      failure = f;
    }
  }
  POPTORCH_LOG(kInfo) << "capturing the step again: " << failure->what() << " (read at "
                      << failure->site << ")";
  std::shared_ptr<Program> fresh = capture_(*failure);
  // Counted even if it fails below: the capture's Python side counts it.
  const size_t index = captures_++;
  try {
    fresh->run(seed_salt);
  } catch (const GuardFailure& f) {
    TORCH_CHECK(false, "the step read a value on the host at ", f.site,
                " that changed between capturing the step and running it on the same data (",
                f.what(),
                "): it depends on something other than the inputs and weights, "
                "such as random numbers. Move that read out of the model.");
  }
  variants_.insert(variants_.begin(), {std::move(fresh), index});
  return ranFront();
}

}  // namespace poptorch::runtime
