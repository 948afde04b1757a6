// Capture of ordinary operators. The op's Meta kernel runs at once on meta
// twins of the arguments, so shape and dtype errors surface at the line that
// caused them; the results are lazy ipu tensors with the inferred layout.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/ScopeExit.h>
#include <torch/library.h>

#include <optional>

#include "capture/capture.h"
#include "capture/default_dtype.h"
#include "capture/meta_inference.h"
#include "capture/op_traits.h"
#include "capture/pending_graph.h"
#include "capture/placement.h"
#include "capture/step_capture.h"
#include "common/denormal_mode.h"
#include "common/ivalue_tensors.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/storage_overlap.h"
#include "common/user_errors.h"
#include "device/ipu_device.h"
#include "device/ipu_tensor.h"
#include "profiling/profiler.h"
#include "runtime/worker.h"

namespace poptorch::capture {

std::string opName(const c10::OperatorHandle& op) {
  const c10::OperatorName& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

namespace {

// The ipu device the op runs on. Host tensors may only be 0-dim scalars that
// the op reads, as for CUDA (TensorIterator allows CPU scalars as inputs, never
// as outputs: an out= or in-place host tensor would not receive the result);
// host index tensors in Tensor?[] lists are uploaded by the caller.
// An ipu tensor whose value a failed graph could not compute raises that
// graph's error wherever it is used (see device::poison), before this.
std::optional<c10::Device> commonDevice(const c10::OperatorHandle& op, const OpTraits& traits,
                                        c10::ArrayRef<c10::IValue> arguments,
                                        bool allow_several_ipus) {
  std::optional<c10::Device> ipu;
  std::optional<c10::Device> other;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const bool in_index_list = traits.args[i].optional_tensor_list;
    const bool host_scalar_allowed = arguments[i].isTensor() && !traits.args[i].writes;
    forEachTensor(arguments[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.is_ipu()) {
        device::checkNotPoisoned(*t.storage().unsafeGetStorageImpl());
        if (!ipu) ipu = t.device();
        if (*ipu != t.device() && !allow_several_ipus) other = t.device();
      } else if (!(t.is_cpu() && (in_index_list || (t.dim() == 0 && host_scalar_allowed)))) {
        other = t.device();
      }
    });
  }
  TORCH_CHECK(!(ipu && other),
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ",
              *ipu, " and ", *other, "! (in ", opName(op), "; move them with .to(\"", *ipu, "\"))");
  return ipu;
}

// The device of an op with no ipu tensor argument: a factory asked for an ipu.
c10::Device factoryDevice(c10::ArrayRef<c10::IValue> arguments) {
  for (const c10::IValue& value : arguments) {
    if (value.isDevice() && value.toDevice().is_ipu() && value.toDevice().has_index()) {
      return value.toDevice();
    }
  }
  return device::ipu(device::currentIndex());
}

// Host tensors in Tensor?[] index lists become ipu tensors, as CUDA moves them.
void uploadIndexLists(const OpTraits& traits, torch::jit::Stack* stack, int device) {
  if (!traits.any_optional_tensor_list) return;
  const size_t first = stack->size() - traits.args.size();
  for (size_t i = 0; i < traits.args.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (!traits.args[i].optional_tensor_list || !value.isList()) continue;
    c10::List<std::optional<at::Tensor>> uploaded;
    for (const c10::IValue& element : value.toListRef()) {
      // A skipped dimension is None from Python and an undefined tensor from
      // C++ indexing (`v[:, mask] = 0`): both mean "no index".
      if (element.isNone() || !element.toTensor().defined()) {
        uploaded.push_back(std::nullopt);
      } else if (element.toTensor().is_cpu()) {
        uploaded.push_back(device::uploadToIpu(element.toTensor(), device));
      } else {
        uploaded.push_back(element.toTensor());
      }
    }
    value = uploaded;
  }
}

// Quantized tensors carry a quantizer that ipu tensors do not have (and the
// Meta kernels of quantize ops return float tensors): refuse them clearly
// rather than compute with the wrong dtype.
void checkNotQuantized(const c10::OperatorHandle& op, const OpTraits& traits,
                       c10::ArrayRef<c10::IValue> arguments) {
  for (size_t i = 0; i < arguments.size(); ++i) {
    bool quantized = traits.args[i].scalar_type && arguments[i].isInt() &&
                     c10::isQIntType(static_cast<c10::ScalarType>(arguments[i].toInt()));
    forEachTensor(arguments[i], [&](const at::Tensor& t) {
      quantized = quantized || (t.defined() && t.is_quantized());
    });
    if (quantized) refuseQuantized(opName(op));
  }
}

// While a step is captured whole, host tensors among an op's arguments (made
// in forward without a device, or held by the model outside its buffers) are
// constants of the step, as in PopTorch: they are uploaded to the op's ipu.
// 0-dim ones stay host scalars, and tensors the op writes stay where they are.
void uploadHostConstants(const OpTraits& traits, torch::jit::Stack* stack) {
  const size_t num_args = traits.args.size();
  const c10::ArrayRef<c10::IValue> arguments = torch::jit::last(*stack, num_args);
  int device = device::currentIndex();
  for (const c10::IValue& value : arguments) {
    forEachTensor(value, [&](const at::Tensor& t) {
      if (t.defined() && t.is_ipu()) device = t.device().index();
    });
  }
  for (size_t i = 0; i < num_args; ++i) {
    if (traits.args[i].writes) continue;
    c10::IValue& value = (*stack)[stack->size() - num_args + i];
    value = mapTensors(value, [&](const at::Tensor& t) {
      return t.defined() && t.is_cpu() && t.dim() > 0 ? device::uploadToIpu(t, device) : t;
    });
  }
}

// An out= tensor that its result resizes and that shares memory with the
// input at `input` is refused at the call, before anything is resized; `why`
// says what the kernel would do.
[[noreturn]] void refuseResizedOut(const c10::FunctionSchema& schema, size_t input,
                                   const at::Tensor& out, const Layout& layout, const char* why) {
  TORCH_CHECK(false, schema.name(), ": the out= tensor shares memory with the input '",
              schema.arguments()[input].name(), "' and the result resizes it from ", out.sizes(),
              " to ", c10::IntArrayRef(layout.sizes), ", so ", why,
              " Pass an out= tensor that is not an input, or use the returned tensor.");
}

// A pointwise op's out= tensor that its result resizes: the CPU's
// TensorIterator first refuses an out= tensor that overlaps an input, then
// never resizes one that is also an input (only outputs written alone are
// resized). The Meta kernels resize first, so check before their layout is
// mirrored. The CPU's overlap check gives up on a tensor that is not dense
// ("too hard") and computes; if the resized tensor then shares bytes with an
// input in another order, the kernel writes elements it has yet to read (the
// CPU's result depends on the order of its loop, and the host kernel run by
// the ipu refuses it when the graph runs), so that is refused at the call.
void checkResizedOut(const at::Tensor& out, const Layout& layout,
                     c10::ArrayRef<c10::IValue> arguments, const c10::FunctionSchema& schema) {
  if (out.sizes().equals(layout.sizes)) return;
  at::assert_no_internal_overlap(out);
  bool is_input = false;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!arguments[i].isTensor() || schema.arguments()[i].is_out()) continue;
    const at::Tensor& input = arguments[i].toTensor();
    if (!input.defined() || !input.is_ipu()) continue;
    TORCH_CHECK(storageOverlap(out, input) != at::MemOverlapStatus::Partial,
                "unsupported operation: some elements of the input tensor and the written-to "
                "tensor refer to a single memory location. Please clone() the tensor before "
                "performing the operation.");
    is_input = is_input || input.is_same(out);
  }
  TORCH_CHECK(!is_input, "output with shape ", out.sizes(), " doesn't match the broadcast shape ",
              c10::IntArrayRef(layout.sizes));
  const at::Tensor resized = device::ipuView(out.storage(), layout.sizes, layout.strides,
                                             layout.offset, out.scalar_type());
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!arguments[i].isTensor() || schema.arguments()[i].is_out()) continue;
    const at::Tensor& input = arguments[i].toTensor();
    if (input.defined() && input.is_ipu() &&
        storageOverlap(resized, input) == at::MemOverlapStatus::Partial) {
      refuseResizedOut(schema, i, out, layout,
                       "the kernel would write elements of that input before reading them (on "
                       "the CPU the result depends on the order of its loop).");
    }
  }
}

