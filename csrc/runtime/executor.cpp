#include "runtime/executor.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <ATen/core/stack.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>

#include "common/default_generator.h"
#include "common/denormal_mode.h"
#include "common/ivalue_tensors.h"
#include "common/kernel_warnings.h"
#include "device/ipu_device.h"
#include "ir/hash.h"
#include "profiling/profiler.h"
#include "runtime/arena.h"
#include "runtime/deterministic_algorithms.h"
#include "runtime/guard_failure.h"
#include "runtime/inter_op.h"
#include "runtime/result_blocks.h"

namespace poptorch::runtime {
namespace {

void releaseIpuStorage(void* context) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(context));
}

// A CPU storage over `nbytes` at `data` that does not own them. Kernels may
// resize what they write (see Run::settle): growing it moves it to memory of
// its own, from the CPU allocator.
c10::Storage borrowedHostStorage(void* data, size_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      c10::DataPtr(data, c10::Device(c10::kCPU)), c10::GetCPUAllocator(),
                      /*resizable=*/true);
}

at::Tensor viewOf(const c10::Storage& storage, const ir::TensorRef& ref, c10::IntArrayRef strides) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storage),
                                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   c10::scalarTypeToTypeMeta(ref.dtype));
  impl->set_sizes_and_strides(ref.sizes, strides, ref.offset);
  impl->_set_conj(ref.conj);
  impl->_set_neg(ref.neg);
  return at::Tensor(std::move(impl));
}

at::Tensor viewOf(const c10::Storage& storage, const ir::TensorRef& ref) {
  return viewOf(storage, ref, ref.strides);
}

// True if `t` is the view `ref` with `strides`: the same elements, read the
// same way (kernels may leave a result lazily conjugated, linalg_lu_solve).
bool hasLayout(const at::Tensor& t, const ir::TensorRef& ref, c10::IntArrayRef strides) {
  return t.scalar_type() == ref.dtype && t.storage_offset() == ref.offset &&
         t.sizes().equals(ref.sizes) && t.strides().equals(strides) && t.is_conj() == ref.conj &&
         t.is_neg() == ref.neg;
}

// What one node's call needs of its own: each thread running nodes has one.
struct Frame {
  torch::jit::Stack stack;
  // The tensors the kernel writes as out= arguments (see Run::noteWritten).
  struct Written {
    at::Tensor tensor;
    const ir::TensorRef* ref;
    const void* data;
    size_t nbytes;
  };
  std::vector<Written> written;
};

// One run of a program. Nodes that do not depend on each other (see
// compiler::NodeDependencies) may run at the same time, each with a Frame of
// its own: they touch distinct elements of the per-buffer state.
class Run {
 public:
  Run(const compiler::Executable& exe, const std::vector<c10::StorageImpl*>& storages,
      uint64_t seed_salt)
      : exe_(exe),
        host_(exe.program.buffers.size()),
        channels_last_(exe.program.buffers.size(), 0),
        failed_(exe.program.buffers.size()),
        seed_salt_(seed_salt),
        denormal_mode_of_call_(DenormalModeOfCall::current()),
        arena_(ArenaPool::get().acquire(exe.arena_bytes)) {
    result_blocks::install();
    // The caller keeps the ipu storages alive while the run lasts: the host
    // views borrow their bytes without taking references.
    for (size_t b = 0; b < host_.size(); ++b) {
      if (exe.roles[b] == compiler::BufferRole::kExternal) {
        host_[b] = borrowedHostStorage(storages[b]->_mutable_data_ptr_no_checks().get(),
                                       storages[b]->nbytes());
        // A program that ran after this one was captured may have failed.
        failed_[b] = device::poisonOf(*storages[b]);
      }
    }
  }

