#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace poptorch {
namespace {

using testing::aten;
using testing::GraphBuilder;

// temporary = source.transpose(0, 1).contiguous(), source of shape (2, 3, 4).
struct TransposedCopy {
  GraphBuilder b;
  ir::BufferId source = b.buffer(24, true);
  ir::BufferId temporary = b.buffer(24);
  ir::BufferId result = b.buffer(16, false, true);

  TransposedCopy() {
    ir::TensorRef transposed = GraphBuilder::ref(source, {3, 2, 4});
    transposed.strides = {4, 12, 1};
    ir::Node copy(aten("aten::copy_"));
    copy.inputs = {GraphBuilder::ref(temporary, {3, 2, 4}), transposed};
    copy.args = {ir::Arg::tensor(0), ir::Arg::tensor(1), ir::Arg::constant(false)};
    copy.writes = {temporary};
    copy.fresh_returns = {false};
    b.append(std::move(copy));
  }

  // result = view * view for a view of the temporary (or another op of two
  // tensors).
  void read(const ir::TensorRef& view,
            const c10::OperatorHandle& op = aten("aten::mul", "Tensor")) {
    b.binary(op, view, view, GraphBuilder::ref(result, {16}));
  }
  // temporary[1:3], shape (2, 2, 4).
  ir::TensorRef slice() const {
    ir::TensorRef view = GraphBuilder::ref(temporary, {2, 2, 4});
    view.offset = 8;
    return view;
  }
};

TEST(CopyForwarding, ReadersOfASlicedCopyReadItsSource) {
  TransposedCopy g;
  g.read(g.slice());
  const ir::Graph out = passes::forwardCopies(g.b.graph);
  ASSERT_EQ(out.nodes.size(), 1u);
  const ir::Node& mul = out.nodes[0];
  EXPECT_EQ(mul.source_index, 1);
  for (const ir::TensorRef& in : mul.inputs) {
    EXPECT_EQ(in.buffer, g.source);
    EXPECT_EQ(in.offset, 4);  // temporary[1] is source[:, 1]
    EXPECT_EQ(std::vector<int64_t>(in.sizes.begin(), in.sizes.end()),
              (std::vector<int64_t>{2, 2, 4}));
    EXPECT_EQ(std::vector<int64_t>(in.strides.begin(), in.strides.end()),
              (std::vector<int64_t>{4, 12, 1}));
  }
}

TEST(CopyForwarding, SplitDimensionsComposeWithinTheirDimension) {
  TransposedCopy g;
  ir::TensorRef halves = GraphBuilder::ref(g.temporary, {3, 2, 2, 2});  // last dim split
  g.read(halves);
  const ir::Graph out = passes::forwardCopies(g.b.graph);
  ASSERT_EQ(out.nodes.size(), 1u);
  const ir::TensorRef& in = out.nodes[0].inputs[0];
  EXPECT_EQ(std::vector<int64_t>(in.strides.begin(), in.strides.end()),
            (std::vector<int64_t>{4, 12, 2, 1}));
}

TEST(CopyForwarding, KeepsACopyAViewFlattensAcrossDimensions) {
  TransposedCopy g;
  g.read(GraphBuilder::ref(g.temporary, {6, 4}));  // rows span the copy's first two dims
  EXPECT_EQ(passes::forwardCopies(g.b.graph).nodes.size(), 2u);
}

TEST(CopyForwarding, KeepsACopyWhoseSourceIsWrittenBeforeItsLastReader) {
  TransposedCopy g;
  g.b.addInPlace(GraphBuilder::ref(g.source, {24}), GraphBuilder::ref(g.source, {24}), 1.0);
  g.read(g.slice());
  EXPECT_EQ(passes::forwardCopies(g.b.graph).nodes.size(), 3u);
}

TEST(CopyForwarding, KeepsACopyThatOutlivesTheGraph) {
  TransposedCopy g;
  g.b.graph.buffers[g.temporary].live_after = true;
  g.read(g.slice());
  EXPECT_EQ(passes::forwardCopies(g.b.graph).nodes.size(), 2u);
}

TEST(CopyForwarding, KeepsACopyAReaderMayIndexAsContiguous) {
  TransposedCopy g;
  g.read(g.slice(), aten("aten::embedding_bag"));
  EXPECT_EQ(passes::forwardCopies(g.b.graph).nodes.size(), 2u);
}

// temporary.transpose(1, 2): its last dimension steps by the source's 12.
ir::TensorRef lastTwoSwapped(const TransposedCopy& g) {
  ir::TensorRef view = GraphBuilder::ref(g.temporary, {3, 4, 2});
  view.strides = {8, 1, 4};
  return view;
}

TEST(CopyForwarding, FlashAttentionReadsASourceOnlyWithAUnitLastStride) {
  const c10::OperatorHandle attention = aten("aten::_scaled_dot_product_flash_attention_for_cpu");
  TransposedCopy unit;
  unit.read(unit.slice(), attention);
  EXPECT_EQ(passes::forwardCopies(unit.b.graph).nodes.size(), 1u);
  TransposedCopy strided;
  strided.read(lastTwoSwapped(strided), attention);
  EXPECT_EQ(passes::forwardCopies(strided.b.graph).nodes.size(), 2u);
  TransposedCopy pointwise;
  pointwise.read(lastTwoSwapped(pointwise));
  EXPECT_EQ(passes::forwardCopies(pointwise.b.graph).nodes.size(), 1u);
}

}  // namespace
}  // namespace poptorch
