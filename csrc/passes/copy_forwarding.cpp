#include <ATen/core/dispatch/Dispatcher.h>
#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

#include "passes/passes.h"

namespace poptorch::passes {
namespace {

// What strides a reader's kernel reads correctly. Other kernels may index a
// tensor as the contiguous one their caller's .contiguous() made
// (embedding_bag's offsets and indices): their copy stays.
enum class StridesRead {
  kNone,
  // Any: TensorIterator's pointwise ops and reductions, and the matrix
  // products (BLAS takes a leading dimension and copies what it cannot).
  kAny,
  // Any but in the last dimension, which must step by one: the CPU's flash
  // attention reads its inputs' batch, sequence and head strides only.
  kUnitLastDim,
};

StridesRead stridesRead(const ir::Node& node) {
  static const absl::flat_hash_set<std::string_view> kAny = {
      "aten::mm",  "aten::bmm",  "aten::addmm", "aten::baddbmm", "aten::_addmm_activation",
      "aten::sum", "aten::mean", "aten::clone", "aten::copy_"};
  const std::string_view name = node.op.operator_name().name;
  if (node.op.hasTag(at::Tag::pointwise) || kAny.contains(name)) return StridesRead::kAny;
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu") {
    return StridesRead::kUnitLastDim;
  }
  return StridesRead::kNone;
}

bool isCopy(const ir::Node& node) {
  const c10::OperatorName& op = node.op.operator_name();
  return op.name == "aten::copy_" && op.overload_name.empty() && node.guard == ir::Guard::kNone &&
         node.args.size() == 3 && node.args[0].kind == ir::ArgKind::kTensor &&
         node.args[1].kind == ir::ArgKind::kTensor;
}

// `view` of the row-major copy `dst` of `src`, as a view of `src`'s buffer:
// each of its dimensions must step along one dimension of `dst` and stay
// within it, so that its elements are the same elements of `src`.
std::optional<ir::TensorRef> compose(const ir::TensorRef& view, const ir::TensorRef& dst,
                                     const ir::TensorRef& src) {
  if (view.dtype != dst.dtype || view.conj || view.neg || view.numel() == 0) return std::nullopt;
  const size_t rank = dst.sizes.size();
  std::vector<int64_t> contiguous(rank, 1);
  for (size_t d = rank; d-- > 1;) contiguous[d - 1] = contiguous[d] * dst.sizes[d];
  // The dst element the view starts at, and how far each dimension reaches.
  std::vector<int64_t> start(rank);
  std::vector<int64_t> reach(rank, 0);
  int64_t rest = view.offset;
  for (size_t d = 0; d < rank; ++d) {
    start[d] = rest / contiguous[d];
    rest %= contiguous[d];
  }
  ir::TensorRef composed = view;
  composed.buffer = src.buffer;
  composed.offset = src.offset;
  for (size_t d = 0; d < rank; ++d) composed.offset += start[d] * src.strides[d];
  for (size_t j = 0; j < view.sizes.size(); ++j) {
    const int64_t stride = view.strides[j];
    if (view.sizes[j] == 1 || stride == 0) {
      composed.strides[j] = view.sizes[j] == 1 ? 1 : 0;
      continue;
    }
    size_t d = 0;
    while (d < rank && (dst.sizes[d] == 1 || contiguous[d] > stride)) ++d;
    if (d == rank || stride % contiguous[d] != 0) return std::nullopt;
    const int64_t step = stride / contiguous[d];
    reach[d] += step * (view.sizes[j] - 1);
    composed.strides[j] = step * src.strides[d];
  }
  for (size_t d = 0; d < rank; ++d) {
    if (start[d] + reach[d] >= dst.sizes[d]) return std::nullopt;
  }
  return composed;
}

// Forwards copy `c` if it qualifies: its readers then read its source.
bool forward(ir::Graph& graph, size_t c) {
  const ir::Node& copy = graph.nodes[c];
  const ir::TensorRef& dst = copy.inputs[copy.args[0].refs[0]];
  const ir::TensorRef& src = copy.inputs[copy.args[1].refs[0]];
  const ir::BufferInfo& target = graph.buffers[dst.buffer];
  if (dst.buffer == src.buffer || target.existed_before || target.live_after ||
      !dst.coversWhole(target.nbytes) || dst.sizes != src.sizes || dst.dtype != src.dtype ||
      dst.conj || dst.neg || src.conj || src.neg ||
      copy.writes != ir::BufferIds{dst.buffer} ||
      graph.buffers[src.buffer].device != target.device) {
    return false;
  }
  for (size_t i = 0; i < c; ++i) {
    const ir::Node& node = graph.nodes[i];
    if (node.touches(dst.buffer)) return false;
  }
  // The readers must read the composed views' strides (stridesRead: no host
  // effects, no storage-level view ops), stay with the copy's IPU and stage,
  // and nothing may write the source until the last of them has run.
  std::vector<size_t> readers;
  for (size_t i = c + 1; i < graph.nodes.size(); ++i) {
    const ir::Node& node = graph.nodes[i];
    if (node.changes(dst.buffer)) return false;
    if (!node.reads(dst.buffer)) continue;
    if (node.hasHostEffects() || stridesRead(node) == StridesRead::kNone ||
        node.placement != copy.placement) {
      return false;
    }
    readers.push_back(i);
  }
  if (readers.empty()) return false;
  for (size_t i = c + 1; i <= readers.back(); ++i) {
    if (graph.nodes[i].changes(src.buffer)) return false;
  }
  std::vector<ir::Inputs> rewritten;
  for (size_t r : readers) {
    ir::Inputs inputs = graph.nodes[r].inputs;
    for (ir::TensorRef& in : inputs) {
      if (in.buffer != dst.buffer) continue;
      std::optional<ir::TensorRef> composed = compose(in, dst, src);
      if (!composed) return false;
      if (stridesRead(graph.nodes[r]) == StridesRead::kUnitLastDim && !composed->sizes.empty() &&
          composed->sizes.back() > 1 && composed->strides.back() != 1) {
        return false;
      }
      in = std::move(*composed);
    }
    rewritten.push_back(std::move(inputs));
  }
  for (size_t k = 0; k < readers.size(); ++k) graph.nodes[readers[k]].inputs = rewritten[k];
  return true;
}

}  // namespace

ir::Graph forwardCopies(ir::Graph graph) {
  std::vector<bool> keep(graph.nodes.size(), true);
  for (size_t c = 0; c < graph.nodes.size(); ++c) {
    if (isCopy(graph.nodes[c]) && forward(graph, c)) keep[c] = false;
  }
  graph.keepNodes(keep);
  return graph;
}

}  // namespace poptorch::passes
