#include "compiler/pipeline_stages.h"

#include <gtest/gtest.h>

#include "graph_builder.h"

namespace poptorch {
namespace {

using testing::GraphBuilder;

// Block `block` of stage `stage`, on IPU `ipu`.
ir::Placement block(int32_t stage, int32_t ipu) {
  ir::Placement placement;
  placement.block = stage;
  placement.stage = stage;
  placement.ipu = ipu;
  return placement;
}

// The captured order of a two-stage training step: forward 0, forward 1,
// backward 1, backward 0, then the accumulation of a weight's gradient (in
// no block) and a node in block 0 that needs only forward values.
struct TwoStageStep {
  GraphBuilder b;
  ir::BufferId x = b.buffer(4, true), w = b.buffer(4, true), acc = b.buffer(4, true);
  ir::BufferId a0 = b.buffer(4), a1 = b.buffer(4), g1 = b.buffer(4), g0 = b.buffer(4);
  ir::BufferId saved = b.buffer(4);

  TwoStageStep() {
    b.square(x, a0).placement = block(0, 0);     // forward 0
    b.add(a0, w, a1).placement = block(1, 1);    // forward 1
    b.square(a1, g1).placement = block(1, 1);    // backward 1
    b.add(g1, a0, g0).placement = block(0, 0);   // backward 0
    b.square(x, saved).placement = block(0, 0);  // in block 0, needs only x: forward
    ir::Node& accumulate = b.addInPlace(GraphBuilder::vec(acc), GraphBuilder::vec(g0), 1.0);
    accumulate.placement.ipu = 0;  // in no block
  }
};

TEST(PipelineStages, ForwardAndBackwardOfEachStage) {
  TwoStageStep step;
  const auto stages = compiler::assignPipelineStages(step.b.graph);
  ASSERT_TRUE(stages.has_value());
  // Forward 0 = 0, forward and backward 1 = 1, backward 0 = 2; the node of
  // block 0 that needs only x joins the forward; the accumulation follows
  // the gradient it adds.
  EXPECT_EQ(*stages, (std::vector<int32_t>{0, 1, 1, 2, 0, 2}));
}

TEST(PipelineStages, OrderedByStageKeepingEveryDependency) {
  TwoStageStep step;
  const ir::Graph ordered = compiler::orderByPipelineStage(step.b.graph);
  std::vector<int32_t> captured_order;
  for (const ir::Node& node : ordered.nodes) captured_order.push_back(node.source_index);
  EXPECT_EQ(captured_order, (std::vector<int32_t>{0, 4, 1, 2, 3, 5}));
  const std::vector<compiler::PipelineStage> stages = compiler::pipelineStages(ordered);
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(stages[0].begin, 0u);
  EXPECT_EQ(stages[0].end, 2u);
  EXPECT_EQ(stages[0].ipu, 0);
  EXPECT_EQ(stages[1].begin, 2u);
  EXPECT_EQ(stages[1].end, 4u);
  EXPECT_EQ(stages[1].ipu, 1);
  EXPECT_EQ(stages[2].begin, 4u);
  EXPECT_EQ(stages[2].end, 6u);
  EXPECT_EQ(stages[2].ipu, 0);
  // The order as captured is not the stages' ranges.
  EXPECT_TRUE(compiler::pipelineStages(step.b.graph).empty());
}

TEST(PipelineStages, NoneForOneStageOrAStageThatNeedsALaterOne) {
  GraphBuilder one;
  const auto x = one.buffer(4, true), y = one.buffer(4, false, true);
  one.square(x, y).placement = block(0, 0);
  EXPECT_FALSE(compiler::assignPipelineStages(one.graph).has_value());

  // A node of stage 1 that reads what the backward of stage 0 computes.
  TwoStageStep step;
  step.b.square(step.g0, step.b.buffer(4)).placement = block(1, 1);
  EXPECT_FALSE(compiler::assignPipelineStages(step.b.graph).has_value());
  EXPECT_TRUE(compiler::pipelineStages(compiler::orderByPipelineStage(step.b.graph)).empty());
}

TEST(PipelineStages, BytesExchangedBetweenIpus) {
  TwoStageStep step;
  // a0 (16 bytes) goes to IPU 1; g1 comes back to IPU 0; w lives on IPU 1.
  EXPECT_EQ(compiler::bytesExchangedBetweenIpus(step.b.graph), 32);
}

}  // namespace
}  // namespace poptorch
