// The optimiser update of a trainingModel that accumulates gradients, chosen
// per iteration. torch.optim skips a parameter whose .grad is None (no weight
// decay, no momentum, no step count), so an iteration updates only the
// parameters its micro-batches gave gradients to; which ones depends on which
// variants of the micro-step (see StepVariants) ran in that iteration.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "runtime/program.h"

namespace poptorch::runtime {

class UpdateVariants {
 public:
  // The update after an iteration that ran the variants `ran` (capture
  // indices, ascending).
  using Choose = std::function<std::shared_ptr<Program>(const std::vector<size_t>& ran)>;

  // `first` is the update for variant 0 alone. With `choose_every_time`, the
  // choice is not this process's alone (processes replicating one model
  // agree on the parameters they update): `choose` is called after every
  // iteration, else once per set of variants.
  UpdateVariants(std::shared_ptr<Program> first, Choose choose, bool choose_every_time);

  const Program& forVariants(const std::vector<size_t>& ran);

 private:
  std::map<std::vector<size_t>, std::shared_ptr<Program>> chosen_;
  std::shared_ptr<Program> last_;  // with choose_every_time_: kept while it runs
  Choose choose_;
  bool choose_every_time_;
};

}  // namespace poptorch::runtime
