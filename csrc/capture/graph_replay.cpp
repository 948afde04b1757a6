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
#include "ir/hash.h"
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
  noteViews(*variant, outputs);
  const ir::Graph& graph = program.graph();
  variant->input_of_buffer.assign(graph.buffers.size(), -1);
  variant->fresh_of_buffer.assign(graph.buffers.size(), -1);
  for (size_t i = variant->inputs.size(); i-- > 0;) {  // the first of aliased inputs
    if (variant->inputs[i].buffer >= 0) variant->input_of_buffer[variant->inputs[i].buffer] = i;
  }
  for (size_t f = 0; f < variant->fresh.size(); ++f) {
    if (variant->fresh[f].buffer >= 0) variant->fresh_of_buffer[variant->fresh[f].buffer] = f;
  }
  auto note_alignment = [&](const ir::TensorRef& ref) {
    const int i = variant->input_of_buffer[ref.buffer];
    if (i >= 0) {
      int64_t& align = variant->inputs[i].align;
      align = std::max<int64_t>(align, c10::elementSize(ref.dtype));
    }
  };
  for (const ir::Node& node : graph.nodes) {
    variant->random |= node.seed.has_value();
    for (const ir::TensorRef& ref : node.inputs) note_alignment(ref);
    for (const ir::TensorRef& ref : node.outputs) note_alignment(ref);
  }
  variant->joinable = !program.hasGuards();
  variant->program = program.rebound(std::move(storages));
  std::lock_guard<std::mutex> lock(mutex_);
  variants_.insert(variants_.begin(), std::move(variant));  // the newest is the likeliest
}

void GraphReplay::noteViews(Variant& variant, const std::vector<at::Tensor>& outputs) {
  // Outputs the graph returns as views of one tensor alias each other. Left as
  // tensors of their own on its storage, a later compiled graph taking two of
  // them finds no common `_base`, and AOTAutograd's synthetic base for them
  // cannot replay every view (an IndexError on the ipu where the CPU ran).
  std::vector<const c10::TensorImpl*> hidden;  // the hidden bases as captured
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& t = outputs[i];
    Output& output = variant.outputs[i];
    if (!t.is_view() || output.input >= 0) continue;  // AOTAutograd remakes views of inputs
    const at::Tensor base(t._base());
    if (base.scalar_type() != t.scalar_type()) continue;  // as_strided keeps the dtype
    for (size_t j = 0; j < outputs.size() && output.base_output < 0; ++j) {
      if (outputs[j].unsafeGetTensorImpl() == base.unsafeGetTensorImpl()) {
        output.base_output = static_cast<int>(j);
      }
    }
    if (output.base_output < 0) {
      auto it = std::find(hidden.begin(), hidden.end(), base.unsafeGetTensorImpl());
      if (it == hidden.end()) {
        hidden.push_back(base.unsafeGetTensorImpl());
        variant.hidden_bases.push_back({ir::TensorRef::of(base, -1), static_cast<int>(i)});
        it = hidden.end() - 1;
      }
      output.hidden_base = static_cast<int>(it - hidden.begin());
    }
    variant.returns_views = true;
  }
}

