// The captured program: a list of ATen operator calls in program order over
// *buffers* (one per ipu storage the program touches). Each tensor an op reads
// or writes is a strided view (TensorRef) of a buffer, so views, aliasing and
// in-place updates are represented exactly as PyTorch performed them.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <absl/container/flat_hash_map.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace poptorch::ir {

using BufferId = int32_t;

// A strided view of a buffer, in elements of `dtype`.
struct TensorRef {
  BufferId buffer = -1;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t offset = 0;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  // PyTorch's lazy conjugation and negation bits of the view.
  bool conj = false;
  bool neg = false;

  bool operator==(const TensorRef& other) const = default;
  int64_t numel() const;
  // True if the view reads all of a buffer of `nbytes`, from its start, in
  // row-major order: the buffer then holds exactly this tensor.
  bool coversWhole(int64_t nbytes) const;
  // The view `tensor` takes of `buffer`.
  static TensorRef of(const at::Tensor& tensor, BufferId buffer);
  // Becomes of(tensor, buffer) where it is (a node's lists keep their views
  // inline: capture fills them in place rather than moving one in).
  void assign(const at::Tensor& tensor, BufferId buffer);
};

enum class ArgKind : uint8_t {
  kConstant,    // part of the program's structure (ints, shapes, dtypes, flags...)
  kTensor,      // an ipu tensor: refs[0] indexes Node::inputs
  kTensorList,  // Tensor[] / Tensor?[]: refs index Node::inputs, -1 for None
  kRuntime,     // a value that may change between runs without changing the
                // program: floating/integer Scalars and host scalar tensors.
                // Kept out of the structural hash.
};

// The memory layout in which the runtime hands a tensor argument to its
// kernel; chosen by passes::planLayouts, not part of the captured structure.
enum class Layout : uint8_t {
  kAsIs,          // whatever layout the buffer holds
  kContiguous,    // row-major (NCHW)
  kChannelsLast,  // NHWC
};

struct Arg {
  ArgKind kind = ArgKind::kConstant;
  c10::IValue value;  // kConstant and kRuntime
  // kTensor and kTensorList: see ArgKind. kRuntime: empty, the value is the
  // same argument of the node's source node (Node::source_index) in the graph
  // as captured; or {node, arg} for a node that a pass fused, whose value is
  // argument `arg` of captured node `node`. Inline, as capture makes an Arg
  // per argument of every op.
  c10::SmallVector<int32_t, 2> refs;
  bool optional_elements = false;  // kTensorList of Tensor?[]
  Layout layout = Layout::kAsIs;   // kTensor

  static Arg constant(c10::IValue v) { return {ArgKind::kConstant, std::move(v)}; }
  static Arg runtime(c10::IValue v) { return {ArgKind::kRuntime, std::move(v)}; }
  static Arg tensor(int32_t ref) { return {ArgKind::kTensor, {}, {ref}}; }
};

// A step captured whole (trainingModel/inferenceModel) is specialised on what
// the host read while capturing it; a guard checks on every run that this
// still holds (see runtime::GuardFailure).
enum class Guard : uint8_t {
  kNone,
  kValue,  // a poptorch::guard_equal node: its input must hold the value read
  kShape,  // an op whose output shape depends on the data: the shapes seen must recur
};

// Where a node runs in a model split over several IPUs (poptorch.BeginBlock,
// poptorch.Block): the block that captured it (its index in the order blocks
// began; kBeforeBlocks / kOutsideBlocks otherwise), the block's pipeline stage
// (or shard), phase and IPU. Nodes of unannotated graphs keep the defaults.
struct Placement {
  static constexpr int32_t kBeforeBlocks = -1;   // before the first block: stage 0, IPU 0
  static constexpr int32_t kOutsideBlocks = -2;  // after a `with Block` scope closed
  int32_t block = kBeforeBlocks;
  int32_t stage = 0;
  int32_t phase = 0;
  int32_t ipu = 0;

  bool operator==(const Placement& other) const = default;
};

// How the IPU plans a matrix multiplication's temporary memory, as
// poptorch.serializedMatMul and poptorch.set_available_memory ask (see
// compiler/strategy_memory.h): computed in `factor` parts along `split`, its
// temporaries bounded by `available_memory` of the IPU's memory (negative:
// the model's Options.setAvailableMemoryProportion, else PopLibs' 0.6).
struct MatMulPlan {
  enum class Split : uint8_t { kNone, kInputChannels, kReducingDim, kOutputChannels };
  Split split = Split::kNone;
  int32_t factor = 1;
  float available_memory = -1;

  bool operator==(const MatMulPlan& other) const = default;
};