// Any other op's out= tensor that its result resizes and that shares bytes
// with one of its inputs: the kernel would read that input resized under it
// (the CPU computes from whatever the grown storage holds, an undefined
// result), so the call is refused before anything is resized.
void checkResizedOutIsNotAnInput(const at::Tensor& out, const Layout& layout,
                                 c10::ArrayRef<c10::IValue> arguments,
                                 const c10::FunctionSchema& schema) {
  if (out.sizes().equals(layout.sizes)) return;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!arguments[i].isTensor() || schema.arguments()[i].is_out()) continue;
    const at::Tensor& input = arguments[i].toTensor();
    if (!input.defined() || !input.is_ipu()) continue;
    const at::MemOverlapStatus overlap = storageOverlap(out, input);
    if (overlap == at::MemOverlapStatus::Full || overlap == at::MemOverlapStatus::Partial) {
      refuseResizedOut(schema, i, out, layout,
                       "the kernel would read that input resized under it (on the CPU the "
                       "result is undefined).");
    }
  }
}

// An out= argument the Meta kernel resized: give the ipu tensor the same
// layout, growing its storage if needed.
void mirrorLayout(const at::Tensor& ipu, const Layout& layout, PendingGraph& pending) {
  if (ipu.sizes().equals(layout.sizes) && ipu.strides().equals(layout.strides) &&
      ipu.storage_offset() == layout.offset) {
    return;
  }
  c10::StorageImpl* storage = ipu.storage().unsafeGetStorageImpl();
  const size_t nbytes =
      at::detail::computeStorageNbytes(layout.sizes, layout.strides, ipu.itemsize(), layout.offset);
  if (nbytes > storage->nbytes()) {
    runtime::Worker::get().waitIdle();  // queued programs may still use the old bytes
    device::growStorage(*storage, nbytes);
    pending.noteResize(storage);
  }
  ipu.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides, layout.offset);
}

