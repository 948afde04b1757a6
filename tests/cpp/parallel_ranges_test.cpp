#include "compiler/parallel_ranges.h"

#include <gtest/gtest.h>

#include "compiler/executable.h"
#include "compiler/node_cost.h"
#include "graph_builder.h"

namespace poptorch {
namespace {

using testing::aten;
using testing::GraphBuilder;
using testing::Ranges;

Ranges rangesOf(const compiler::Executable& exe) {
  return testing::pairsOf(exe.dependencies.parallel_ranges);
}

// out = a @ b for a of m x k and b of k x n, on fresh buffers (inputs of the graph).
struct MatMul {
  ir::TensorRef a, b, out;
};
MatMul matMul(GraphBuilder& g, int64_t m, int64_t k, int64_t n) {
  return {GraphBuilder::ref(g.buffer(m * k, true), {m, k}),
          GraphBuilder::ref(g.buffer(k * n, true), {k, n}),
          GraphBuilder::ref(g.buffer(m * n), {m, n})};
}

// Two independent products of the same sizes, then their sum: the products
// form a segment of two independent nodes.
compiler::Executable twoProducts(int64_t m, int64_t k, int64_t n) {
  GraphBuilder g;
  const MatMul left = matMul(g, m, k, n);
  const MatMul right = matMul(g, m, k, n);
  g.binary(aten("aten::mm"), left.a, left.b, left.out);
  g.binary(aten("aten::mm"), right.a, right.b, right.out);
  const auto sum = GraphBuilder::ref(g.buffer(m * n, false, true), {m, n});
  g.binary(aten("aten::add", "Tensor"), left.out, right.out, sum);
  return *compiler::compile(g.graph, 1);
}

TEST(NodeCost, AMatrixProductCostsItsFlops) {
  GraphBuilder g;
  const MatMul small = matMul(g, 32, 256, 256);
  const MatMul deep = matMul(g, 32, 1024, 256);  // four times the FLOPs
  const compiler::NodeCost one =
      compiler::estimateNodeCost(g.binary(aten("aten::mm"), small.a, small.b, small.out));
  const compiler::NodeCost four =
      compiler::estimateNodeCost(g.binary(aten("aten::mm"), deep.a, deep.b, deep.out));
  EXPECT_NEAR(four.one_core_us / one.one_core_us, 4.0, 0.2);
  EXPECT_LT(one.two_cores_us, one.one_core_us);
  // The larger product splits better over two threads.
  EXPECT_GT(four.one_core_us / four.two_cores_us, one.one_core_us / one.two_cores_us);
}

TEST(NodeCost, ElementwiseKernelsBelowTheGrainStayOnOneThread) {
  GraphBuilder g;
  const auto x = g.buffer(4, true);
  const auto out = g.buffer(4);
  const compiler::NodeCost tiny = compiler::estimateNodeCost(g.square(x, out));
  EXPECT_EQ(tiny.two_cores_us, tiny.one_core_us);
  const auto big = GraphBuilder::ref(g.buffer(1 << 20, true), {1 << 20});
  const auto big_out = GraphBuilder::ref(g.buffer(1 << 20), {1 << 20});
  const compiler::NodeCost large =
      compiler::estimateNodeCost(g.binary(aten("aten::mul", "Tensor"), big, big, big_out));
  EXPECT_LT(large.two_cores_us, large.one_core_us);
  EXPECT_GT(large.one_core_us, 100 * tiny.one_core_us / 2);
}

TEST(ParallelRanges, IndependentSmallProductsRunOnTwoThreads) {
  // Products that split badly over two threads gain from running side by side.
  const compiler::Executable exe = twoProducts(32, 256, 256);
  ASSERT_EQ(exe.program.nodes.size(), 3u);
  EXPECT_EQ(rangesOf(exe), (Ranges{{0, 2}}));
}

TEST(ParallelRanges, IndependentLargeProductsKeepBothCoresEach) {
  // Each splits well over two threads: one after another is as fast, without
  // the hand-off between threads.
  const compiler::Executable exe = twoProducts(1024, 1024, 1024);
  EXPECT_TRUE(exe.dependencies.parallel());
  EXPECT_TRUE(rangesOf(exe).empty());
}

}  // namespace
}  // namespace poptorch
