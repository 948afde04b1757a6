#include "passes/passes.h"

#include <gtest/gtest.h>

#include "compiler/executable.h"
#include "graph_builder.h"

namespace poptorch {
namespace {

using testing::aten;
using testing::GraphBuilder;

std::vector<std::string> names(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const auto& n : g.nodes) out.push_back(n.name());
  return out;
}

TEST(DeadCode, RemovesResultsNobodyReads) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto dead = b.buffer(4);
  const auto live = b.buffer(4, false, true);
  b.square(x, dead);
  b.add(x, x, live);
  const ir::Graph out = passes::eliminateDeadCode(b.graph);
  EXPECT_EQ(names(out), std::vector<std::string>{"aten::add.Tensor"});
  EXPECT_EQ(out.nodes[0].source_index, 1);
}

TEST(DeadCode, KeepsProducersOfWhatLiveNodesRead) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto tmp = b.buffer(4);
  const auto live = b.buffer(4, false, true);
  b.square(x, tmp);
  b.add(tmp, x, live);
  EXPECT_EQ(passes::eliminateDeadCode(b.graph).nodes.size(), 2u);
}

TEST(DeadCode, KeepsInPlaceWritesToLiveBuffersAndDropsOnesToDeadBuffers) {
  GraphBuilder b;
  const auto param = b.buffer(4, true, true);
  const auto dropped = b.buffer(4, true, false);
  const auto grad = b.buffer(4, true, true);
  b.addInPlace(b.vec(param), b.vec(grad), -0.1);
  b.addInPlace(b.vec(dropped), b.vec(grad), -0.1);
  const ir::Graph out = passes::eliminateDeadCode(b.graph);
  ASSERT_EQ(out.nodes.size(), 1u);
  EXPECT_EQ(out.nodes[0].writes, std::vector<ir::BufferId>{param});
}

TEST(CommonSubexpressions, MergesRepeatedPureNodes) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto t1 = b.buffer(4);
  const auto t2 = b.buffer(4);
  const auto out = b.buffer(4, false, true);
  b.square(x, t1);
  b.square(x, t2);
  b.add(t1, t2, out);
  const ir::Graph g = passes::eliminateCommonSubexpressions(b.graph);
  ASSERT_EQ(g.nodes.size(), 2u);
  // The add now reads the first product twice.
  EXPECT_EQ(g.nodes[1].inputs[0].buffer, t1);
  EXPECT_EQ(g.nodes[1].inputs[1].buffer, t1);
}

TEST(CommonSubexpressions, DoesNotMergeAcrossAWriteToAnInput) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto y = b.buffer(4, true, true);
  const auto t1 = b.buffer(4);
  const auto t2 = b.buffer(4);
  const auto out = b.buffer(4, false, true);
  b.square(x, t1);
  b.addInPlace(b.vec(x), b.vec(y), 1.0);
  b.square(x, t2);
  b.add(t1, t2, out);
  EXPECT_EQ(passes::eliminateCommonSubexpressions(b.graph).nodes.size(), 4u);
}

TEST(CommonSubexpressions, DoesNotMergeLiveResults) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto t1 = b.buffer(4, false, true);
  const auto t2 = b.buffer(4, false, true);
  b.square(x, t1);
  b.square(x, t2);
  EXPECT_EQ(passes::eliminateCommonSubexpressions(b.graph).nodes.size(), 2u);
}

TEST(CommonSubexpressions, DoesNotMergeRandomNodes) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto t1 = b.buffer(4);
  const auto t2 = b.buffer(4);
  const auto out = b.buffer(4, false, true);
  for (auto t : {t1, t2}) {
    ir::Node node(aten("aten::bernoulli", ""));
    node.inputs = {b.vec(x)};
    node.args = {ir::Arg::tensor(0), ir::Arg::constant(c10::IValue())};
    node.outputs = {b.vec(t)};
    node.fresh_returns = {true};
    b.append(std::move(node));
  }
  b.add(t1, t2, out);
  EXPECT_EQ(passes::eliminateCommonSubexpressions(b.graph).nodes.size(), 3u);
}

TEST(Compiler, PlansRolesReleasesAndPeakMemory) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto t1 = b.buffer(4);
  const auto t2 = b.buffer(4);
  const auto out = b.buffer(4, false, true);
  b.square(x, t1);
  b.add(t1, x, t2);
  b.binary(aten("aten::sub", "Tensor"), b.vec(t2), b.vec(x), b.vec(out));
  const auto exe = compiler::compile(b.graph, 42);
  EXPECT_EQ(exe->roles[x], compiler::BufferRole::kExternal);
  EXPECT_EQ(exe->roles[t1], compiler::BufferRole::kProduced);
  EXPECT_EQ(exe->roles[out], compiler::BufferRole::kExternal);
  EXPECT_EQ(exe->release_after[1], std::vector<ir::BufferId>{t1});
  EXPECT_EQ(exe->release_after[2], std::vector<ir::BufferId>{t2});
  // t1 and t2 (16 bytes each) are alive together during the add.
  ASSERT_EQ(exe->peak_temporary_bytes.size(), 1u);
  EXPECT_EQ(exe->peak_temporary_bytes[0], 32);
}

TEST(ExecutableCache, FindsByKey) {
  auto& cache = compiler::ExecutableCache::get();
  cache.clear();
  GraphBuilder b;
  b.buffer(4, true, true);
  auto exe = compiler::compile(b.graph, 7);
  cache.insert(exe);
  EXPECT_EQ(cache.find(7), exe);
  EXPECT_EQ(cache.find(8), nullptr);
  cache.clear();
}

}  // namespace
}  // namespace poptorch