ir::Arg makeArg(const ArgTraits& argument, const c10::IValue& value, ir::Node& node,
                PendingGraph& pending) {
  auto add_input = [&](const at::Tensor& t) {
    node.inputs.emplace_back().assign(t, pending.bufferOf(t));
    return static_cast<int32_t>(node.inputs.size() - 1);
  };
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) return ir::Arg::constant(value);
    if (t.is_ipu()) return ir::Arg::tensor(add_input(t));
    // A host scalar is copied, as the caller may change it before the graph
    // runs; a Python number PyTorch wrapped for this call cannot change.
    return ir::Arg::runtime(t.unsafeGetTensorImpl()->is_wrapped_number() ? t : t.clone());
  }
  if (value.isTensorList() || (value.isList() && argument.optional_tensor_list)) {
    ir::Arg arg;
    arg.kind = ir::ArgKind::kTensorList;
    arg.optional_elements = !value.isTensorList();
    for (const c10::IValue& element : value.toListRef()) {
      arg.refs.push_back(element.isNone() ? -1 : add_input(element.toTensor()));
    }
    return arg;
  }
  // Floats and Scalars are data, not structure: they may change from one run
  // of the same executable to the next.
  if (!value.isNone() && argument.runtime_number) return ir::Arg::runtime(value);
  return ir::Arg::constant(value);
}

// The result for one return the schema says is fresh: new lazy ipu tensors
// with the layout the Meta kernel inferred (and the CPU's storage size).
c10::IValue freshResult(const ReturnInfo& info, int device, ir::Node& node, PendingGraph& pending) {
  auto make = [&](const Layout& layout) -> at::Tensor {
    if (!layout.defined) return at::Tensor();
    at::Tensor result =
        device::emptyIpuTensor(layout.sizes, layout.strides, layout.dtype, device, layout.offset);
    if (layout.storage_nbytes > 0) {
      device::growStorage(*result.storage().unsafeGetStorageImpl(),
                          static_cast<size_t>(layout.storage_nbytes));
    }
    node.outputs.emplace_back().assign(result, pending.addResult(result));
    return result;
  };
  if (info.tensors.empty() && !info.is_list) return info.other;  // int, float, bool...
  if (!info.is_list) return make(info.tensors[0]);
  c10::List<at::Tensor> list;
  for (const Layout& layout : info.tensors) list.push_back(make(layout));
  return list;
}

