// torch.compile(backend="ipu") (poptorch/_dynamo_backend.py): a graph dynamo
// captured runs once on ipu tensors under a whole-step capture, and the
// program that results is replayed on the tensors of every later call, from
// C++, with no Python per op (as torch_xla's dynamo bridge replays a lazily
// traced graph by its hash, binding the call's tensors as its inputs).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "runtime/program.h"

namespace poptorch::capture {

class GraphReplay {
 public:
  // `joins_step`: the graph is part of a training step (AOTAutograd's
  // forward and backward graphs), so its replays always join the pending
  // graph (see run()); other graphs join it only when something is pending.
  explicit GraphReplay(bool joins_step = false) : joins_step_(joins_step) {}

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
  // captured for their layout. The program's nodes join the pending graph,
  // to run with what comes before and after them at the next sync point (a
  // training step's forward, backward and update as one program, whose
  // activations are temporaries), when the graph joins steps or something is
  // pending; otherwise it runs now (what is pending runs first). Nullopt when
  // none was captured for it, when its guards fail, or when this thread
  // captures a step whole (the graph's ops must then join the step).
  std::optional<std::vector<at::Tensor>> run(const std::vector<at::Tensor>& inputs) const;

  size_t size() const;

 private:
  struct Input {
    ir::TensorRef layout;  // sizes, strides and dtype (offset and buffer unused)
    c10::Device device;
    ir::BufferId buffer = -1;  // -1: the program does not read it
    int alias_of = -1;         // an earlier input on the same storage when captured
    bool written = false;      // the program writes it in place
    int64_t align = 1;         // the largest element size of the views of it nodes take
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
    // A view, in the captured graph, of another output or of a tensor the
    // graph made and did not return (the hidden base): returned as a view of
    // it, as eager would.
    int base_output = -1;
    int hidden_base = -1;
  };
  // A tensor the graph made and did not return, whose views it returns: on
  // the storage of its first view among the outputs.
  struct HiddenBase {
    ir::TensorRef view;  // sizes, strides and offset in that storage
    int first_view = -1;
  };
  struct Variant {
    std::unique_ptr<runtime::Program> program;  // with inputs and fresh storages unbound
    std::vector<Input> inputs;
    std::vector<FreshStorage> fresh;
    std::vector<Output> outputs;
    std::vector<HiddenBase> hidden_bases;
    bool returns_views = false;  // some output has a base_output or hidden_base
    bool random = false;    // random ops draw new values on every call
    bool joinable = false;  // no guards: its nodes may join the pending graph
    // Per buffer of the captured graph: the input or fresh storage bound to
    // it, or -1 (a storage the program keeps, or a temporary).
    std::vector<int> input_of_buffer;
    std::vector<int> fresh_of_buffer;
  };

  static void noteViews(Variant& variant, const std::vector<at::Tensor>& outputs);
  bool matches(const Variant& variant, const std::vector<at::Tensor>& inputs) const;
  std::vector<at::Tensor> runVariant(const Variant& variant,
                                     const std::vector<at::Tensor>& inputs) const;
  // The outputs of a run, or nullopt when they must be run now.
  std::optional<std::vector<at::Tensor>> join(const Variant& variant,
                                              const std::vector<at::Tensor>& inputs) const;
  std::vector<at::Tensor> outputsOf(const Variant& variant, const std::vector<at::Tensor>& inputs,
                                    const std::vector<c10::Storage>& fresh) const;
  // The outputs that are views in the captured graph made views again (through
  // the dispatcher: no lock may be held).
  static std::vector<at::Tensor> withViews(const Variant& variant,
                                           std::vector<at::Tensor> outputs);

  const bool joins_step_;
  // 1 + the pending graph's generation when a replay last joined it: a
  // pending graph holds one replay of a graph at most, so that a loop that
  // never synchronises runs one program per iteration, of one structure.
  mutable std::atomic<uint64_t> joined_generation_{0};
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const Variant>> variants_;
};

}  // namespace poptorch::capture