  // Runs node `index` of the program. A node whose kernel fails, or that reads
  // what a failed node computes, computes nothing: its results and the buffers
  // it writes carry the error instead of a value. Returns false if it failed.
  bool node(size_t index, const ir::Graph& captured, Frame& f) {
    const ir::Node& source = captured.nodes[exe_.program.nodes[index].source_index];
    const ir::Node& node = exe_.program.nodes[index];
    std::exception_ptr error = failedInput(node);
    if (!error) {
      try {
        compute(index, node, source, captured, f);
      } catch (const GuardFailure&) {
        throw;  // the run never happened: see Program::runGuarded
      } catch (c10::Error& kernel_error) {
        kernel_error.add_context("raised by " + node.name() +
                                 " when the ipu ran it; the tensors computed from it hold no "
                                 "value and raise this error when used");
        error = std::current_exception();
      } catch (const std::exception&) {
        error = std::current_exception();
      }
    }
    if (!error) {
      // A fresh result is computed whole: whatever error its buffer held is gone.
      for (const ir::TensorRef& out : node.outputs) failed_[out.buffer] = nullptr;
      return true;
    }
    for (const ir::TensorRef& out : node.outputs) failed_[out.buffer] = error;
    for (ir::BufferId w : node.writes) failed_[w] = error;
    std::lock_guard<std::mutex> lock(first_error_mutex_);
    if (!first_error_ || index < first_error_node_) {
      first_error_ = error;
      first_error_node_ = index;
    }
    return false;
  }

  // Frees the temporaries whose last use is node `index`, once it and every
  // node before it that uses them have run.
  void release(size_t index) {
    for (ir::BufferId b : exe_.release_after[index]) host_[b] = c10::Storage();
  }

  // After the run: the ipu storages whose value it could not compute are
  // poisoned with their error, and those it computed whole again are cured.
  // Returns the run's first error.
  std::exception_ptr settlePoison(const std::vector<c10::StorageImpl*>& storages) const {
    for (size_t b = 0; b < failed_.size(); ++b) {
      if (exe_.roles[b] != compiler::BufferRole::kExternal) continue;
      if (failed_[b]) {
        device::poison(*storages[b], failed_[b]);
      } else {
        device::clearPoison(*storages[b]);
      }
    }
    return first_error_;
  }

 private:
  std::exception_ptr failedInput(const ir::Node& node) const {
    for (const ir::TensorRef& in : node.inputs) {
      if (failed_[in.buffer]) return failed_[in.buffer];
    }
    for (ir::BufferId w : node.writes) {
      if (failed_[w]) return failed_[w];
    }
    return nullptr;
  }

  void compute(size_t index, const ir::Node& node, const ir::Node& source,
               const ir::Graph& captured, Frame& f) {
    torch::jit::Stack& stack = f.stack;
    stack.clear();
    bool channels_last = false;  // some input is in channels-last layout
    bool planned = false;        // the compiler chose the layout of some input
    for (size_t a = 0; a < node.args.size(); ++a) {
      const ir::Arg& arg = node.args[a];
      switch (arg.kind) {
        case ir::ArgKind::kConstant:
          stack.push_back(arg.value);
          break;
        case ir::ArgKind::kRuntime:
          stack.push_back(arg.refs.empty() ? source.args[a].value
                                           : captured.nodes[arg.refs[0]].args[arg.refs[1]].value);
          break;
        case ir::ArgKind::kTensor: {
          const ir::TensorRef& ref = node.inputs[arg.refs[0]];
          stack.push_back(input(ref, arg.layout));
          channels_last = channels_last || arg.layout == ir::Layout::kChannelsLast ||
                          (arg.layout == ir::Layout::kAsIs && channels_last_[ref.buffer]);
          planned = planned || arg.layout != ir::Layout::kAsIs;
          break;
        }
        case ir::ArgKind::kTensorList:
          stack.push_back(tensorList(node, arg));
          break;
      }
    }
    if (channels_last && !planned) matchChannelsLast(node, stack);
    const std::optional<c10::OperatorHandle>& out_variant = exe_.out_variant[index];
    if (out_variant) stack.push_back(output(node.outputs[0]));
    const c10::OperatorHandle& op = out_variant ? *out_variant : node.op;
    const DeterministicAlgorithmsAsCalled deterministic(source, op, stack);
    const DenormalModeAs denormals(denormal_mode_of_call_.value_or(source.denormal_mode));
    std::optional<WarningsDiscarded> given_at_call;
    if (source.warnings_at_call) given_at_call.emplace();
    noteWritten(node, op, f);
    const result_blocks::Scope recycled_results;
    try {
      if (source.seed && node.generator_arg >= 0) {
        stack[node.generator_arg] = at::make_generator<at::CPUGeneratorImpl>(seedOf(source));
        call(op, stack);
      } else if (source.seed) {
        // A random op without a generator argument draws from the default one.
        const DefaultGeneratorBorrowed seeded(seedOf(source));
        call(op, stack);
      } else {
        call(op, stack);
      }
    } catch (GuardFailure& failure) {
      failure.node = node.source_index;
      throw;
    }
    for (const Frame::Written& w : f.written) settle(w);

    if (node.guard == ir::Guard::kShape) checkObserved(node, source, stack);
    // An out= kernel has written its result in place; other results are placed.
    if (out_variant) {
      checkPredicted(node, node.outputs[0], stack.back().toTensor());
    } else {
      placeResults(node, stack);
    }
  }

