#include "compiler/strategy_memory.h"

#include <gtest/gtest.h>

#include "graph_builder.h"

namespace poptorch {
namespace {

using compiler::Liveness;
using testing::GraphBuilder;

// The graphs here have no matmul.
const compiler::MatMulMemory kNoMatMuls{};

// Three model stages in phases 0, 1 and 2 on ipu 0, trained: the forward
// (a0 = x w0, a1 = a0 w1, a2 = a1 w2) and the backward (g2 = a2 w2, h1 = g2 w1,
// g1 = h1 + a1, g0 = g1 + a0, out = g0 w0). Weights are streamed; each
// temporary is 64 floats (256 bytes).
struct Model {
  GraphBuilder b;
  std::vector<bool> streamed;

  explicit Model(int64_t w2_floats) {
    const auto x = b.buffer(64, true);
    const auto w0 = b.buffer(1000, true, true);  // 4000 bytes
    const auto w1 = b.buffer(2000, true, true);  // 8000 bytes
    const auto w2 = b.buffer(w2_floats, true, true);
    const auto a0 = b.buffer(64), a1 = b.buffer(64), a2 = b.buffer(64);
    const auto g2 = b.buffer(64), h1 = b.buffer(64), g1 = b.buffer(64), g0 = b.buffer(64);
    const auto out = b.buffer(64, false, true);
    const ir::Placement s0{0, 0, 0, 0}, s1{1, 1, 1, 0}, s2{2, 2, 2, 0};
    auto mul = [&](ir::BufferId p, ir::BufferId q, ir::BufferId r) -> ir::Node& {
      return b.binary(testing::aten("aten::mul", "Tensor"), b.vec(p), b.vec(q), b.vec(r));
    };
    mul(x, w0, a0).placement = s0;     // node 0, phase 0
    mul(a0, w1, a1).placement = s1;    // 1, phase 1
    mul(a1, w2, a2).placement = s2;    // 2, phase 2 (the last: forward and backward)
    mul(a2, w2, g2).placement = s2;    // 3
    mul(g2, w1, h1).placement = s1;    // 4, phase 3 (stage 1's backward)
    b.add(h1, a1, g1).placement = s1;  // 5
    b.add(g1, a0, g0).placement = s0;  // 6, phase 4 (stage 0's backward)
    mul(g0, w0, out).placement = s0;   // 7
    streamed.assign(b.graph.buffers.size(), false);
    streamed[w0] = streamed[w1] = streamed[w2] = true;
  }