// Whether an ipu argument on `storage` is an inference tensor.
bool viewsAnInferenceTensor(c10::ArrayRef<c10::IValue> arguments, const c10::Storage& storage) {
  bool inference = false;
  for (const c10::IValue& value : arguments) {
    forEachTensor(value, [&](const at::Tensor& t) {
      inference = inference || (t.defined() && t.is_ipu() && t.is_inference() &&
                                t.storage().is_alias_of(storage));
    });
  }
  return inference;
}

// The result for a return that is a view of an argument: an ipu tensor on the
// argument's storage with the view's metadata, conjugate and negative bits
// included (`conj(z).unfold(...)` reads the conjugate, as on the CPU). A view
// is an inference tensor where its base is one, in inference mode or not, as
// PyTorch's views take their base's dispatch keys: the TensorImpl gets its
// autograd keys from the mode it is made in.
c10::IValue viewResult(const ReturnInfo& info, c10::ArrayRef<c10::IValue> arguments) {
  const std::vector<c10::Storage> storages = argumentStorages(arguments);
  auto make = [&](const Layout& layout) -> at::Tensor {
    TORCH_INTERNAL_ASSERT(layout.storage >= 0, "a view result does not view an ipu argument");
    const c10::InferenceMode mode(viewsAnInferenceTensor(arguments, storages[layout.storage]));
    at::Tensor view = device::ipuView(storages[layout.storage], layout.sizes, layout.strides,
                                      layout.offset, layout.dtype);
    view.unsafeGetTensorImpl()->_set_conj(layout.conj);
    view.unsafeGetTensorImpl()->_set_neg(layout.neg);
    return view;
  };
  if (!info.is_list) return make(info.tensors[0]);
  c10::List<at::Tensor> list;
  for (const Layout& layout : info.tensors) list.push_back(make(layout));
  return list;
}

// True for an attention op given no dropout: it draws no random numbers on the
// CPU (the scaled_dot_product_attention kernels are tagged random for their
// dropout_p alone). Not a rule of seeded ops with a probability: the CPU's
// native_dropout and bernoulli given p = 0 still advance the generator, and
// dropout, feature_dropout and the alpha ones, which do not, return their
// input before any op reaches the ipu.
bool attentionWithoutDropout(const ir::Node& node, c10::ArrayRef<c10::IValue> arguments) {
  const std::optional<int> p = node.op.schema().argumentIndexWithName("dropout_p");
  return p && static_cast<size_t>(*p) < arguments.size() && arguments[*p].isDouble() &&
         arguments[*p].toDouble() == 0.0;
}

// Random ops take their seed now, from the generator they would have used.
// One that draws nothing takes none, as the CPU's generator gives none: a
// seeded op without a generator argument draws from the default generator
// at replay, which keeps its program on the calling thread (no inference lanes).
void drawSeed(ir::Node& node, const OpTraits& traits, c10::ArrayRef<c10::IValue> arguments) {
  if (!node.isNondeterministic() || attentionWithoutDropout(node, arguments)) return;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  node.generator_arg = traits.generator_arg;
  if (traits.generator_arg >= 0 && arguments[traits.generator_arg].isGenerator()) {
    generator = arguments[traits.generator_arg].toGenerator();
    TORCH_CHECK(generator.device().is_cpu(),
                "a random op on the ipu takes a cpu generator "
                "(ipu random numbers are drawn on the host), got one for ",
                generator.device());
  }
  std::lock_guard<std::mutex> lock(generator.mutex());
  node.seed = at::check_generator<at::CPUGeneratorImpl>(generator)->random64();
}

// Arguments an op writes although its schema does not say so: batch norm
// updates its running statistics in place when it trains.
std::vector<size_t> unannotatedWrites(const OpTraits& traits,
                                      c10::ArrayRef<c10::IValue> arguments) {
  switch (traits.unannotated_writes) {
    case UnannotatedWrites::kBatchNorm:
      return arguments[5].toBool() ? std::vector<size_t>{3, 4} : std::vector<size_t>{};
    case UnannotatedWrites::kBatchNormUpdateStats:
      return {1, 2};
    case UnannotatedWrites::kNone:
      break;
  }
  return {};
}

