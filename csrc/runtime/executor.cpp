#include "runtime/executor.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <ATen/core/stack.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include "common/ivalue_tensors.h"
#include "ir/hash.h"

namespace poptorch::runtime {
namespace {

void releaseIpuStorage(void* context) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(context));
}

c10::Storage borrowedHostStorage(c10::StorageImpl& ipu_storage) {
  return c10::Storage(
      c10::Storage::use_byte_size_t(), ipu_storage.nbytes(),
      c10::DataPtr(ipu_storage._mutable_data_ptr_no_checks().get(), c10::Device(c10::kCPU)),
      /*allocator=*/nullptr, /*resizable=*/false);
}

at::Tensor viewOf(const c10::Storage& storage, const ir::TensorRef& ref) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storage),
                                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   c10::scalarTypeToTypeMeta(ref.dtype));
  impl->set_sizes_and_strides(ref.sizes, ref.strides, ref.offset);
  impl->_set_conj(ref.conj);
  impl->_set_neg(ref.neg);
  return at::Tensor(std::move(impl));
}

c10::Storage newHostStorage(int64_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes),
                      c10::GetCPUAllocator(), /*resizable=*/false);
}

// For random ops without a generator argument: the default generator runs
// them from the captured seed, then gets its own state back.
class DefaultGeneratorSeeded {
 public:
  explicit DefaultGeneratorSeeded(uint64_t seed)
      : generator_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    saved_ = generator_.clone();
    generator_.set_current_seed(seed);
  }
  ~DefaultGeneratorSeeded() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_.get_state());
  }
  DefaultGeneratorSeeded(const DefaultGeneratorSeeded&) = delete;
  DefaultGeneratorSeeded& operator=(const DefaultGeneratorSeeded&) = delete;

 private:
  at::Generator generator_;
  at::Generator saved_;
};

class Run {
 public:
  Run(const compiler::Executable& exe, const std::vector<c10::StorageImpl*>& storages,
      uint64_t seed_salt)
      : exe_(exe), host_(exe.program.buffers.size()), seed_salt_(seed_salt) {
    // The caller keeps the ipu storages alive while the run lasts: the host
    // views borrow their bytes without taking references.
    for (size_t b = 0; b < host_.size(); ++b) {
      if (exe.roles[b] == compiler::BufferRole::kExternal)
        host_[b] = borrowedHostStorage(*storages[b]);
    }
  }

  void node(size_t index, const ir::Node& source) {
    const ir::Node& node = exe_.program.nodes[index];
    stack_.clear();
    for (size_t a = 0; a < node.args.size(); ++a) {
      const ir::Arg& arg = node.args[a];
      switch (arg.kind) {
        case ir::ArgKind::kConstant:
          stack_.push_back(arg.value);
          break;
        case ir::ArgKind::kRuntime:
          stack_.push_back(source.args[a].value);
          break;
        case ir::ArgKind::kTensor:
          stack_.push_back(input(node.inputs[arg.refs[0]]));
          break;
        case ir::ArgKind::kTensorList:
          stack_.push_back(tensorList(node, arg));
          break;
      }
    }
    if (source.seed && node.generator_arg >= 0) {
      stack_[node.generator_arg] = at::make_generator<at::CPUGeneratorImpl>(seedOf(source));
      call(node);
    } else if (source.seed) {
      DefaultGeneratorSeeded seeded(seedOf(source));
      call(node);
    } else {
      call(node);
    }

    size_t next_output = 0;
    for (size_t r = 0; r < stack_.size(); ++r) {
      if (!node.fresh_returns[r]) continue;
      forEachTensor(stack_[r], [&](const at::Tensor& result) {
        if (!result.defined()) return;
        TORCH_INTERNAL_ASSERT(next_output < node.outputs.size(), node.name(),
                              " returned more tensors than captured");
        place(node, node.outputs[next_output++], result);
      });
    }
    for (ir::BufferId b : exe_.release_after[index]) host_[b] = c10::Storage();
  }

 private:
  uint64_t seedOf(const ir::Node& source) const {
    return seed_salt_ == 0 ? *source.seed : ir::hashCombine(*source.seed, seed_salt_);
  }

  void call(const ir::Node& node) {
    node.op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack_);
  }

  at::Tensor input(const ir::TensorRef& ref) {
    c10::Storage& storage = host_[ref.buffer];
    if (!storage) storage = newHostStorage(exe_.program.buffers[ref.buffer].nbytes);
    return viewOf(storage, ref);
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
  // layout capture predicted and does not alias one of the node's inputs.
  bool adoptable(const ir::Node& node, const ir::TensorRef& ref, const at::Tensor& result) const {
    if (result.scalar_type() != ref.dtype || result.storage_offset() != ref.offset ||
        !result.sizes().equals(ref.sizes) || !result.strides().equals(ref.strides) ||
        static_cast<int64_t>(result.storage().nbytes()) < exe_.program.buffers[ref.buffer].nbytes) {
      return false;
    }
    for (const ir::TensorRef& in : node.inputs) {
      if (host_[in.buffer].is_alias_of(result.storage())) return false;
    }
    return true;
  }

  void place(const ir::Node& node, const ir::TensorRef& ref, const at::Tensor& result) {
    if (!result.sizes().equals(ref.sizes)) {
      // Some Meta kernels disagree with the host kernel about an auxiliary
      // result that one of them leaves empty (batch-norm statistics in eval
      // mode, embedding_bag's bookkeeping); the captured shape stands.
      TORCH_CHECK(result.numel() == 0 || ref.numel() == 0, node.name(),
                  ": the host kernel returned a result of shape ", result.sizes(),
                  " where its Meta kernel predicted ", c10::IntArrayRef(ref.sizes),
                  "; this op cannot run on the ipu.");
      return;
    }
    c10::Storage& storage = host_[ref.buffer];
    if (exe_.roles[ref.buffer] != compiler::BufferRole::kExternal) {
      if (adoptable(node, ref, result)) {
        storage = result.storage();
        return;
      }
      storage = newHostStorage(exe_.program.buffers[ref.buffer].nbytes);
    }
    viewOf(storage, ref).copy_(result);
  }

  const compiler::Executable& exe_;
  std::vector<c10::Storage> host_;
  uint64_t seed_salt_;
  torch::jit::Stack stack_;
};

}  // namespace

void execute(const compiler::Executable& exe, const ir::Graph& captured,
             const std::vector<c10::StorageImpl*>& storages, uint64_t seed_salt) {
  // Kernels run on plain CPU tensors: no autograd or view tracking is wanted.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  Run run(exe, storages, seed_salt);
  for (size_t i = 0; i < exe.program.nodes.size(); ++i) {
    run.node(i, captured.nodes[exe.program.nodes[i].source_index]);
  }
}

c10::Storage hostStorageOf(c10::StorageImpl& ipu_storage) {
  c10::raw::intrusive_ptr::incref(&ipu_storage);
  void* data = ipu_storage._mutable_data_ptr_no_checks().get();
  return c10::Storage(c10::Storage::use_byte_size_t(), ipu_storage.nbytes(),
                      c10::DataPtr(data, &ipu_storage, &releaseIpuStorage, c10::Device(c10::kCPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

at::Tensor hostAlias(const at::Tensor& ipu_tensor) {
  return viewOf(hostStorageOf(*ipu_tensor.storage().unsafeGetStorageImpl()),
                ir::TensorRef::of(ipu_tensor, /*buffer=*/0));
}

}  // namespace poptorch::runtime