  int64_t peak(Liveness liveness) const {
    const auto exe = compiler::compile(b.graph, 1);
    return compiler::phasedPeakBytes(*exe, streamed, liveness, kNoMatMuls).at(0);
  }
};

TEST(PhasedMemory, ForwardPhasesThenBackwardOnesTheLastShared) {
  const Model model(500);
  const compiler::RunPhases phases = compiler::runPhases(model.b.graph);
  EXPECT_EQ(phases.of_node, (std::vector<int32_t>{0, 1, 2, 2, 3, 3, 4, 4}));
  EXPECT_EQ(phases.backward, (std::vector<bool>{false, false, false, true, true}));
}

TEST(PhasedMemory, EachPhaseBringsInItsWeights) {
  // w2 of 2000 bytes: phase 3 (stage 1's backward: w1, 8000 bytes) peaks.
  // AlwaysLive, at node 4: a0, a1, g2 and h1 alive (1024 bytes).
  const Model model(500);
  EXPECT_EQ(model.peak(Liveness::kAlwaysLive), 8000 + 1024);
  // a0 waits off the chip during phase 3: 768 bytes.
  EXPECT_EQ(model.peak(Liveness::kOffChipAfterFwd), 8000 + 768);
  EXPECT_EQ(model.peak(Liveness::kOffChipAfterFwdNoOverlap), 8000 + 768);
  EXPECT_EQ(model.peak(Liveness::kOffChipAfterEachPhase), 8000 + 768);
}

TEST(PhasedMemory, LivenessDecidesWhichActivationsStayOnTheChip) {
  // w2 of 12000 bytes: phase 2 peaks, at node 3. The forward keeps a0, a1,
  // a2 and g2 (1024 bytes) unless tensors leave after each phase: a0 is not
  // used in phase 2 (768 bytes).
  const Model model(3000);
  EXPECT_EQ(model.peak(Liveness::kAlwaysLive), 12000 + 1024);
  EXPECT_EQ(model.peak(Liveness::kOffChipAfterFwd), 12000 + 1024);
  EXPECT_EQ(model.peak(Liveness::kOffChipAfterEachPhase), 12000 + 768);
}

TEST(PhasedMemory, OnlyStreamedBuffersAreBroughtInEachOncePerPhase) {
  // Without streaming, the weights are not counted: only temporaries.
  const Model model(3000);
  const auto exe = compiler::compile(model.b.graph, 1);
  const std::vector<bool> none(model.streamed.size(), false);
  EXPECT_EQ(compiler::phasedPeakBytes(*exe, none, Liveness::kAlwaysLive, kNoMatMuls).at(0), 1024);
  EXPECT_EQ(model.peak(Liveness::kAlwaysLive), 12000 + 1024);  // w2 once in phase 2
}

TEST(PipelinedMemory, AStageKeepsTheActivationsOfEveryMicroBatchInFlight) {
  // Two model stages on ipus 0 and 1, trained: pipeline stages 0 (stage 0's
  // forward), 1 (stage 1's forward and backward), 2 (stage 0's backward).
  // Temporaries of 64 floats (256 bytes).
  GraphBuilder b;
  const auto x = b.buffer(64, true);
  const auto w0 = b.buffer(64, true, true), w1 = b.buffer(64, true, true);
  const auto a0 = b.buffer(64), a1 = b.buffer(64), g1 = b.buffer(64), g0 = b.buffer(64);
  const auto out = b.buffer(64, false, true);
  const ir::Placement s0{0, 0, 0, 0}, s1{1, 1, 0, 1};
  b.square(x, a0).placement = s0;
  b.add(a0, w1, a1).placement = s1;
  b.add(a1, w1, g1).placement = s1;
  b.add(g1, a0, g0).placement = s0;
  b.add(g0, w0, out).placement = s0;
  const auto exe = compiler::compile(b.graph, 1);
  // One micro-batch: a0 and g0 together on ipu 0, a1 and g1 on ipu 1.
  EXPECT_EQ(exe->peak_temporary_bytes, (std::vector<int64_t>{512, 512}));
  // a0 lives from pipeline stage 0 to 2: 3 micro-batches' copies on ipu 0,
  // beside g0 (used within stage 2). g1 goes from stage 1 to 2: 2 copies on
  // ipu 1, beside a1 (used within stage 1).
  EXPECT_EQ(compiler::pipelinedPeakBytes(*exe, kNoMatMuls),
            (std::vector<int64_t>{3 * 256 + 256, 2 * 256 + 256}));
}

TEST(MatMulMemory, OperandsRearrangedAndPartialsOfTheResult) {
  GraphBuilder b;
  const auto x = b.buffer(32 * 64, true), w = b.buffer(64 * 128, true);
  const auto y = b.buffer(32 * 128, false, true);
  ir::Node& mm = b.binary(testing::aten("aten::mm", ""), GraphBuilder::ref(x, {32, 64}),
                          GraphBuilder::ref(w, {64, 128}), GraphBuilder::ref(y, {32, 128}));
  ASSERT_TRUE(mm.isMatMul());
  const compiler::MatMulMemory memory{{}, 900 << 20};
  EXPECT_EQ(compiler::matMulWorkingBytes(mm, 0, memory), (32 * 64 + 64 * 128 + 32 * 128) * 4);
  const auto exe = compiler::compile(b.graph, 1);
  ASSERT_EQ(exe->program.nodes.size(), 1u);
  EXPECT_TRUE(exe->program.nodes[0].isMatMul());
  EXPECT_EQ(compiler::sequentialPeakBytes(*exe, memory),
            std::vector<int64_t>{(32 * 64 + 64 * 128 + 32 * 128) * 4});
}

}  // namespace
}  // namespace poptorch
