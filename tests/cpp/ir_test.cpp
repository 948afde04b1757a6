#include <gtest/gtest.h>

#include "graph_builder.h"
#include "ir/hash.h"

namespace poptorch {
namespace {

using testing::aten;
using testing::GraphBuilder;

TEST(Graph, PrintsNodesBuffersAndWrites) {
  GraphBuilder b;
  const auto x = b.buffer(6, /*input=*/true, /*live=*/true);
  const auto y = b.buffer(6, false, true);
  b.binary(aten("aten::mul", "Tensor"), b.ref(x, {2, 3}), b.ref(x, {2, 3}), b.ref(y, {2, 3}));
  b.addInPlace(b.ref(x, {2, 3}), b.ref(y, {2, 3}), 0.5);
  const std::string text = b.graph.toString();
  EXPECT_NE(text.find("buffer %0: 24 bytes on ipu:0, input, live"), std::string::npos) << text;
  EXPECT_NE(text.find("%1<Float[2,3]> = aten::mul.Tensor(%0<Float[2,3]>, %0<Float[2,3]>)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("aten::add_.Tensor(%0<Float[2,3]>, %1<Float[2,3]>, $0.5)  writes %0"),
            std::string::npos)
      << text;
}

TEST(Graph, TensorRefNumelAndEquality) {
  const auto a = GraphBuilder::ref(0, {2, 3, 4});
  EXPECT_EQ(a.numel(), 24);
  auto b = a;
  EXPECT_EQ(a, b);
  b.offset = 1;
  EXPECT_NE(a, b);
}

TEST(Graph, NondeterministicOpsAreKnown) {
  EXPECT_TRUE(ir::Node(aten("aten::bernoulli_", "float")).isNondeterministic());
  EXPECT_FALSE(ir::Node(aten("aten::mul", "Tensor")).isNondeterministic());
}

class HashTest : public ::testing::Test {
 protected:
  // x * x, then x += lr * y: a miniature update step.
  static ir::Graph step(double lr, std::initializer_list<int64_t> shape = {2, 3}) {
    GraphBuilder b;
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    const auto x = b.buffer(numel, true, true);
    const auto y = b.buffer(numel, false, true);
    b.binary(aten("aten::mul", "Tensor"), b.ref(x, shape), b.ref(x, shape), b.ref(y, shape));
    b.addInPlace(b.ref(x, shape), b.ref(y, shape), lr);
    return b.graph;
  }
};

TEST_F(HashTest, SameStructureSameHash) {
  EXPECT_EQ(ir::structuralHash(step(0.1)), ir::structuralHash(step(0.1)));
}

TEST_F(HashTest, RuntimeValuesDoNotChangeTheHash) {
  EXPECT_EQ(ir::structuralHash(step(0.1)), ir::structuralHash(step(0.001)));
}

TEST_F(HashTest, ShapesChangeTheHash) {
  EXPECT_NE(ir::structuralHash(step(0.1, {2, 3})), ir::structuralHash(step(0.1, {3, 2})));
}

TEST_F(HashTest, LivenessChangesTheHash) {
  ir::Graph a = step(0.1);
  ir::Graph b = step(0.1);
  b.buffers[1].live_after = false;
  EXPECT_NE(ir::structuralHash(a), ir::structuralHash(b));
}

TEST_F(HashTest, TheStateOfTheCallChangesTheHash) {
  // Passes merge only nodes of one state, so executables must follow it.
  const uint64_t plain = ir::structuralHash(step(0.1));
  ir::Graph deterministic = step(0.1);
  deterministic.nodes[0].deterministic = true;
  ir::Graph warn_only = deterministic;
  warn_only.nodes[0].deterministic_warn_only = true;
  ir::Graph flushing = step(0.1);
  flushing.nodes[0].denormal_mode = 0x8040;
  EXPECT_NE(ir::structuralHash(deterministic), plain);
  EXPECT_NE(ir::structuralHash(warn_only), ir::structuralHash(deterministic));
  EXPECT_NE(ir::structuralHash(flushing), plain);
}

TEST_F(HashTest, ConstantsChangeTheHash) {
  EXPECT_NE(ir::hashConstant(c10::IValue(int64_t{1})), ir::hashConstant(c10::IValue(int64_t{2})));
  EXPECT_NE(ir::hashConstant(c10::IValue(std::vector<int64_t>{1, 2})),
            ir::hashConstant(c10::IValue(std::vector<int64_t>{2, 1})));
  EXPECT_NE(ir::hashConstant(c10::IValue(true)), ir::hashConstant(c10::IValue(false)));
}

TEST_F(HashTest, OperatorsChangeTheHash) {
  GraphBuilder a;
  GraphBuilder b;
  for (auto* builder : {&a, &b}) {
    builder->buffer(4, true, true);
    builder->buffer(4, false, true);
  }
  a.binary(aten("aten::mul", "Tensor"), a.ref(0, {4}), a.ref(0, {4}), a.ref(1, {4}));
  b.binary(aten("aten::add", "Tensor"), b.ref(0, {4}), b.ref(0, {4}), b.ref(1, {4}));
  EXPECT_NE(ir::structuralHash(a.graph), ir::structuralHash(b.graph));
}

}  // namespace
}  // namespace poptorch
