// Options.broadcastBuffers(False): each replica of a wrapped model keeps the
// buffers the step updates in place (batch-norm statistics, counters) for
// itself, as each replica of PopTorch keeps them on its own IPU. The micro-step
// program is bound to one storage per buffer; before a micro-batch of another
// replica runs, the storages take that replica's values, and the values they
// held are kept for their replica.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace poptorch::runtime {

class ReplicaBuffers {
 public:
  // `buffers`: the ipu tensors the step updates. Every replica starts from
  // their current values.
  ReplicaBuffers(std::vector<at::Tensor> buffers, int64_t replicas);

  // The buffers hold `replica`'s values.
  void select(int64_t replica);
  // After a call: the buffers hold replica 0's values, which the host sees.
  void settle() { select(0); }
  // Every replica takes the buffers' current values (the host wrote them).
  void reset();

 private:
  std::vector<at::Tensor> buffers_;
  std::vector<std::vector<at::Tensor>> kept_;  // [replica][buffer]
  int64_t current_ = 0;
};

}  // namespace poptorch::runtime