// A node's lists keep the common op's elements inline (a binary op: two tensor
// inputs, one result, up to four arguments), so capturing it allocates nothing
// for them (capture makes a node per op; docs/performance.md). Larger ops
// spill to the heap as std::vector would.
using Args = c10::SmallVector<Arg, 4>;
using Inputs = c10::SmallVector<TensorRef, 2>;
using Outputs = c10::SmallVector<TensorRef, 1>;
using BufferIds = c10::SmallVector<BufferId, 2>;

struct Node {
  c10::OperatorHandle op;
  Args args;
  Inputs inputs;     // every ipu tensor argument, as read
  Outputs outputs;   // fresh results, each on a buffer of its own
  BufferIds writes;  // buffers the op mutates in place
  // Per schema return: true if it is a fresh result (its tensors are the next
  // entries of `outputs`), false if it aliases a mutated argument.
  c10::SmallVector<bool, 4> fresh_returns;
  int32_t source_index = -1;  // position in the graph as captured
  // Random ops: the seed drawn when the op was called, so that the values
  // follow the generator state at the call (torch.manual_seed, fork_rng) and
  // not the state when the graph runs. Runtime data: not hashed.
  std::optional<uint64_t> seed;
  int32_t generator_arg = -1;  // index of the op's Generator? argument, if any
  Guard guard = Guard::kNone;
  // torch.use_deterministic_algorithms(mode, warn_only=...) when the op was
  // called: some kernels compute otherwise under it (see
  // runtime/deterministic_algorithms.h). Hashed, as the denormal mode is.
  bool deterministic = false;
  bool deterministic_warn_only = false;
  // The calling thread's denormal mode (torch.set_flush_denormal) at the
  // call: float kernels obey it as they run. Hashed: graphs captured in other
  // modes compute other values and share no executable.
  uint32_t denormal_mode = 0;
  // The call gave the CPU kernel's warnings (capture/cpu_checks.h): its run
  // does not give them again. Runtime data: not hashed.
  bool warnings_at_call = false;
  // kShape: the op's non-tensor results (bools, ints...) when it was captured,
  // in order; they must recur too. Runtime data: not hashed.
  std::vector<c10::IValue> observed;
  Placement placement;
  MatMulPlan matmul;  // matrix multiplications only
  // The name scope it was captured in (profiling::pushScope), or -1: how
  // reports name it. Not hashed.
  int32_t scope = -1;

  explicit Node(c10::OperatorHandle handle) : op(std::move(handle)) {}
  std::string name() const;
  bool isNondeterministic() const;
  // True if the state of the call that kernels obey as they run (denormal
  // mode, deterministic algorithms) is `other`'s: only then may passes merge
  // or fuse the two nodes.
  bool sameStateOfCall(const Node& other) const;
  // aten::mm, bmm, addmm, baddbmm or _addmm_activation (see matMulOperands).
  bool isMatMul() const;
  // A matrix multiplication's operands, as read: (lhs, rhs).
  std::pair<const TensorRef*, const TensorRef*> matMulOperands() const;
  // Whether one of `inputs` views `buffer`.
  bool reads(BufferId buffer) const;
  // Whether the node writes `buffer` in place (it is in `writes`).
  bool writesInPlace(BufferId buffer) const;
  // Whether the node changes `buffer`: in place, or as a fresh result.
  bool changes(BufferId buffer) const;
  // Whether it reads, writes or makes `buffer`.
  bool touches(BufferId buffer) const { return reads(buffer) || changes(buffer); }
  // True for an op that acts on the host beyond its results: any op outside
  // ATen's namespaces (poptorch's printing and host callbacks, users' custom
  // ops, whose kernels may run Python), except poptorch's fused kernels
  // (csrc/kernels), which are ordinary kernels. Such a node is never eliminated nor
  // merged, and its program runs on the calling thread, one micro-batch after
  // another, so its effects happen in program order.
  bool hasHostEffects() const;
};

struct BufferInfo {
  int64_t nbytes = 0;
  c10::Device device{c10::DeviceType::IPU, 0};
  // True when the buffer existed before the graph (parameters, inputs, the
  // results of earlier graphs); false when a node or a factory made it.
  bool existed_before = false;
  // True when a tensor outside the graph still refers to it at the sync point:
  // its final value must be kept.
  bool live_after = false;
};

struct Graph {
  std::vector<BufferInfo> buffers;
  std::vector<Node> nodes;
  // Where in the user's code each guard's value was read, by source_index.
  absl::flat_hash_map<int32_t, std::string> guard_sites;

  BufferId addBuffer(BufferInfo info);
  // Keeps node i when keep[i], in order.
  void keepNodes(const std::vector<bool>& keep);
  // Drops the buffers no node reads, writes or makes, numbering the others in
  // the order the nodes first use them; returns the old id of each buffer kept.
  std::vector<BufferId> dropUnusedBuffers();
  std::string toString() const;
};

}  // namespace poptorch::ir
