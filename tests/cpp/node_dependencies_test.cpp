#include "compiler/node_dependencies.h"

#include <gtest/gtest.h>

#include "compiler/executable.h"
#include "graph_builder.h"

namespace poptorch {
namespace {

using testing::GraphBuilder;
using Segments = testing::Ranges;

Segments segmentsOf(const compiler::Executable& exe) {
  return testing::pairsOf(exe.dependencies.segments);
}

TEST(NodeDependencies, IndependentNodesShareASegment) {
  GraphBuilder b;
  const auto x = b.buffer(64, true);
  const auto t1 = b.buffer(64);
  const auto t2 = b.buffer(64);
  const auto out = b.buffer(64, false, true);
  b.square(x, t1);
  b.add(x, x, t2);  // independent of the square
  b.add(t1, t2, out);
  const auto exe = compiler::compile(b.graph, 1);
  ASSERT_EQ(exe->program.nodes.size(), 3u);
  EXPECT_EQ(segmentsOf(*exe), (Segments{{0, 2}, {2, 3}}));
  EXPECT_EQ(exe->dependencies.successors[0], std::vector<int32_t>{2});
  EXPECT_EQ(exe->dependencies.successors[1], std::vector<int32_t>{2});
  EXPECT_TRUE(exe->dependencies.parallel());
  // They could run at once, but nodes this small gain less than the hand-off
  // between threads costs (compiler/parallel_ranges.h).
  EXPECT_TRUE(exe->dependencies.parallel_ranges.empty());
}

TEST(NodeDependencies, AChainRunsNodeByNode) {
  GraphBuilder b;
  const auto x = b.buffer(64, true);
  const auto t1 = b.buffer(64);
  const auto out = b.buffer(64, false, true);
  b.square(x, t1);
  b.add(t1, x, out);
  const auto exe = compiler::compile(b.graph, 1);
  EXPECT_EQ(segmentsOf(*exe), (Segments{{0, 1}, {1, 2}}));
  EXPECT_FALSE(exe->dependencies.parallel());
}

TEST(NodeDependencies, AnInPlaceWriteWaitsForEarlierReads) {
  GraphBuilder b;
  const auto x = b.buffer(64, true, true);
  const auto y = b.buffer(64, true);
  const auto o1 = b.buffer(64, false, true);
  const auto o2 = b.buffer(64, false, true);
  b.square(x, o1);
  b.square(y, o2);
  b.addInPlace(GraphBuilder::vec(x), GraphBuilder::vec(y), 1.0);  // after the read of x
  const auto exe = compiler::compile(b.graph, 1);
  ASSERT_EQ(exe->program.nodes.size(), 3u);
  EXPECT_EQ(exe->dependencies.successors[0], std::vector<int32_t>{2});
  EXPECT_TRUE(exe->dependencies.successors[1].empty());
  EXPECT_EQ(segmentsOf(*exe), (Segments{{0, 3}}));
}

TEST(NodeDependencies, ATemporaryWaitsForEveryUseOfTheOneWhoseBytesItTakes) {
  GraphBuilder b;
  const auto x = b.buffer(64, true);
  const auto y = b.buffer(64, true);
  const auto t1 = b.buffer(64);
  const auto t3 = b.buffer(64);
  const auto o1 = b.buffer(64, false, true);
  const auto o2 = b.buffer(64, false, true);
  b.square(x, t1);
  b.add(t1, x, o1);  // t1's last use
  b.square(y, t3);   // takes t1's bytes, though it reads nothing of x's branch
  b.add(t3, y, o2);
  const auto exe = compiler::compile(b.graph, 1);
  ASSERT_EQ(exe->arena_offset[t3], exe->arena_offset[t1]);
  EXPECT_EQ(exe->dependencies.successors[0], (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(exe->dependencies.successors[1], std::vector<int32_t>{2});
  EXPECT_FALSE(exe->dependencies.parallel());
}

}  // namespace
}  // namespace poptorch