  uint64_t seedOf(const ir::Node& source) const {
    return seed_salt_ == 0 ? *source.seed : ir::hashCombine(*source.seed, seed_salt_);
  }

  // An op whose results depend on the data must return the non-tensor values
  // it returned when the step was captured (shapes are checked in place()).
  static void checkObserved(const ir::Node& node, const ir::Node& source,
                            const torch::jit::Stack& stack) {
    size_t next = 0;
    for (const c10::IValue& value : stack) {
      if (value.isTensor() || value.isTensorList()) continue;
      if (next < source.observed.size() &&
          c10::_fastEqualsForContainer(value, source.observed[next++])) {
        continue;
      }
      GuardFailure failure(node.name() + " returned " + c10::str(value) +
                           " where it returned another value when the step was captured");
      failure.node = node.source_index;
      throw failure;
    }
  }

  void placeResults(const ir::Node& node, const torch::jit::Stack& stack) {
    size_t next_output = 0;
    for (size_t r = 0; r < stack.size(); ++r) {
      if (!node.fresh_returns[r]) continue;
      forEachTensor(stack[r], [&](const at::Tensor& result) {
        if (!result.defined()) return;
        TORCH_INTERNAL_ASSERT(next_output < node.outputs.size(), node.name(),
                              " returned more tensors than captured");
        place(node, node.outputs[next_output++], result);
      });
    }
  }

  static void call(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    // Redispatching skips the dispatcher's own profiling hook: record the
    // node here so torch.profiler shows what an ipu program spends its time on.
    RECORD_FUNCTION(op.schema(), c10::ArrayRef<const c10::IValue>(stack.data(), stack.size()));
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  }

  // The bytes of buffer b: an ipu storage, or a temporary's place in the
  // arena, taken at the temporary's first use.
  c10::Storage& storageOf(ir::BufferId b) {
    c10::Storage& storage = host_[b];
    if (!storage) storage = arenaStorage(b);
    return storage;
  }

  c10::Storage arenaStorage(ir::BufferId buffer) const {
    return borrowedHostStorage(arena_.data() + exe_.arena_offset[buffer],
                               static_cast<size_t>(exe_.program.buffers[buffer].nbytes));
  }

  at::Tensor input(const ir::TensorRef& ref) {
    const c10::Storage& storage = storageOf(ref.buffer);
    if (channels_last_[ref.buffer]) return viewOf(storage, ref, channelsLastStrides(ref));
    return viewOf(storage, ref);
  }