// PyTorch's host fallback returns fresh results on its first tensor argument's
// device: the host's for a CPU scalar first (`torch.masked_select(torch.tensor(2.),
// mask)`). They belong on the ipu of the op's ipu arguments.
void moveFreshResultsToIpu(const c10::OperatorHandle& op, c10::Device ipu,
                           torch::jit::Stack* stack) {
  const auto& returns = op.schema().returns();
  const size_t first = stack->size() - returns.size();
  for (size_t r = 0; r < returns.size(); ++r) {
    if (returns[r].alias_info() != nullptr) continue;
    c10::IValue& result = (*stack)[first + r];
    result = mapTensors(
        result, [&](const at::Tensor& t) { return t.defined() && t.is_cpu() ? t.to(ipu) : t; });
  }
}

// recordNode, prepareArguments and captureOp with the op's traits, looked up
// once per call. Reads the arguments only, and returns the op's results.
CapturedResults record(const c10::OperatorHandle& op, const OpTraits& traits,
                       c10::ArrayRef<c10::IValue> arguments, c10::Device device,
                       const MetaResult& meta, ir::Guard guard) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = traits.args.size();
  auto lock = PendingGraph::get().lock();
  PendingGraph& pending = PendingGraph::get();
  // The CPU kernel's warnings, as it gives them at each call.
  for (const c10::Warning& warning : meta.warnings) {
    c10::warn(warning);
    pending.noteWarning(warning);
  }
  ir::Node& node = pending.beginNode(op);
  bool committed = false;
  // A call that fails, or records nothing, leaves no node behind.
  const auto drop = c10::make_scope_exit([&] {
    if (!committed) pending.dropNode();
  });
  node.inputs.reserve(traits.tensor_args);
  node.guard = guard;
  node.deterministic = at::globalContext().deterministicAlgorithms();
  node.deterministic_warn_only = at::globalContext().deterministicAlgorithmsWarnOnly();
  node.denormal_mode = denormalMode();
  node.warnings_at_call = meta.warnings_at_call;
  node.scope = profiling::currentScope();
  for (size_t i = 0; i < num_args; ++i) {
    if (traits.args[i].is_out && arguments[i].isTensor() && arguments[i].toTensor().defined()) {
      const at::Tensor& out = arguments[i].toTensor();
      if (traits.pointwise) {
        checkResizedOut(out, meta.written[i][0], arguments, schema);
      } else {
        checkResizedOutIsNotAnInput(out, meta.written[i][0], arguments, schema);
      }
    }
  }
  for (size_t i = 0; i < num_args; ++i) {
    if (!traits.args[i].writes) continue;
    size_t next = 0;
    forEachTensor(arguments[i], [&](const at::Tensor& ipu) {
      const Layout& layout = meta.written[i][next++];
      if (!ipu.defined()) return;
      mirrorLayout(ipu, layout, pending);
      node.writes.push_back(pending.bufferOf(ipu));
    });
  }
  for (size_t i : unannotatedWrites(traits, arguments)) {
    const c10::IValue& value = arguments[i];
    if (value.isTensor() && value.toTensor().defined() && value.toTensor().is_ipu()) {
      node.writes.push_back(pending.bufferOf(value.toTensor()));
    }
  }
  node.args.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    node.args.push_back(makeArg(traits.args[i], arguments[i], node, pending));
  }
  drawSeed(node, traits, arguments);
  node.placement = placeCapturedOp(node, [&] {
    // Outside the blocks (the optimiser update), an op runs where its largest input lives.
    int64_t largest = -1;
    int ipu = 0;
    for (const c10::IValue& argument : arguments) {
      forEachTensor(argument, [&](const at::Tensor& t) {
        if (!t.defined() || !t.is_ipu() || static_cast<int64_t>(t.nbytes()) <= largest) return;
        largest = static_cast<int64_t>(t.nbytes());
        ipu = device::accountedIpu(*t.storage().unsafeGetStorageImpl());
      });
    }
    return ipu;
  });

  CapturedResults results;
  results.reserve(meta.returns.size());
  node.fresh_returns.reserve(meta.returns.size());
  bool only_views = !meta.returns.empty() && node.writes.empty();
  for (size_t r = 0; r < meta.returns.size(); ++r) {
    const c10::AliasInfo* alias = schema.returns()[r].alias_info();
    if (alias && alias->isWrite()) {
      results.emplace_back();  // the written argument: see replaceArguments
      node.fresh_returns.push_back(false);
    } else if (alias) {
      results.push_back(viewResult(meta.returns[r], arguments));
      node.fresh_returns.push_back(false);
    } else {
      const ReturnInfo& info = meta.returns[r];
      if (guard == ir::Guard::kShape && !info.is_list && info.tensors.empty()) {
        node.observed.push_back(info.other);
      }
      results.push_back(freshResult(info, device.index(), node, pending));
      node.fresh_returns.push_back(true);
      only_views = false;
    }
  }
  // A pure view op changes metadata only: no node, no data movement.
  if (!only_views) {
    committed = true;
    pending.commitNode();  // may run the graph: `node` is gone after it
  }
  return results;
}

