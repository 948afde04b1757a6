#include "capture/graph_replay.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>

#include <algorithm>

#include "capture/pending_graph.h"
#include "capture/step_capture.h"
#include "common/denormal_mode.h"
#include "common/metrics.h"
#include "device/ipu_device.h"
#include "device/ipu_tensor.h"
#include "runtime/executor.h"
#include "runtime/guard_failure.h"
#include "runtime/worker.h"

namespace poptorch::capture {
namespace {

// Runs what is pending, so that the inputs hold their values. An error of
// those graphs stays in what it poisoned, and for the next synchronize().
void runPending() {
  auto lock = PendingGraph::get().lock();
  if (std::exception_ptr error = PendingGraph::get().flush()) {
    runtime::Worker::get().noteError(std::move(error));
  }
}

// A replay binds an input's storage as the buffer the program captured: the
// input's view must then be the whole storage, as captured.
bool bindable(const at::Tensor& t) {
  return t.storage_offset() == 0 && !t.is_conj() && !t.is_neg() &&
         t.storage().nbytes() ==
             at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize());
}

// A copy of `t` on a storage of its own, with its sizes and strides.
at::Tensor bindableCopy(const at::Tensor& t) {
  at::Tensor copy =
      device::emptyIpuTensor(t.sizes(), t.strides(), t.scalar_type(), t.device().index());
  device::materialize(*copy.storage().unsafeGetStorageImpl());
  device::materialize(*t.storage().unsafeGetStorageImpl());
  runtime::hostAlias(copy).copy_(runtime::hostAlias(t));
  return copy;
}

bool sameLayout(const ir::TensorRef& a, const at::Tensor& t) {
  return a.dtype == t.scalar_type() && c10::IntArrayRef(a.sizes) == t.sizes() &&
         c10::IntArrayRef(a.strides) == t.strides();
}

// -1 if the program does not touch `storage`.
ir::BufferId bufferOf(const runtime::Program& program, const c10::Storage& storage) {
  const std::vector<c10::Storage>& storages = program.storages();
  for (size_t b = 0; b < storages.size(); ++b) {
    if (storages[b] && storages[b].is_alias_of(storage)) return static_cast<ir::BufferId>(b);
  }
  return -1;
}

// A salt for the random ops of one replay, drawn from the default generator
// as eager random ops draw from it (torch.manual_seed makes it repeat).
uint64_t drawSeedSalt() {
  auto* generator = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(generator->mutex_);
  const uint64_t salt = generator->random64();
  return salt == 0 ? 1 : salt;  // 0 would replay the seeds drawn at capture
}

}  // namespace

std::vector<at::Tensor> GraphReplay::captureInputs(const std::vector<at::Tensor>& inputs) {
  runPending();
  std::vector<at::Tensor> tensors;
  tensors.reserve(inputs.size());
  for (const at::Tensor& t : inputs) {
    TORCH_CHECK(t.is_ipu(), "expected ipu tensors, got one on ", t.device());
    // Even an input never written is an input: the capture must not take it
    // for a temporary of its own, as later calls bring values.
    device::materialize(*t.storage().unsafeGetStorageImpl());
    tensors.push_back(bindable(t) ? t : bindableCopy(t));
  }
  return tensors;
}

void GraphReplay::add(const runtime::Program& program, const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& outputs) {
  auto variant = std::make_shared<Variant>();
  std::vector<c10::Storage> storages = program.storages();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    Input input{ir::TensorRef::of(t, -1), t.device()};
    input.buffer = bufferOf(program, t.storage());
    for (size_t j = 0; j < i && input.alias_of < 0; ++j) {
      if (inputs[j].storage().is_alias_of(t.storage())) input.alias_of = static_cast<int>(j);
    }
    if (input.buffer >= 0) {
      input.written = program.writes(t.storage().unsafeGetStorageImpl());
      storages[input.buffer] = c10::Storage();
    }
    variant->inputs.push_back(std::move(input));
  }
  std::vector<c10::Storage> fresh_storages;  // as captured, to find outputs sharing one
  for (const at::Tensor& t : outputs) {
    TORCH_CHECK(t.is_ipu() && !t.is_conj() && !t.is_neg(),
                "a replayed graph returns plain ipu tensors");
    Output output{ir::TensorRef::of(t, -1)};
    for (size_t i = 0; i < inputs.size() && output.input < 0; ++i) {
      if (inputs[i].storage().is_alias_of(t.storage())) {
        output.input = static_cast<int>(i);
        output.view.offset -= inputs[i].storage_offset();
      }
    }
    for (size_t f = 0; f < fresh_storages.size() && output.input < 0 && output.fresh < 0; ++f) {
      if (fresh_storages[f].is_alias_of(t.storage())) output.fresh = static_cast<int>(f);
    }
    if (output.input < 0 && output.fresh < 0) {
      const ir::BufferId b = bufferOf(program, t.storage());
      const bool made_here = b >= 0 ? !program.graph().buffers[b].existed_before
                                    : !device::isMaterialized(*t.storage().unsafeGetStorageImpl());
      if (made_here) {
        output.fresh = static_cast<int>(fresh_storages.size());
        fresh_storages.push_back(t.storage());
        variant->fresh.push_back({static_cast<int64_t>(t.storage().nbytes()), t.device(), b});
        if (b >= 0) storages[b] = c10::Storage();
      } else {
        output.kept = t.storage();
      }
    }
    variant->outputs.push_back(std::move(output));
  }
  for (const ir::Node& node : program.graph().nodes) variant->random |= node.seed.has_value();
  variant->program = program.rebound(std::move(storages));
  std::lock_guard<std::mutex> lock(mutex_);
  variants_.insert(variants_.begin(), std::move(variant));  // the newest is the likeliest
}

