// torch.compile(backend="ipu") (poptorch/_dynamo_backend.py): a graph dynamo
// captured runs once on ipu tensors under a whole-step capture, and the
// program that results is replayed on the tensors of every later call, from
// C++, with no Python per op (as torch_xla's dynamo bridge replays a lazily
// traced graph by its hash, binding the call's tensors as its inputs).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "runtime/program.h"

namespace poptorch::capture {

class GraphReplay {
 public:
  // The tensors to capture the graph on for `inputs` (ipu tensors): each
  // input, or a copy of it with its sizes and strides on a storage of its own
  // when its view does not span its storage from the start (or has the
  // conjugate or negative bit), as replays bind them (see run()). Runs what is
  // pending first, so that the inputs hold their values.
  static std::vector<at::Tensor> captureInputs(const std::vector<at::Tensor>& inputs);

  // Keeps `program`, captured on `inputs` (from captureInputs) to compute
  // `outputs` (ipu tensors), for the calls whose inputs have the same sizes,
  // strides, dtypes and devices.
  void add(const runtime::Program& program, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& outputs);

  // The graph's outputs on `inputs`, new tensors computed by the program
  // captured for their layout (what is pending runs first). Nullopt when none
  // was captured for it, when its guards fail, or when this thread captures a
  // step whole (the graph's ops must then join the step).
  std::optional<std::vector<at::Tensor>> run(const std::vector<at::Tensor>& inputs) const;

  size_t size() const;

 private:
  struct Input {
    ir::TensorRef layout;  // sizes, strides and dtype (offset and buffer unused)
    c10::Device device;
    ir::BufferId buffer = -1;  // -1: the program does not read it
    int alias_of = -1;         // an earlier input on the same storage when captured
    bool written = false;      // the program writes it in place
  };
  // A storage the graph creates: a new one for every call.
  struct FreshStorage {
    int64_t nbytes = 0;
    c10::Device device;
    ir::BufferId buffer = -1;  // -1: no node touches it
  };
  struct Output {
    ir::TensorRef view;  // offset relative to the input's when it views one
    int input = -1;      // the input it is a view of, if any
    int fresh = -1;      // else the fresh storage it is a view of, if any
    c10::Storage kept;   // else a storage the program keeps (a constant)
  };
  struct Variant {
    std::unique_ptr<runtime::Program> program;  // with inputs and fresh storages unbound
    std::vector<Input> inputs;
    std::vector<FreshStorage> fresh;
    std::vector<Output> outputs;
    bool random = false;  // random ops draw new values on every call
  };

  bool matches(const Variant& variant, const std::vector<at::Tensor>& inputs) const;
  std::vector<at::Tensor> runVariant(const Variant& variant,
                                     const std::vector<at::Tensor>& inputs) const;

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const Variant>> variants_;
};

}  // namespace poptorch::capture
