#include "ir/graph.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <iterator>
#include <sstream>
#include <string_view>

#include "kernels/own_kernels.h"

namespace poptorch::ir {

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool TensorRef::coversWhole(int64_t nbytes) const {
  return offset == 0 && !conj && !neg &&
         numel() * static_cast<int64_t>(c10::elementSize(dtype)) == nbytes &&
         c10::IntArrayRef(strides) == c10::IntArrayRef(c10::contiguous_strides(sizes));
}

TensorRef TensorRef::of(const at::Tensor& tensor, BufferId buffer) {
  TensorRef ref;
  ref.assign(tensor, buffer);
  return ref;
}

void TensorRef::assign(const at::Tensor& tensor, BufferId id) {
  buffer = id;
  dtype = tensor.scalar_type();
  offset = tensor.storage_offset();
  sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
  strides.assign(tensor.strides().begin(), tensor.strides().end());
  conj = tensor.is_conj();
  neg = tensor.is_neg();
}

std::string Node::name() const {
  const c10::OperatorName& n = op.operator_name();
  return n.overload_name.empty() ? n.name : absl::StrCat(n.name, ".", n.overload_name);
}

bool Node::isNondeterministic() const { return op.hasTag(at::Tag::nondeterministic_seeded); }

bool Node::sameStateOfCall(const Node& other) const {
  return denormal_mode == other.denormal_mode && deterministic == other.deterministic &&
         deterministic_warn_only == other.deterministic_warn_only;
}

namespace {

// The argument index of a matrix multiplication's lhs (its rhs follows), or -1.
int matMulLhsArg(const c10::OperatorName& name) {
  if (!name.overload_name.empty() && name.overload_name != "default") return -1;
  if (name.name == "aten::mm" || name.name == "aten::bmm") return 0;
  if (name.name == "aten::addmm" || name.name == "aten::baddbmm" ||
      name.name == "aten::_addmm_activation") {
    return 1;
  }
  return -1;
}

bool refersTo(c10::ArrayRef<TensorRef> refs, BufferId buffer) {
  return std::any_of(refs.begin(), refs.end(),
                     [&](const TensorRef& ref) { return ref.buffer == buffer; });
}

}  // namespace

bool Node::isMatMul() const {
  const int lhs = matMulLhsArg(op.operator_name());
  if (lhs < 0 || args.size() < static_cast<size_t>(lhs) + 2 || outputs.size() != 1) return false;
  for (int a : {lhs, lhs + 1}) {
    const Arg& arg = args[static_cast<size_t>(a)];
    if (arg.kind != ArgKind::kTensor || arg.refs.empty() || arg.refs[0] < 0) return false;
  }
  return true;
}

std::pair<const TensorRef*, const TensorRef*> Node::matMulOperands() const {
  const auto lhs = static_cast<size_t>(matMulLhsArg(op.operator_name()));
  return {&inputs[static_cast<size_t>(args[lhs].refs[0])],
          &inputs[static_cast<size_t>(args[lhs + 1].refs[0])]};
}

bool Node::reads(BufferId buffer) const { return refersTo(inputs, buffer); }

bool Node::writesInPlace(BufferId buffer) const {
  return std::find(writes.begin(), writes.end(), buffer) != writes.end();
}

bool Node::changes(BufferId buffer) const {
  return writesInPlace(buffer) || refersTo(outputs, buffer);
}

bool Node::hasHostEffects() const {
  // Guards check a value and have no effect when they hold.
  if (guard != Guard::kNone) return false;
  const std::string& qualified = op.operator_name().name;
  if (kernels::isOwnKernel(qualified)) return false;
  return !absl::StartsWith(qualified, "aten::") && !absl::StartsWith(qualified, "prims::");
}

BufferId Graph::addBuffer(BufferInfo info) {
  buffers.push_back(info);
  return static_cast<BufferId>(buffers.size() - 1);
}

void Graph::keepNodes(const std::vector<bool>& keep) {
  // In place: a node keeps its lists inline, so moving one copies them, and a
  // graph with nothing to drop (a steady step's, at every sync point) moves none.
  size_t kept = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!keep[i]) continue;
    if (kept != i) nodes[kept] = std::move(nodes[i]);
    ++kept;
  }
  nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(kept), nodes.end());
}