// record() for an in-place call on an integer tensor that computes in the
// default dtype (`a.lt_(0.5)`): its out-of-place twin on the cast arguments,
// whose result is copied into the written tensor. The returns are the written
// tensor (see replaceArguments).
CapturedResults recordThroughTwin(const c10::OperatorHandle& op, const c10::OperatorHandle& twin,
                                  c10::ArrayRef<c10::IValue> arguments,
                                  c10::ArrayRef<c10::IValue> cast, c10::Device device,
                                  const MetaResult& cast_meta) {
  const CapturedResults result =
      record(twin, traitsOf(twin), cast, device, cast_meta, ir::Guard::kNone);
  arguments[0].toTensor().copy_(result[0].toTensor());
  return CapturedResults(op.schema().returns().size());
}

// record() for an ordinary call. One whose kernel would read the default dtype
// when it runs computes on its integer inputs cast to the default dtype of the
// call instead (default_dtype.h), as the CPU kernel computes at the call.
CapturedResults recordCall(const c10::OperatorHandle& op, const OpTraits& traits,
                           c10::ArrayRef<c10::IValue> arguments, c10::Device device,
                           const MetaResult& meta) {
  const DefaultDtypeCasts& casts = meta.default_dtype_casts;
  const std::optional<std::shared_ptr<const MetaResult>>& cast_call = meta.cast_call;
  if (casts.any() && (!cast_call || *cast_call)) {
    const c10::OperatorHandle& computed = casts.out_of_place ? *casts.out_of_place : op;
    const std::vector<c10::IValue> cast = castArguments(arguments, casts);
    if (!cast_call) {
      std::shared_ptr<const MetaResult> cast_meta = inferMeta(computed, cast);
      const std::shared_ptr<const MetaResult> uncast =
          casts.out_of_place ? inferMeta(computed, arguments) : nullptr;
      const MetaResult* expected = casts.out_of_place ? uncast.get() : &meta;
      const bool same = cast_meta && expected && !cast_meta->default_dtype_casts.any() &&
                        sameResults(*cast_meta, *expected);
      meta.cast_call = same ? std::move(cast_meta) : nullptr;
    }
    if (*cast_call && casts.out_of_place) {
      return recordThroughTwin(op, computed, arguments, cast, device, **cast_call);
    }
    if (*cast_call) return record(op, traits, cast, device, **cast_call, ir::Guard::kNone);
  }
  return record(op, traits, arguments, device, meta, ir::Guard::kNone);
}

// The arguments of `op` on `stack` replaced by `results` from record(), the
// written arguments it returns in their place.
void replaceArguments(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t num_args,
                      CapturedResults results) {
  const c10::FunctionSchema& schema = op.schema();
  const c10::ArrayRef<c10::IValue> arguments = torch::jit::last(*stack, num_args);
  for (size_t r = 0; r < results.size(); ++r) {
    const c10::AliasInfo* alias = schema.returns()[r].alias_info();
    if (alias && alias->isWrite()) results[r] = arguments[writtenArgumentIndex(schema, r)];
  }
  torch::jit::drop(*stack, num_args);
  for (c10::IValue& result : results) stack->push_back(std::move(result));
}

// The ipu device the op runs on, from its arguments as they are.
c10::Device deviceOf(const c10::OperatorHandle& op, const OpTraits& traits,
                     c10::ArrayRef<c10::IValue> arguments, bool allow_several_ipus) {
  std::optional<c10::Device> device = commonDevice(op, traits, arguments, allow_several_ipus);
  return device ? *device : factoryDevice(arguments);
}