  // Where a structured out= kernel writes the result `ref`: an empty tensor on
  // its buffer, as the functional kernel starts, which the kernel sizes.
  at::Tensor output(const ir::TensorRef& ref) {
    channels_last_[ref.buffer] = false;
    at::Tensor out = viewOf(storageOf(ref.buffer), ref);
    out.unsafeGetTensorImpl()->set_sizes_contiguous({0});
    return out;
  }

  // Notes each tensor the kernel writes as an out= argument, where capture
  // placed its result, and the bytes it had before the call.
  static void noteWritten(const ir::Node& node, const c10::OperatorHandle& op, Frame& f) {
    const torch::jit::Stack& stack = f.stack;
    f.written.clear();
    const auto& arguments = op.schema().arguments();
    auto note = [&](const at::Tensor& tensor, const ir::TensorRef& ref) {
      const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
      f.written.push_back({tensor, &ref, storage->data(), storage->nbytes()});
    };
    for (size_t a = 0; a < arguments.size(); ++a) {
      if (!arguments[a].is_out()) continue;
      if (a == node.args.size()) {  // the out= argument of the chosen out variant
        note(stack[a].toTensor(), node.outputs[0]);
        continue;
      }
      const ir::Arg& arg = node.args[a];
      if (arg.kind == ir::ArgKind::kTensor) {
        note(stack[a].toTensor(), node.inputs[arg.refs[0]]);
      } else if (arg.kind == ir::ArgKind::kTensorList) {
        const auto& list = stack[a].toListRef();
        for (size_t e = 0; e < list.size(); ++e) {
          if (arg.refs[e] >= 0) note(list[e].toTensor(), node.inputs[arg.refs[e]]);
        }
      }
    }
  }

  // Kernels may resize what they write: resize_output() of an out= argument,
  // or a structured kernel that sizes its result through intermediate shapes
  // (mse_loss). Growing past the buffer moves the storage to new memory, and any
  // resize may change the strides: the result then goes back into the buffer,
  // in the layout capture promised, and the storage gets its bytes back.
  void settle(const Frame::Written& w) {
    const ir::TensorRef& ref = *w.ref;
    c10::StorageImpl* storage = w.tensor.storage().unsafeGetStorageImpl();
    const bool moved = storage->data() != w.data;
    if (!moved && hasLayout(w.tensor, ref, ref.strides)) return;
    TORCH_CHECK(w.tensor.sizes().equals(ref.sizes), "the host kernel resized a result to ",
                w.tensor.sizes(), " where its Meta kernel predicted ", c10::IntArrayRef(ref.sizes),
                "; this op cannot run on the ipu.");
    at::Tensor result;
    if (moved) {
      c10::DataPtr fresh =
          storage->set_data_ptr(c10::DataPtr(const_cast<void*>(w.data), c10::Device(c10::kCPU)));
      const size_t fresh_nbytes = storage->nbytes();
      storage->set_nbytes(w.nbytes);
      result = viewOf(c10::Storage(c10::Storage::use_byte_size_t(), fresh_nbytes, std::move(fresh),
                                   /*allocator=*/nullptr, /*resizable=*/false),
                      ir::TensorRef::of(w.tensor, ref.buffer));
    } else {
      result = w.tensor.clone();  // the same bytes in another layout
    }
    viewOf(storageOf(ref.buffer), ref).copy_(result);
  }

  // Some CPU kernels silently assume that all their 4-D inputs share one
  // layout (native_group_norm_backward): in eager mode the autograd formulas
  // arrange it, but they ran at capture, when every tensor was contiguous. So
  // once one input is channels-last, the others follow, unless the node
  // writes to them.
  void matchChannelsLast(const ir::Node& node, torch::jit::Stack& stack) {
    for (size_t a = 0; a < node.args.size(); ++a) {
      const ir::Arg& arg = node.args[a];
      if (arg.kind != ir::ArgKind::kTensor) continue;
      const ir::TensorRef& ref = node.inputs[arg.refs[0]];
      if (ref.sizes.size() != 4 || node.writesInPlace(ref.buffer)) continue;
      stack[a] = inLayout(stack[a].toTensor(), ref, ir::Layout::kChannelsLast);
    }
  }