// Buffers are numbered in the order the nodes first use them (reads, writes,
// results), so that the numbering depends on the nodes kept only.
std::vector<BufferId> Graph::dropUnusedBuffers() {
  std::vector<BufferId> renumbered(buffers.size(), -1);
  std::vector<BufferId> kept;
  auto number = [&](BufferId b) {
    if (renumbered[b] >= 0) return;
    renumbered[b] = static_cast<BufferId>(kept.size());
    kept.push_back(b);
  };
  for (const Node& node : nodes) {
    for (const TensorRef& in : node.inputs) number(in.buffer);
    for (BufferId w : node.writes) number(w);
    for (const TensorRef& out : node.outputs) number(out.buffer);
  }
  std::vector<BufferInfo> kept_buffers;
  kept_buffers.reserve(kept.size());
  for (BufferId b : kept) kept_buffers.push_back(buffers[b]);
  buffers = std::move(kept_buffers);
  for (Node& node : nodes) {
    for (TensorRef& in : node.inputs) in.buffer = renumbered[in.buffer];
    for (TensorRef& out : node.outputs) out.buffer = renumbered[out.buffer];
    for (BufferId& w : node.writes) w = renumbered[w];
  }
  return kept;
}

namespace {

std::string refToString(const TensorRef& ref) {
  return absl::StrCat("%", ref.buffer, "<", c10::toString(ref.dtype), "[",
                      absl::StrJoin(ref.sizes, ","), "]",
                      ref.offset != 0 ? absl::StrCat("+", ref.offset) : "", ref.conj ? ",conj" : "",
                      ref.neg ? ",neg" : "", ">");
}

std::string argToString(const Arg& arg, const Node& node) {
  switch (arg.kind) {
    case ArgKind::kTensor: {
      constexpr const char* kLayoutSuffix[] = {"", "@contiguous", "@channels_last"};
      return absl::StrCat(refToString(node.inputs[arg.refs[0]]),
                          kLayoutSuffix[static_cast<size_t>(arg.layout)]);
    }
    case ArgKind::kTensorList: {
      std::vector<std::string> parts;
      for (int32_t r : arg.refs) parts.push_back(r < 0 ? "None" : refToString(node.inputs[r]));
      return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
    }
    case ArgKind::kRuntime:
    case ArgKind::kConstant: {
      std::ostringstream out;
      if (arg.value.isTensor()) {
        out << "host_scalar";
      } else {
        out << arg.value;
      }
      return arg.kind == ArgKind::kRuntime ? absl::StrCat("$", out.str()) : out.str();
    }
  }
  return "?";
}

}  // namespace

std::string Graph::toString() const {
  std::string out;
  for (size_t b = 0; b < buffers.size(); ++b) {
    const BufferInfo& info = buffers[b];
    absl::StrAppend(&out, "buffer %", b, ": ", info.nbytes, " bytes on ", info.device.str(),
                    info.existed_before ? ", input" : "", info.live_after ? ", live" : "", "\n");
  }
  for (const Node& node : nodes) {
    std::vector<std::string> outs;
    for (const TensorRef& ref : node.outputs) outs.push_back(refToString(ref));
    std::vector<std::string> args;
    for (const Arg& arg : node.args) args.push_back(argToString(arg, node));
    absl::StrAppend(&out, outs.empty() ? "" : absl::StrCat(absl::StrJoin(outs, ", "), " = "),
                    node.name(), "(", absl::StrJoin(args, ", "), ")");
    if (!node.writes.empty()) {
      absl::StrAppend(&out, "  writes %", absl::StrJoin(node.writes, ", %"));
    }
    if (node.placement != Placement{}) {
      const Placement& at = node.placement;
      absl::StrAppend(&out, "  block ", at.block, " stage ", at.stage, " phase ", at.phase, " ipu ",
                      at.ipu);
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace poptorch::ir