// Whether preparing the arguments (prepare) may replace some of them.
bool preparingChangesArguments(const OpTraits& traits) {
  return capturingStep() || traits.any_optional_tensor_list;
}

c10::Device prepare(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack,
                    bool allow_several_ipus) {
  const size_t num_args = traits.args.size();
  if (capturingStep()) uploadHostConstants(traits, stack);
  const c10::Device device =
      deviceOf(op, traits, torch::jit::last(*stack, num_args), allow_several_ipus);
  uploadIndexLists(traits, stack, device.index());
  return device;
}

bool capture(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack,
             bool allow_several_ipus) {
  const c10::Device device = prepare(op, traits, stack, allow_several_ipus);
  const size_t num_args = traits.args.size();
  const std::shared_ptr<const MetaResult> meta = inferMeta(op, torch::jit::last(*stack, num_args));
  if (!meta) return false;
  replaceArguments(op, stack, num_args,
                   recordCall(op, traits, torch::jit::last(*stack, num_args), device, *meta));
  return true;
}

// Whether a call of an op tagged dynamic_output_shape has an output shape its
// arguments' metadata fix after all. The tag is per operator: index.Tensor
// carries it for boolean (and uint8) mask indices, which select as many
// elements as are true; with integer indices only, its result is the broadcast
// of the indices' shapes with the dimensions they do not index, which its Meta
// kernel computes. An index out of range is found when the graph runs (the
// CPU kernel's IndexError poisons the result, docs/architecture.md).
bool shapeFixedByArguments(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  static const c10::OperatorName kIndex("aten::index", "Tensor");
  if (op.operator_name() != kIndex || arguments.size() < 2) return false;
  for (const c10::IValue& element : arguments[1].toListRef()) {
    if (!element.isTensor() || !element.toTensor().defined()) continue;
    const c10::ScalarType dtype = element.toTensor().scalar_type();
    if (dtype == c10::ScalarType::Bool || dtype == c10::ScalarType::Byte) return false;
  }
  return true;
}

// linalg.cholesky_ex(A, check_errors=True) and the other *_ex ops: asked to
// raise an error that only the data can tell.
bool checksErrors(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  const std::vector<c10::Argument>& schema = op.schema().arguments();
  for (size_t i = 0; i < schema.size() && i < arguments.size(); ++i) {
    if (schema[i].name() == "check_errors" && arguments[i].isBool()) return arguments[i].toBool();
  }
  return false;
}

// Why `op` is not captured with `arguments`, or null. Without arguments: why
// it is not captured whatever they are.
const char* uncapturedReason(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  if (op.hasTag(at::Tag::dynamic_output_shape) && !shapeFixedByArguments(op, arguments)) {
    return "its output shape depends on the data";
  }
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) {
    return "it has no Meta kernel to infer its output shape";
  }
  return nullptr;
}

// captureBorrowed for an op that has a CPU kernel and whose output shape
// these arguments fix.
std::optional<CapturedResults> captureBorrowedCapturable(const c10::OperatorHandle& op,
                                                         const OpTraits& traits,
                                                         c10::ArrayRef<c10::IValue> arguments,
                                                         bool allow_several_ipus) {
  if (preparingChangesArguments(traits)) return std::nullopt;
  checkNotQuantized(op, traits, arguments);
  const c10::Device device = deviceOf(op, traits, arguments, allow_several_ipus);
  const std::shared_ptr<const MetaResult> meta = inferMeta(op, arguments);
  if (!meta) return std::nullopt;
  return recordCall(op, traits, arguments, device, *meta);
}

}  // namespace

size_t writtenArgumentIndex(const c10::FunctionSchema& schema, size_t return_index) {
  const c10::AliasInfo* alias = schema.returns()[return_index].alias_info();
  TORCH_INTERNAL_ASSERT(alias && alias->isWrite(), "return ", return_index, " of ", schema.name(),
                        " is not a written argument");
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* info = schema.arguments()[i].alias_info();
    if (info && info->isWrite() && info->beforeSets() == alias->beforeSets()) return i;
  }
  TORCH_INTERNAL_ASSERT(false, "no argument matches the alias set of a mutated return of ",
                        schema.name());
}

