// A twin of a program with device inputs and outputs of its own, so that it
// can run another micro-batch at the same time (inference lanes, the
// micro-batches a pipeline holds in flight). Everything else (weights,
// accumulators) it shares.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "runtime/program.h"

namespace poptorch::runtime {

struct ProgramTwin {
  std::unique_ptr<Program> program;
  std::vector<at::Tensor> inputs;   // views of fresh storages, as `inputs` of the original
  std::vector<at::Tensor> outputs;  // likewise (an output that is an input's view stays one)
};

ProgramTwin twinWithOwnIo(const Program& program, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs);

}  // namespace poptorch::runtime
