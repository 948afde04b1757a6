#include "runtime/replica_buffers.h"

#include <c10/util/strides.h>

#include "device/ipu_device.h"
#include "device/ipu_tensor.h"
#include "runtime/executor.h"

namespace poptorch::runtime {
namespace {

// A materialised ipu tensor like `t`: replicas' copies count against the IPU's memory.
at::Tensor ipuCopyOf(const at::Tensor& t) {
  at::Tensor copy = device::emptyIpuTensor(t.sizes(), c10::contiguous_strides(t.sizes()),
                                           t.scalar_type(), t.device().index());
  device::materialize(*copy.storage().unsafeGetStorageImpl());
  hostAlias(copy).copy_(hostAlias(t));
  return copy;
}

}  // namespace

ReplicaBuffers::ReplicaBuffers(std::vector<at::Tensor> buffers, int64_t replicas)
    : buffers_(std::move(buffers)), kept_(static_cast<size_t>(replicas)) {
  TORCH_CHECK(replicas >= 1, "internal: replica buffers for ", replicas, " replicas");
  for (at::Tensor& buffer : buffers_) {
    TORCH_CHECK(buffer.is_ipu(), "internal: a replicated buffer is not on the ipu");
    device::materialize(*buffer.storage().unsafeGetStorageImpl());
  }
  reset();
}

void ReplicaBuffers::select(int64_t replica) {
  if (replica == current_) return;
  for (size_t b = 0; b < buffers_.size(); ++b) {
    at::Tensor value = hostAlias(buffers_[b]);
    hostAlias(kept_[current_][b]).copy_(value);
    value.copy_(hostAlias(kept_[replica][b]));
  }
  current_ = replica;
}

void ReplicaBuffers::reset() {
  current_ = 0;
  for (std::vector<at::Tensor>& kept : kept_) {
    kept.clear();
    for (const at::Tensor& buffer : buffers_) kept.push_back(ipuCopyOf(buffer));
  }
}

}  // namespace poptorch::runtime
