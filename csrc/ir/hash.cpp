#include "ir/hash.h"

#include <c10/util/hash.h>

#include <bit>
#include <functional>
#include <string_view>

namespace poptorch::ir {
namespace {

uint64_t hashString(std::string_view s) { return std::hash<std::string_view>{}(s); }

uint64_t hashRef(const TensorRef& ref) {
  uint64_t h = hashCombine(static_cast<uint64_t>(ref.buffer), static_cast<uint64_t>(ref.dtype));
  h = hashCombine(h, static_cast<uint64_t>(ref.offset));
  h = hashCombine(h, ref.sizes.size());
  for (int64_t s : ref.sizes) h = hashCombine(h, static_cast<uint64_t>(s));
  for (int64_t s : ref.strides) h = hashCombine(h, static_cast<uint64_t>(s));
  return hashCombine(h, (ref.conj ? 1u : 0u) | (ref.neg ? 2u : 0u));
}

// A runtime value contributes only its kind, which decides type promotion.
uint64_t hashRuntimeKind(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    return hashCombine(1, static_cast<uint64_t>(t.scalar_type()));
  }
  if (value.isScalar()) {
    const c10::Scalar s = value.toScalar();
    return hashCombine(2, static_cast<uint64_t>(s.type()));
  }
  return hashCombine(3, static_cast<uint64_t>(value.tagKind().size()));
}

}  // namespace

uint64_t hashConstant(const c10::IValue& value) {
  if (value.isNone()) return 0x6e6f6e65;
  if (value.isBool()) return hashCombine(11, value.toBool());
  if (value.isInt()) return hashCombine(12, static_cast<uint64_t>(value.toInt()));
  if (value.isDouble()) return hashCombine(13, std::bit_cast<uint64_t>(value.toDouble()));
  if (value.isString()) return hashCombine(14, hashString(value.toStringRef()));
  if (value.isDevice()) {
    const c10::Device d = value.toDevice();
    return hashCombine(
        15, hashCombine(static_cast<uint64_t>(d.type()), static_cast<uint64_t>(d.index())));
  }
  if (value.isList()) {
    uint64_t h = 16;
    for (const c10::IValue& element : value.toListRef()) h = hashCombine(h, hashConstant(element));
    return h;
  }
  if (value.isTuple()) {
    uint64_t h = 17;
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      h = hashCombine(h, hashConstant(element));
    }
    return h;
  }
  if (value.isScalar()) {
    const c10::Scalar s = value.toScalar();
    return hashCombine(18, static_cast<uint64_t>(s.type()));
  }
  if (value.isGenerator()) return 19;
  // Anything else is hashed by kind only: such constants (e.g. a host tensor)
  // never reach the hash as constants; capture makes them runtime arguments.
  return hashCombine(20, hashString(value.tagKind()));
}

uint64_t structuralHash(const Graph& graph) {
  uint64_t h = hashCombine(0x706f70746f726368ULL, graph.buffers.size());
  for (const BufferInfo& b : graph.buffers) {
    h = hashCombine(h, static_cast<uint64_t>(b.nbytes));
    h = hashCombine(h, static_cast<uint64_t>(b.device.index()));
    h = hashCombine(h, (b.existed_before ? 1u : 0u) | (b.live_after ? 2u : 0u));
  }
  for (const Node& node : graph.nodes) {
    const c10::OperatorName& name = node.op.operator_name();
    h = hashCombine(h, hashString(name.name));
    h = hashCombine(h, hashString(name.overload_name));
    h = hashCombine(h, static_cast<uint64_t>(node.guard));
    // Passes merge and fuse nodes of one state of the call only (denormal
    // mode, deterministic algorithms): an executable of one graph must not
    // serve another whose nodes' states differ.
    h = hashCombine(h, node.denormal_mode);
    h = hashCombine(h, (node.deterministic ? 1u : 0u) | (node.deterministic_warn_only ? 2u : 0u));
    // Blocks decide where a node runs and whose memory it takes.
    const Placement& at = node.placement;
    for (int32_t v : {at.block, at.stage, at.phase, at.ipu}) h = hashCombine(h, v + 2);
    // A matmul's plan decides its modelled memory.
    h = hashCombine(h, static_cast<uint64_t>(node.matmul.split));
    h = hashCombine(h, static_cast<uint64_t>(node.matmul.factor));
    h = hashCombine(h, std::bit_cast<uint32_t>(node.matmul.available_memory));
    for (const Arg& arg : node.args) {
      h = hashCombine(h, static_cast<uint64_t>(arg.kind));
      switch (arg.kind) {
        case ArgKind::kConstant:
          h = hashCombine(h, hashConstant(arg.value));
          break;
        case ArgKind::kRuntime:
          h = hashCombine(h, hashRuntimeKind(arg.value));
          break;
        case ArgKind::kTensor:
        case ArgKind::kTensorList:
          for (int32_t r : arg.refs) h = hashCombine(h, r < 0 ? 0 : hashRef(node.inputs[r]));
          break;
      }
    }
    for (const TensorRef& out : node.outputs) h = hashCombine(h, hashRef(out));
    for (BufferId w : node.writes) h = hashCombine(h, static_cast<uint64_t>(w));
  }
  return h;
}

}  // namespace poptorch::ir