  at::Tensor input(const ir::TensorRef& ref, ir::Layout layout) {
    return inLayout(input(ref), ref, layout);
  }

  // `tensor`, the view `ref`, in `layout` as kernels recognise it: a view when
  // its bytes are already in that order, a copy otherwise.
  at::Tensor inLayout(at::Tensor tensor, const ir::TensorRef& ref, ir::Layout layout) {
    switch (layout) {
      case ir::Layout::kAsIs:
        return tensor;
      case ir::Layout::kContiguous:
        return tensor.contiguous();
      case ir::Layout::kChannelsLast: {
        constexpr auto kChannelsLast = c10::MemoryFormat::ChannelsLast;
        if (tensor.suggest_memory_format() == kChannelsLast) return tensor;
        // Size-1 dimensions make a tensor both contiguous and channels-last;
        // it then reads as NCHW unless its strides say otherwise.
        if (tensor.is_contiguous(kChannelsLast)) {
          return viewOf(host_[ref.buffer], ref, channelsLastStrides(ref));
        }
        return tensor.contiguous(kChannelsLast);
      }
    }
    return tensor;
  }

  static std::vector<int64_t> channelsLastStrides(const ir::TensorRef& ref) {
    return c10::get_channels_last_strides_2d(c10::IntArrayRef(ref.sizes));
  }

  c10::IValue tensorList(const ir::Node& node, const ir::Arg& arg) {
    if (arg.optional_elements) {
      c10::List<std::optional<at::Tensor>> list;
      list.reserve(arg.refs.size());
      for (int32_t r : arg.refs) {
        list.push_back(r < 0 ? std::optional<at::Tensor>() : input(node.inputs[r]));
      }
      return list;
    }
    c10::List<at::Tensor> list;
    list.reserve(arg.refs.size());
    for (int32_t r : arg.refs) list.push_back(input(node.inputs[r]));
    return list;
  }

  // A kernel's result can become the buffer itself when it has exactly the
  // layout `strides` and does not alias one of the node's inputs.
  bool adoptable(const ir::Node& node, const ir::TensorRef& ref, const at::Tensor& result,
                 c10::IntArrayRef strides) const {
    if (!hasLayout(result, ref, strides) ||
        static_cast<int64_t>(result.storage().nbytes()) < exe_.program.buffers[ref.buffer].nbytes) {
      return false;
    }
    for (const ir::TensorRef& in : node.inputs) {
      if (host_[in.buffer].is_alias_of(result.storage())) return false;
    }
    return true;
  }

  // A result the host kernel shaped otherwise than the Meta kernel predicted
  // would leave bytes of the ipu tensor unwritten: an error, never garbage.
  static void checkPredicted(const ir::Node& node, const ir::TensorRef& ref,
                             const at::Tensor& result) {
    TORCH_CHECK(result.sizes().equals(ref.sizes), node.name(),
                ": the host kernel returned a result of shape ", result.sizes(),
                " where its Meta kernel predicted ", c10::IntArrayRef(ref.sizes),
                "; this op cannot run on the ipu.");
  }