bool GraphReplay::matches(const Variant& variant, const std::vector<at::Tensor>& inputs) const {
  if (inputs.size() != variant.inputs.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& expected = variant.inputs[i];
    const at::Tensor& t = inputs[i];
    if (!t.is_ipu() || t.device() != expected.device || !sameLayout(expected.layout, t)) {
      return false;
    }
    // Captured as the same tensor twice: it must be again.
    if (expected.alias_of >= 0 &&
        (!t.storage().is_alias_of(inputs[expected.alias_of].storage()) ||
         t.storage_offset() != inputs[expected.alias_of].storage_offset())) {
      return false;
    }
  }
  return true;
}

std::optional<std::vector<at::Tensor>> GraphReplay::run(
    const std::vector<at::Tensor>& inputs) const {
  if (capturingStep()) return std::nullopt;
  std::vector<std::shared_ptr<const Variant>> variants;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    variants = variants_;
  }
  bool pending_ran = false;
  for (const auto& variant : variants) {
    if (!matches(*variant, inputs)) continue;
    if (!pending_ran) {
      runPending();
      pending_ran = true;
    }
    try {
      return runVariant(*variant, inputs);
    } catch (const runtime::GuardFailure&) {
      // This variant is specialised on other values: another may hold.
    }
  }
  return std::nullopt;
}

std::vector<at::Tensor> GraphReplay::runVariant(const Variant& variant,
                                                const std::vector<at::Tensor>& inputs) const {
  std::vector<c10::Storage> storages = variant.program->storages();
  // Inputs bound through a copy, and whether the program writes them back.
  std::vector<std::pair<at::Tensor, at::Tensor>> copied;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& input = variant.inputs[i];
    // An input on the storage of an earlier one shares its buffer, as captured.
    if (input.buffer < 0 || input.alias_of >= 0) continue;
    at::Tensor bound = inputs[i];
    if (!bindable(bound)) {
      bound = bindableCopy(bound);
      if (input.written) copied.emplace_back(inputs[i], bound);
    }
    device::materialize(*bound.storage().unsafeGetStorageImpl());
    storages[input.buffer] = bound.storage();
  }
  std::vector<c10::Storage> fresh;
  fresh.reserve(variant.fresh.size());
  for (const FreshStorage& f : variant.fresh) {
    at::Tensor bytes =
        device::emptyIpuTensor({f.nbytes}, {1}, c10::ScalarType::Byte, f.device.index());
    fresh.push_back(bytes.storage());
    if (f.buffer >= 0) {
      device::materialize(*fresh.back().unsafeGetStorageImpl());
      storages[f.buffer] = fresh.back();
    }
  }
  {
    // The CPU computes each call of the compiled function in the denormal mode of that call.
    const DenormalModeOfCall of_call(denormalMode());
    variant.program->rebound(std::move(storages))->run(variant.random ? drawSeedSalt() : 0);
  }
  for (const auto& [input, copy] : copied)
    runtime::hostAlias(input).copy_(runtime::hostAlias(copy));
  Metrics::get().dynamoReplay();

  std::vector<at::Tensor> outputs;
  outputs.reserve(variant.outputs.size());
  for (const Output& output : variant.outputs) {
    const ir::TensorRef& v = output.view;
    if (output.input >= 0) {
      const at::Tensor& base = inputs[output.input];
      outputs.push_back(device::ipuView(base.storage(), v.sizes, v.strides,
                                        base.storage_offset() + v.offset, v.dtype));
    } else {
      const c10::Storage& storage = output.fresh >= 0 ? fresh[output.fresh] : output.kept;
      outputs.push_back(device::ipuView(storage, v.sizes, v.strides, v.offset, v.dtype));
    }
  }
  return outputs;
}

size_t GraphReplay::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return variants_.size();
}

}  // namespace poptorch::capture