std::vector<at::Tensor> GraphReplay::withViews(const Variant& variant,
                                               std::vector<at::Tensor> outputs) {
  if (!variant.returns_views) return outputs;
  std::vector<at::Tensor> hidden;
  hidden.reserve(variant.hidden_bases.size());
  for (const HiddenBase& h : variant.hidden_bases) {
    const ir::TensorRef& v = h.view;
    hidden.push_back(device::ipuView(outputs[h.first_view].storage(), v.sizes, v.strides,
                                     v.offset, v.dtype));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Output& output = variant.outputs[i];
    if (output.base_output < 0 && output.hidden_base < 0) continue;
    const at::Tensor& base =
        output.base_output >= 0 ? outputs[output.base_output] : hidden[output.hidden_base];
    at::Tensor& t = outputs[i];
    t = base.as_strided(t.sizes(), t.strides(), t.storage_offset());
  }
  return outputs;
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
    if (variant->joinable) {
      if (auto outputs = join(*variant, inputs)) return withViews(*variant, std::move(*outputs));
    }
    if (!pending_ran) {
      runPending();
      pending_ran = true;
    }
    try {
      return withViews(*variant, runVariant(*variant, inputs));
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
  return outputsOf(variant, inputs, fresh);
}

std::optional<std::vector<at::Tensor>> GraphReplay::join(
    const Variant& variant, const std::vector<at::Tensor>& inputs) const {
  // The nodes view each input's storage where the input starts; views at
  // other element sizes need the start to fall on one of their elements.
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& input = variant.inputs[i];
    if (input.buffer < 0 || input.alias_of >= 0) continue;
    const at::Tensor& t = inputs[i];
    const int64_t start = t.storage_offset() * static_cast<int64_t>(t.itemsize());
    if (t.is_conj() || t.is_neg() || start % input.align != 0) return std::nullopt;
  }
  PendingGraph& pending = PendingGraph::get();
  auto lock = pending.lock();
  if (!joins_step_ && pending.size() == 0) return std::nullopt;  // runs now, with no lookup
  if (joined_generation_.load(std::memory_order_relaxed) == pending.generation() + 1) {
    if (std::exception_ptr error = pending.flush()) {
      runtime::Worker::get().noteError(std::move(error));
    }
  }
  joined_generation_.store(pending.generation() + 1, std::memory_order_relaxed);

  const ir::Graph& graph = variant.program->graph();
  const std::vector<c10::Storage>& kept = variant.program->storages();
  std::vector<ir::BufferId> to(graph.buffers.size(), -1);
  std::vector<int64_t> start(graph.buffers.size(), 0);  // in bytes
  std::vector<c10::Storage> fresh;
  fresh.reserve(variant.fresh.size());
  for (const FreshStorage& f : variant.fresh) {
    at::Tensor bytes =
        device::emptyIpuTensor({f.nbytes}, {1}, c10::ScalarType::Byte, f.device.index());
    if (f.buffer >= 0) to[f.buffer] = pending.addResult(bytes);
    fresh.push_back(bytes.storage());
  }
  for (size_t b = 0; b < graph.buffers.size(); ++b) {
    if (const int i = variant.input_of_buffer[b]; i >= 0) {
      const at::Tensor& t = inputs[i];
      to[b] = pending.bufferOf(t);
      start[b] = t.storage_offset() * static_cast<int64_t>(t.itemsize());
    } else if (kept[b]) {
      const auto nbytes = static_cast<int64_t>(kept[b].nbytes());
      to[b] = pending.bufferOf(device::ipuView(kept[b], {nbytes}, {1}, 0, c10::ScalarType::Byte));
    } else if (variant.fresh_of_buffer[b] < 0) {
      ir::BufferInfo temporary = graph.buffers[b];
      temporary.existed_before = temporary.live_after = false;
      to[b] = pending.addTemporary(temporary);
    }
  }
  auto rebind = [&](ir::TensorRef& ref) {
    if (start[ref.buffer] != 0) {
      ref.offset += start[ref.buffer] / static_cast<int64_t>(c10::elementSize(ref.dtype));
    }
    ref.buffer = to[ref.buffer];
  };
  // Random ops draw new values as a run with a salt would, and every node
  // computes in the denormal mode of this call.
  const uint64_t salt = variant.random ? drawSeedSalt() : 0;
  const uint32_t denormals = denormalMode();
  std::vector<ir::Node> nodes = graph.nodes;
  for (ir::Node& node : nodes) {
    for (ir::TensorRef& ref : node.inputs) rebind(ref);
    for (ir::TensorRef& ref : node.outputs) rebind(ref);
    for (ir::BufferId& w : node.writes) w = to[w];
    if (node.seed && salt != 0) node.seed = ir::hashCombine(*node.seed, salt);
    node.denormal_mode = denormals;
  }
  pending.appendNodes(std::move(nodes));
  Metrics::get().dynamoReplay();
  return outputsOf(variant, inputs, fresh);
}

std::vector<at::Tensor> GraphReplay::outputsOf(const Variant& variant,
                                               const std::vector<at::Tensor>& inputs,
                                               const std::vector<c10::Storage>& fresh) const {
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