  void place(const ir::Node& node, const ir::TensorRef& ref, const at::Tensor& result) {
    if (node.guard == ir::Guard::kShape && !result.sizes().equals(ref.sizes)) {
      GuardFailure failure(node.name() + " returned a result of shape " + c10::str(result.sizes()) +
                           " where it returned " + c10::str(c10::IntArrayRef(ref.sizes)) +
                           " when the step was captured");
      failure.node = node.source_index;
      throw failure;
    }
    if (!result.sizes().equals(ref.sizes)) {
      // Some Meta kernels disagree with the host kernel about an auxiliary
      // result that one of them leaves empty (batch-norm statistics in eval
      // mode, embedding_bag's bookkeeping); the captured shape stands.
      if (result.numel() != 0 && ref.numel() != 0) checkPredicted(node, ref, result);
      return;
    }
    c10::Storage& storage = host_[ref.buffer];
    channels_last_[ref.buffer] = false;
    if (exe_.roles[ref.buffer] != compiler::BufferRole::kExternal) {
      if (adoptable(node, ref, result, ref.strides)) {
        storage = result.storage();
        return;
      }
      if (exe_.flexible_layout[ref.buffer] &&
          adoptable(node, ref, result, channelsLastStrides(ref))) {
        storage = result.storage();
        channels_last_[ref.buffer] = true;
        return;
      }
      storage = arenaStorage(ref.buffer);
    }
    viewOf(storage, ref).copy_(result);
  }

  const compiler::Executable& exe_;
  std::vector<c10::Storage> host_;
  // Per flexible-layout buffer: its producer's result was kept in
  // channels-last layout in this run.
  // (Bytes, not bits: nodes running at once write elements of their own.)
  std::vector<uint8_t> channels_last_;
  // Per buffer: the error that keeps it from holding a value, or null.
  std::vector<std::exception_ptr> failed_;
  std::mutex first_error_mutex_;
  std::exception_ptr first_error_;  // of the earliest node in program order that failed
  size_t first_error_node_ = 0;
  uint64_t seed_salt_;
  // A wrapped model's replay computes in the denormal mode of its call.
  std::optional<uint32_t> denormal_mode_of_call_;
  ArenaPool::Lease arena_;
};

// Runs node i of `exe` with `frame`, timed for profile reports when `profiling`.
bool runNode(Run& run, const compiler::Executable& exe, const ir::Graph& captured, size_t i,
             Frame& frame, bool profiling) {
  const ir::Node& source = captured.nodes[exe.program.nodes[i].source_index];
  const int64_t node_start = profiling ? profiling::now() : 0;
  const bool ok = run.node(i, captured, frame);
  if (profiling) profiling::nodeRan(exe, i, source, node_start, profiling::now());
  return ok;
}

// Runs nodes [begin, end) of `exe` in program order; false if one failed and
// `on_error` stops the run.
bool runRange(Run& run, Frame& frame, const compiler::Executable& exe, const ir::Graph& captured,
              size_t begin, size_t end, OnError on_error) {
  // Kernels run on plain CPU tensors: no autograd or view tracking is wanted.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // Timing each node costs only while a profile report is being made.
  const bool profiling = profiling::enabled();
  bool all_ran = true;
  for (size_t i = begin; i < end; ++i) {
    const bool ok = runNode(run, exe, captured, i, frame, profiling);
    run.release(i);
    all_ran = all_ran && ok;
    if (!ok && on_error == OnError::kStop) break;
  }
  return all_ran;
}

// Runs `exe` with the nodes of each of `ranges` on two threads, each kernel on
// one (runtime/inter_op.h), and the others in program order on the calling
// thread, each kernel on every core. A temporary whose last use in program
// order is in a two-thread range is freed after the whole range: a node before
// that use may still be reading it.
void runInRanges(Run& run, const compiler::Executable& exe, const ir::Graph& captured,
                 OnError on_error, const Ranges& ranges) {
  // (The other thread takes on the calling thread's state, this included.)
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const bool profiling = profiling::enabled();
  Frame frames[2];
  size_t next = 0;  // the first node not run yet
  for (const compiler::NodeDependencies::Segment& range : ranges) {
    if (range.end - range.begin < 2) continue;
    if (!runRange(run, frames[0], exe, captured, next, static_cast<size_t>(range.begin),
                  on_error) &&
        on_error == OnError::kStop) {
      return;
    }
    std::atomic<bool> failed{false};
    runSegmentOnTwoThreads(
        exe.dependencies, range, on_error == OnError::kStop, [&](size_t i, int thread) {
          const bool ok = runNode(run, exe, captured, i, frames[thread], profiling);
          if (!ok) failed.store(true, std::memory_order_relaxed);
          return ok;
        });
    for (int32_t i = range.begin; i < range.end; ++i) run.release(static_cast<size_t>(i));
    if (failed && on_error == OnError::kStop) return;
    next = static_cast<size_t>(range.end);
  }
  runRange(run, frames[0], exe, captured, next, exe.program.nodes.size(), on_error);
}

}  // namespace

