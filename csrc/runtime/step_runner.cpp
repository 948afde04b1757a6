#include "runtime/step_runner.h"

#include <ATen/ops/zeros.h>

#include <cstring>

#include "common/metrics.h"
#include "runtime/executor.h"
#include "runtime/worker.h"

namespace poptorch::runtime {
namespace {

// Where micro-batch k's outputs go: a slot of the result, or nowhere.
class OutputSlots {
 public:
  explicit OutputSlots(const StepShape& shape) : shape_(shape) {
    const int64_t per_iteration = shape.accumulation * shape.replicas;
    switch (shape.output_mode) {
      case OutputMode::kAll: count_ = shape.iterations * per_iteration; break;
      case OutputMode::kEveryN:
        count_ = (shape.iterations / shape.return_period) * per_iteration;
        break;
      case OutputMode::kFinal:
      case OutputMode::kSum: count_ = shape.replicas; break;
    }
  }

  int64_t count() const { return count_; }
  bool sums() const { return shape_.output_mode == OutputMode::kSum; }

  // -1 when micro-batch k returns nothing.
  int64_t slotOf(int64_t k) const {
    const int64_t per_iteration = shape_.accumulation * shape_.replicas;
    const int64_t iteration = k / per_iteration;
    const int64_t within = k % per_iteration;
    const int64_t replica = k % shape_.replicas;
    switch (shape_.output_mode) {
      case OutputMode::kAll: return k;
      case OutputMode::kEveryN:
        if ((iteration + 1) % shape_.return_period != 0) return -1;
        return ((iteration + 1) / shape_.return_period - 1) * per_iteration + within;
      case OutputMode::kFinal:
        return k >= (shape_.iterations * per_iteration - shape_.replicas) ? replica : -1;
      case OutputMode::kSum: return replica;
    }
    return -1;
  }

 private:
  StepShape shape_;
  int64_t count_ = 0;
};

// A gathered output: slots x the device output's shape, returned with the slots
// folded into the first dimension (or stacked, for scalars; or dropped, for one).
class GatheredOutput {
 public:
  GatheredOutput(const at::Tensor& device_output, int64_t slots)
      : device_(device_output) {
    std::vector<int64_t> sizes{slots};
    sizes.insert(sizes.end(), device_output.sizes().begin(), device_output.sizes().end());
    slots_ = at::zeros(sizes, device_output.options().device(c10::kCPU));
  }

  void gather(int64_t slot, bool sum) {
    at::Tensor source = hostAlias(device_);
    at::Tensor target = slots_.select(0, slot);
    if (sum) {
      target.add_(source);
    } else {
      target.copy_(source);
    }
  }

  at::Tensor result() const {
    if (slots_.size(0) == 1) return slots_.squeeze(0);
    if (device_.dim() == 0) return slots_;
    return slots_.flatten(0, 1);
  }

 private:
  at::Tensor device_;
  at::Tensor slots_;
};

void copyRows(const at::Tensor& host, int64_t k, const at::Tensor& device) {
  const size_t nbytes = device.nbytes();
  TORCH_CHECK(host.is_contiguous() && device.is_contiguous() &&
                  host.scalar_type() == device.scalar_type() &&
                  static_cast<size_t>(host.nbytes()) >= (k + 1) * nbytes,
              "internal: a host batch does not match the device input it feeds");
  auto* source = static_cast<const char*>(host.const_data_ptr()) + k * nbytes;
  std::memcpy(device.mutable_data_ptr(), source, nbytes);
  Metrics::get().bytesToIpu(static_cast<int64_t>(nbytes));
}

}  // namespace

std::vector<at::Tensor> runSteps(const Program& micro_step, const Program* update,
                                 const std::vector<at::Tensor>& device_inputs,
                                 const std::vector<at::Tensor>& host_inputs,
                                 const std::vector<at::Tensor>& device_outputs,
                                 const StepShape& shape, uint64_t seed) {
  TORCH_CHECK(device_inputs.size() == host_inputs.size(),
              "internal: host and device inputs differ in number");
  Worker::get().waitIdle();
  const OutputSlots slots(shape);
  std::vector<GatheredOutput> outputs;
  outputs.reserve(device_outputs.size());
  for (const at::Tensor& d : device_outputs) outputs.emplace_back(d, slots.count());

  const int64_t per_iteration = shape.accumulation * shape.replicas;
  for (int64_t k = 0; k < shape.iterations * per_iteration; ++k) {
    for (size_t j = 0; j < device_inputs.size(); ++j) copyRows(host_inputs[j], k, device_inputs[j]);
    micro_step.run(seed + static_cast<uint64_t>(k) + 1);
    const int64_t slot = slots.slotOf(k);
    if (slot >= 0) {
      for (GatheredOutput& out : outputs) out.gather(slot, slots.sums());
    }
    if (update != nullptr && (k + 1) % per_iteration == 0) update->run();
  }

  std::vector<at::Tensor> results;
  results.reserve(outputs.size());
  for (const GatheredOutput& out : outputs) {
    results.push_back(out.result());
    Metrics::get().bytesFromIpu(static_cast<int64_t>(results.back().nbytes()));
  }
  return results;
}

}  // namespace poptorch::runtime
