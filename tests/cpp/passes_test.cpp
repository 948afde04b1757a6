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
  EXPECT_EQ(out.nodes[0].writes, ir::BufferIds{param});
}

TEST(DeadCode, KeepsGuardsWhoseResultsNobodyReads) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, true);
  const auto unread = b.buffer(4);
  b.square(x, unread).guard = ir::Guard::kShape;
  EXPECT_EQ(passes::eliminateDeadCode(b.graph).nodes.size(), 1u);
}

// A graph input x, two temporaries and an output: the buffers of the
// common-subexpression cases, which differ in the nodes between them.
struct TwoTemporaries {
  GraphBuilder b;
  ir::BufferId x = b.buffer(4, true, true);
  ir::BufferId t1 = b.buffer(4);
  ir::BufferId t2 = b.buffer(4);
  ir::BufferId out = b.buffer(4, false, true);
};

TEST(CommonSubexpressions, MergesRepeatedPureNodes) {
  auto [b, x, t1, t2, out] = TwoTemporaries();
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

TEST(CommonSubexpressions, DoesNotMergeNodesPlannedDifferently) {
  auto [b, x, t1, t2, out] = TwoTemporaries();
  b.square(x, t1);
  b.square(x, t2).matmul.factor = 4;
  b.add(t1, t2, out);
  EXPECT_EQ(passes::eliminateCommonSubexpressions(b.graph).nodes.size(), 3u);
}

TEST(CommonSubexpressions, DoesNotMergeNodesCalledInAnotherState) {
  // A deterministic-algorithms setting (warn_only too) or a denormal mode of
  // its own may make a kernel compute other values from the same inputs.
  for (auto set : std::vector<void (*)(ir::Node&)>{
           [](ir::Node& n) { n.deterministic = true; },
           [](ir::Node& n) { n.deterministic = n.deterministic_warn_only = true; },
           [](ir::Node& n) { n.denormal_mode = 0x8040; }}) {
    auto [b, x, t1, t2, out] = TwoTemporaries();
    b.square(x, t1);
    set(b.square(x, t2));
    b.add(t1, t2, out);
    EXPECT_EQ(passes::eliminateCommonSubexpressions(b.graph).nodes.size(), 3u);
  }
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
  auto [b, x, t1, t2, out] = TwoTemporaries();
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

std::vector<ir::Layout> layouts(const ir::Node& node) {
  std::vector<ir::Layout> result;
  for (const ir::Arg& arg : node.args) {
    if (arg.kind == ir::ArgKind::kTensor) result.push_back(arg.layout);
  }
  return result;
}

// A convolution with `channels` output channels and its backward.
ir::Graph convolutionAndBackward(int64_t channels) {
  GraphBuilder b;
  const auto x = b.buffer(2 * 3 * 8 * 8, true);
  const auto w = b.buffer(channels * 3 * 3 * 3, true);
  const auto y = b.buffer(2 * channels * 6 * 6, false, true);
  const auto gx = b.buffer(2 * 3 * 8 * 8, false, true);
  const auto gw = b.buffer(channels * 3 * 3 * 3, false, true);
  const auto x_ref = b.ref(x, {2, 3, 8, 8});
  const auto w_ref = b.ref(w, {channels, 3, 3, 3});
  b.convolution(x_ref, w_ref, b.ref(y, {2, channels, 6, 6}));
  b.convolutionBackward(b.ref(y, {2, channels, 6, 6}), x_ref, w_ref, b.ref(gx, {2, 3, 8, 8}),
                        b.ref(gw, {channels, 3, 3, 3}));
  return passes::planLayouts(b.graph);
}

TEST(Layouts, Plans2dConvolutionsChannelsLast) {
  const ir::Graph out = convolutionAndBackward(16);
  constexpr auto kChannelsLast = ir::Layout::kChannelsLast;
  EXPECT_EQ(layouts(out.nodes[0]), std::vector<ir::Layout>(2, kChannelsLast));
  EXPECT_EQ(layouts(out.nodes[1]), std::vector<ir::Layout>(3, kChannelsLast));
}

TEST(Layouts, KeepsConvolutionsWithFewOutputChannelsNchw) {
  const ir::Graph out = convolutionAndBackward(15);
  constexpr auto kContiguous = ir::Layout::kContiguous;
  EXPECT_EQ(layouts(out.nodes[0]), std::vector<ir::Layout>(2, kContiguous));
  EXPECT_EQ(layouts(out.nodes[1]), std::vector<ir::Layout>(3, kContiguous));
}

TEST(Layouts, KeepsTransposedAndNarrowStrided1x1ConvolutionsNchw) {
  GraphBuilder b;
  const auto x = b.buffer(2 * 3 * 8 * 8, true);
  const auto w = b.buffer(3 * 4 * 3 * 3, true);
  const auto y = b.buffer(2 * 4 * 10 * 10, false, true);
  b.convolution(b.ref(x, {2, 3, 8, 8}), b.ref(w, {3, 4, 3, 3}), b.ref(y, {2, 4, 10, 10}),
                /*transposed=*/true);
  const auto w1 = b.buffer(16 * 3, true);
  const auto y1 = b.buffer(2 * 16 * 4 * 4, false, true);
  b.convolution(b.ref(x, {2, 3, 8, 8}), b.ref(w1, {16, 3, 1, 1}), b.ref(y1, {2, 16, 4, 4}));
  b.graph.nodes.back().args[3] = ir::Arg::constant(std::vector<int64_t>{2, 2});  // stride
  for (const ir::Node& node : passes::planLayouts(b.graph).nodes) {
    EXPECT_EQ(layouts(node), std::vector<ir::Layout>(2, ir::Layout::kContiguous)) << node.name();
  }
}

TEST(Layouts, LeavesOtherRanksAsTheyAre) {
  GraphBuilder b;
  const auto x = b.buffer(2 * 3 * 8, true);
  const auto w = b.buffer(4 * 3 * 3, true);
  const auto y = b.buffer(2 * 4 * 6, false, true);
  b.convolution(b.ref(x, {2, 3, 8}), b.ref(w, {4, 3, 3}), b.ref(y, {2, 4, 6}));
  EXPECT_EQ(layouts(passes::planLayouts(b.graph).nodes[0]),
            std::vector<ir::Layout>(2, ir::Layout::kAsIs));
}

TEST(Compiler, GivesFlexibleLayoutsToTemporariesReadWhole) {
  GraphBuilder b;
  const auto x = b.buffer(2 * 3 * 8 * 8, true);
  const auto w = b.buffer(4 * 3 * 3 * 3, true);
  const auto w2 = b.buffer(4 * 3 * 3 * 3, true);
  const auto whole = b.buffer(2 * 4 * 6 * 6);
  const auto viewed = b.buffer(2 * 4 * 6 * 6);
  const auto out = b.buffer(2 * 4 * 6 * 6, false, true);
  const auto flat = b.buffer(2 * 144, false, true);
  b.convolution(b.ref(x, {2, 3, 8, 8}), b.ref(w, {4, 3, 3, 3}), b.ref(whole, {2, 4, 6, 6}));
  b.convolution(b.ref(x, {2, 3, 8, 8}), b.ref(w2, {4, 3, 3, 3}), b.ref(viewed, {2, 4, 6, 6}));
  b.binary(aten("aten::add", "Tensor"), b.ref(whole, {2, 4, 6, 6}), b.ref(whole, {2, 4, 6, 6}),
           b.ref(out, {2, 4, 6, 6}));
  // A flattening view of `viewed` pins its layout: the view's strides assume it.
  b.binary(aten("aten::mul", "Tensor"), b.ref(viewed, {2, 144}), b.ref(viewed, {2, 144}),
           b.ref(flat, {2, 144}));
  const auto exe = compiler::compile(b.graph, 43);
  EXPECT_TRUE(exe->flexible_layout[whole]);
  EXPECT_FALSE(exe->flexible_layout[viewed]);
  EXPECT_FALSE(exe->flexible_layout[x]);    // existed before the graph
  EXPECT_FALSE(exe->flexible_layout[out]);  // outlives it
}

// out = relu(addmm(bias, x, w)) on [rows, cols] results; `live` marks the
// product as kept after the graph.
struct LinearRelu {
  GraphBuilder b;
  ir::BufferId product, out;
  explicit LinearRelu(bool live_product = false) {
    const auto bias = b.buffer(3, true);
    const auto x = b.buffer(2 * 4, true);
    const auto w = b.buffer(4 * 3, true);
    product = b.buffer(2 * 3, false, live_product);
    out = b.buffer(2 * 3, false, true);
    ir::Node addmm(aten("aten::addmm"));
    addmm.inputs = {b.ref(bias, {3}), b.ref(x, {2, 4}), b.ref(w, {4, 3})};
    addmm.args = {ir::Arg::tensor(0), ir::Arg::tensor(1), ir::Arg::tensor(2), ir::Arg::runtime(1.0),
                  ir::Arg::runtime(1.0)};
    addmm.outputs = {b.ref(product, {2, 3})};
    addmm.fresh_returns = {true};
    b.append(std::move(addmm));
    ir::Node relu(aten("aten::relu"));
    relu.inputs = {b.ref(product, {6})};
    relu.args = {ir::Arg::tensor(0)};
    relu.outputs = {b.ref(out, {6})};
    relu.fresh_returns = {true};
    b.append(std::move(relu));
  }
};

TEST(Fusion, FusesAddmmWithTheReluThatIsItsOnlyReader) {
  LinearRelu g;
  const ir::Graph fused = passes::fuseMatmulActivations(g.b.graph);
  ASSERT_EQ(names(fused), std::vector<std::string>{"aten::_addmm_activation"});
  const ir::Node& node = fused.nodes[0];
  EXPECT_EQ(node.source_index, 0);  // runtime beta and alpha come from the addmm
  ASSERT_EQ(node.outputs.size(), 1u);
  EXPECT_EQ(node.outputs[0].buffer, g.out);
  EXPECT_EQ(c10::IntArrayRef(node.outputs[0].sizes), c10::IntArrayRef({2, 3}));
  ASSERT_EQ(node.args.size(), 6u);
  EXPECT_EQ(node.args[5].value, c10::IValue(false));  // relu, not gelu
}

TEST(Fusion, FusesAddmmWithAnExactGeluButNotTheTanhApproximation) {
  for (const char* approximate : {"none", "tanh"}) {
    LinearRelu g;
    ir::Node& activation = g.b.graph.nodes[1];
    activation.op = aten("aten::gelu");
    activation.args.push_back(ir::Arg::constant(std::string(approximate)));
    const ir::Graph fused = passes::fuseMatmulActivations(g.b.graph);
    if (std::string(approximate) == "tanh") {  // _addmm_activation's gelu is the exact one
      EXPECT_EQ(fused.nodes.size(), 2u);
      continue;
    }
    ASSERT_EQ(names(fused), std::vector<std::string>{"aten::_addmm_activation"});
    EXPECT_EQ(fused.nodes[0].args[5].value, c10::IValue(true));  // use_gelu
    EXPECT_EQ(fused.nodes[0].outputs[0].buffer, g.out);
  }
}

TEST(Fusion, KeepsAProductSomethingElseObserves) {
  LinearRelu kept(/*live_product=*/true);
  EXPECT_EQ(passes::fuseMatmulActivations(kept.b.graph).nodes.size(), 2u);
  LinearRelu read_twice;
  read_twice.b.square(read_twice.product, read_twice.b.buffer(6, false, true));
  EXPECT_EQ(passes::fuseMatmulActivations(read_twice.b.graph).nodes.size(), 3u);
}

TEST(Fusion, KeepsAProductAndAReluCalledInAnotherState) {
  LinearRelu g;
  g.b.graph.nodes[1].deterministic = true;
  EXPECT_EQ(passes::fuseMatmulActivations(g.b.graph).nodes.size(), 2u);
}

// product = mm(x, w) on [2, 3], then product.add_(bias, alpha) on a [1, 2, 3]
// view of it, as linear runs on an input it reshapes.
struct MatmulThenBias {
  GraphBuilder b;
  ir::BufferId x, w, bias, product;
  MatmulThenBias() {
    x = b.buffer(2 * 4, true);
    w = b.buffer(4 * 3, true);
    bias = b.buffer(3, true);
    product = b.buffer(2 * 3, false, true);
    b.binary(aten("aten::mm"), b.ref(x, {2, 4}), b.ref(w, {4, 3}), b.ref(product, {2, 3}));
  }
  void addBias() { b.addInPlace(b.ref(product, {1, 2, 3}), b.ref(bias, {3}), 0.5); }
};

TEST(Fusion, FusesAProductWithTheBiasAddedToItInPlace) {
  MatmulThenBias g;
  const auto other = g.b.buffer(4, false, true);
  g.b.square(g.x, other);  // between the two: reads the matrix, writes elsewhere
  g.addBias();
  const ir::Graph fused = passes::fuseMatmulBias(g.b.graph);
  ASSERT_EQ(names(fused), (std::vector<std::string>{"aten::mul.Tensor", "aten::addmm"}));
  const ir::Node& addmm = fused.nodes[1];
  EXPECT_EQ(addmm.source_index, 0);
  ASSERT_EQ(addmm.inputs.size(), 3u);
  EXPECT_EQ(addmm.inputs[0].buffer, g.bias);
  EXPECT_EQ(addmm.inputs[1].buffer, g.x);
  EXPECT_EQ(addmm.inputs[2].buffer, g.w);
  EXPECT_EQ(addmm.outputs[0].buffer, g.product);
  EXPECT_TRUE(addmm.writes.empty());
  // beta is the add_'s alpha, read from the captured add_ (node 2).
  ASSERT_EQ(addmm.args.size(), 5u);
  EXPECT_EQ(addmm.args[3].kind, ir::ArgKind::kRuntime);
  EXPECT_EQ(addmm.args[3].refs, (c10::SmallVector<int32_t, 2>{2, 2}));
  EXPECT_EQ(addmm.args[4].kind, ir::ArgKind::kConstant);
}

TEST(Fusion, KeepsAProductReadOrAMatrixWrittenBeforeTheBias) {
  MatmulThenBias read;
  read.b.square(read.product, read.b.buffer(6, false, true));
  read.addBias();
  EXPECT_EQ(passes::fuseMatmulBias(read.b.graph).nodes.size(), 3u);
  MatmulThenBias written;
  written.b.addInPlace(written.b.ref(written.x, {8}), written.b.ref(written.x, {8}), 1.0);
  written.addBias();
  EXPECT_EQ(passes::fuseMatmulBias(written.b.graph).nodes.size(), 3u);
}

TEST(Fusion, KeepsA16BitProductAndItsBiasApart) {
  MatmulThenBias half;
  half.addBias();
  for (ir::Node& node : half.b.graph.nodes) {
    for (ir::TensorRef& ref : node.inputs) ref.dtype = c10::ScalarType::Half;
    for (ir::TensorRef& ref : node.outputs) ref.dtype = c10::ScalarType::Half;
  }
  for (ir::BufferInfo& buffer : half.b.graph.buffers) buffer.nbytes /= 2;
  EXPECT_EQ(passes::fuseMatmulBias(half.b.graph).nodes.size(), 2u);
}

// x.bernoulli_(p) as captured: a seed, its Generator? argument third.
ir::Node& bernoulliInPlace(GraphBuilder& b, ir::TensorRef self) {
  ir::Node node(aten("aten::bernoulli_", "float"));
  node.inputs = {self};
  node.args = {ir::Arg::tensor(0), ir::Arg::runtime(0.9), ir::Arg::constant(c10::IValue())};
  node.writes = {self.buffer};
  node.fresh_returns = {false};
  node.seed = 1234;
  node.generator_arg = 2;
  return b.append(std::move(node));
}

TEST(RandomFills, RunsFloatingBernoulliFillsCounterBased) {
  GraphBuilder b;
  const auto mask = b.buffer(4, false, true);
  bernoulliInPlace(b, b.vec(mask));
  const ir::Graph g = passes::useCounterBasedRandomFills(b.graph);
  ASSERT_EQ(names(g), (std::vector<std::string>{"poptorch::bernoulli_"}));
  const ir::Node& fill = g.nodes[0];
  EXPECT_EQ(fill.seed, std::optional<uint64_t>(1234));
  EXPECT_EQ(fill.generator_arg, 2);
  EXPECT_EQ(fill.writes, ir::BufferIds{mask});
  EXPECT_EQ(fill.args.size(), 3u);
  EXPECT_FALSE(fill.hasHostEffects());
  EXPECT_TRUE(fill.isNondeterministic());
}

TEST(RandomFills, KeepsIntegerFillsAsCaptured) {
  GraphBuilder b;
  ir::TensorRef mask = b.vec(b.buffer(4, false, true));
  mask.dtype = c10::ScalarType::Int;
  bernoulliInPlace(b, mask);
  EXPECT_EQ(names(passes::useCounterBasedRandomFills(b.graph)),
            (std::vector<std::string>{"aten::bernoulli_.float"}));
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

TEST(ExecutableCache, EvictsTheLeastRecentlyUsed) {
  auto& cache = compiler::ExecutableCache::get();
  const size_t capacity = cache.capacity();
  cache.clear();
  cache.setCapacity(2);
  GraphBuilder b;
  b.buffer(4, true, true);
  auto one = compiler::compile(b.graph, 1);
  cache.insert(one);
  cache.insert(compiler::compile(b.graph, 2));
  EXPECT_EQ(cache.find(1), one);  // 2 is now the least recently used
  cache.insert(compiler::compile(b.graph, 3));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.find(2), nullptr);
  EXPECT_EQ(cache.find(1), one);
  EXPECT_NE(cache.find(3), nullptr);
  cache.setCapacity(0);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(one->key, 1u);  // still alive for whoever holds it
  cache.setCapacity(capacity);
}

}  // namespace
}  // namespace poptorch