std::exception_ptr execute(const compiler::Executable& exe, const ir::Graph& captured,
                           const std::vector<c10::StorageImpl*>& storages, uint64_t seed_salt,
                           OnError on_error, const Ranges* two_thread_ranges) {
  Run run(exe, storages, seed_salt);
  const bool profiling = profiling::enabled();
  const int64_t start = profiling ? profiling::now() : 0;
  if (two_thread_ranges != nullptr && !two_thread_ranges->empty() && interOpAvailable()) {
    runInRanges(run, exe, captured, on_error, *two_thread_ranges);
  } else {
    Frame frame;
    runRange(run, frame, exe, captured, 0, exe.program.nodes.size(), on_error);
  }
  if (profiling) profiling::programRan(exe, start, profiling::now());
  return run.settlePoison(storages);
}

class StagedRun::Impl {
 public:
  Impl(const compiler::Executable& exe, const ir::Graph& captured,
       const std::vector<c10::StorageImpl*>& storages, uint64_t seed_salt)
      : exe(exe), captured(captured), storages(storages), run(exe, storages, seed_salt) {}

  const compiler::Executable& exe;
  const ir::Graph& captured;
  const std::vector<c10::StorageImpl*>& storages;
  Run run;
  Frame frame;
  bool failed = false;
};

StagedRun::StagedRun(const compiler::Executable& exe, const ir::Graph& captured,
                     const std::vector<c10::StorageImpl*>& storages, uint64_t seed_salt)
    : impl_(std::make_unique<Impl>(exe, captured, storages, seed_salt)) {}
StagedRun::~StagedRun() = default;
StagedRun::StagedRun(StagedRun&&) noexcept = default;
StagedRun& StagedRun::operator=(StagedRun&&) noexcept = default;

bool StagedRun::runNodes(size_t begin, size_t end) {
  if (impl_->failed) return false;
  impl_->failed =
      !runRange(impl_->run, impl_->frame, impl_->exe, impl_->captured, begin, end, OnError::kStop);
  return !impl_->failed;
}

std::exception_ptr StagedRun::finish() { return impl_->run.settlePoison(impl_->storages); }

c10::Storage hostStorageOf(c10::StorageImpl& ipu_storage) {
  c10::raw::intrusive_ptr::incref(&ipu_storage);
  void* data = ipu_storage._mutable_data_ptr_no_checks().get();
  return c10::Storage(c10::Storage::use_byte_size_t(), ipu_storage.nbytes(),
                      c10::DataPtr(data, &ipu_storage, &releaseIpuStorage, c10::Device(c10::kCPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

at::Tensor hostAlias(const at::Tensor& ipu_tensor) {
  device::checkNotPoisoned(*ipu_tensor.storage().unsafeGetStorageImpl());
  return viewOf(hostStorageOf(*ipu_tensor.storage().unsafeGetStorageImpl()),
                ir::TensorRef::of(ipu_tensor, /*buffer=*/0));
}

at::Tensor hostBytes(c10::StorageImpl& ipu_storage) {
  ir::TensorRef ref;
  ref.dtype = c10::ScalarType::Byte;
  ref.sizes = {static_cast<int64_t>(ipu_storage.nbytes())};
  ref.strides = {1};
  return viewOf(hostStorageOf(ipu_storage), ref);
}

}  // namespace poptorch::runtime