void recordNode(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device,
                const MetaResult& meta, ir::Guard guard) {
  const OpTraits& traits = traitsOf(op);
  const size_t num_args = traits.args.size();
  replaceArguments(op, stack, num_args,
                   record(op, traits, torch::jit::last(*stack, num_args), device, meta, guard));
}

c10::Device prepareArguments(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                             bool allow_several_ipus) {
  return prepare(op, traitsOf(op), stack, allow_several_ipus);
}

bool captureOp(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool allow_several_ipus) {
  return capture(op, traitsOf(op), stack, allow_several_ipus);
}

void hostFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const char* reason) {
  std::optional<c10::Device> ipu;
  for (const c10::IValue& argument : torch::jit::last(*stack, op.schema().arguments().size())) {
    forEachTensor(argument, [&](const at::Tensor& t) {
      if (!ipu && t.defined() && t.is_ipu()) ipu = t.device();
    });
  }
  // PyTorch's own host fallback: it copies ipu arguments to the CPU (a sync
  // point), runs the CPU kernel, and copies results and mutated arguments back.
  // An error here is the user's (the CPU would raise it too): not a fallback.
  at::native::cpu_fallback(op, stack);
  if (ipu) moveFreshResultsToIpu(op, *ipu, stack);
  const std::string name = opName(op);
  if (Metrics::get().hostFallback(name)) {
    POPTORCH_LOG(kWarn) << name << " ran on the host (" << reason
                        << "): a graph break. Counted in poptorch.metrics()['fallback_ops']; "
                           "logged once per op.";
  }
}

void ipuFallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  POPTORCH_CHECK_SUPPORTED(op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), opName(op),
                           " has no host kernel, so the emulated IPU cannot run it; it is not "
                           "supported on ipu tensors.");
  const OpTraits& traits = traitsOf(op);
  checkNotQuantized(op, traits, torch::jit::last(*stack, traits.args.size()));
  checkResultIsStrided(op);
  const char* reason = uncapturedReason(op, torch::jit::last(*stack, traits.args.size()));
  if (!reason) {
    const bool checks_errors = checksErrors(op, torch::jit::last(*stack, traits.args.size()));
    if (capture(op, traits, stack, /*allow_several_ipus=*/false)) {  // devices checked
      // The CPU (and CUDA, which synchronises for it) raises the error the
      // data gives at the call: run the graph now, outside a step capture.
      if (checks_errors && !capturingStep()) synchronize();
      return;
    }
    reason = "its Meta kernel could not infer its outputs";
  } else {
    // The host kernel gets every argument on the host, so it cannot make the
    // CPU's and CUDA's check that they share a device: make it here, as
    // capture() does (linalg.lstsq(ipu, cpu) ran without an error).
    deviceOf(op, traits, torch::jit::last(*stack, traits.args.size()),
             /*allow_several_ipus=*/false);
  }
  // A step captured whole cannot break: the op joins it, guarded.
  if (capturingStep()) {
    captureObservingResults(op, stack);
  } else {
    hostFallback(op, stack, reason);
  }
}

std::optional<CapturedResults> captureBorrowed(const c10::OperatorHandle& op,
                                               c10::ArrayRef<c10::IValue> arguments,
                                               bool allow_several_ipus) {
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU) ||
      uncapturedReason(op, arguments)) {
    return std::nullopt;
  }
  return captureBorrowedCapturable(op, traitsOf(op), arguments, allow_several_ipus);
}

UnboxedOp::UnboxedOp(const char* name, const char* overload)
    : op(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)),
      traits(computeTraits(op)),
      capturable(op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU) &&
                 uncapturedReason(op, {}) == nullptr) {}

std::optional<CapturedResults> captureBorrowed(const UnboxedOp& unboxed,
                                               c10::ArrayRef<c10::IValue> arguments) {
  if (!unboxed.capturable) return std::nullopt;
  return captureBorrowedCapturable(unboxed.op, *unboxed.traits, arguments,
                                   /*allow_several_ipus=*/false);
}

void synchronize() {
  auto lock = PendingGraph::get().lock();
  if (std::exception_ptr error = PendingGraph::get().flush()) std::rethrow_exception(error);
}

}  // namespace poptorch::capture
