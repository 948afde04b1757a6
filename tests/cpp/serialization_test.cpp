#include "compiler/serialization.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "compiler/executable.h"
#include "graph_builder.h"
#include "ir/hash.h"

namespace poptorch {
namespace {

using testing::aten;
using testing::GraphBuilder;

// Every field of an executable and its nodes is serialized, except the run
// data listed in serialization.h, which comes from the graph as captured. A
// field added to one of these structs changes its size: serialize the new
// field in compiler/serialization.cpp (or list it as run data there), compare
// it below, then update the size here.
TEST(Serialization, EveryFieldIsKnown) {
  EXPECT_EQ(sizeof(ir::TensorRef), 136u) << "ir::TensorRef has a new field";
  EXPECT_EQ(sizeof(ir::Arg), 56u) << "ir::Arg has a new field";
  EXPECT_EQ(sizeof(ir::Node), 848u) << "ir::Node has a new field";
  EXPECT_EQ(sizeof(ir::BufferInfo), 16u) << "ir::BufferInfo has a new field";
  EXPECT_EQ(sizeof(ir::Graph), 88u) << "ir::Graph has a new field";
  EXPECT_EQ(sizeof(compiler::Executable), 368u) << "compiler::Executable has a new field";
}

// A graph that exercises every kind of argument and plan: runtime Scalars,
// typed list constants (int?[] and bool[3]), an undefined tensor, a random
// op with its generator, a guard, channels-last planning and out= variants.
ir::Graph sampleGraph() {
  GraphBuilder b;
  const auto x = b.buffer(2 * 3 * 4 * 4, true, false);
  const auto w = b.buffer(3 * 3 * 1 * 1, true, false);
  const auto conv = b.buffer(2 * 3 * 4 * 4);
  const auto grad_in = b.buffer(2 * 3 * 4 * 4);
  const auto grad_w = b.buffer(3 * 3 * 1 * 1, false, true);
  const auto noise = b.buffer(4, false, true);
  const auto sum = b.buffer(4, false, true);
  const auto square = b.buffer(4, false, true);
  const auto x_ref = GraphBuilder::ref(x, {2, 3, 4, 4});
  const auto w_ref = GraphBuilder::ref(w, {3, 3, 1, 1});
  const auto conv_ref = GraphBuilder::ref(conv, {2, 3, 4, 4});
  b.convolution(x_ref, w_ref, conv_ref);
  b.convolutionBackward(conv_ref, x_ref, w_ref, GraphBuilder::ref(grad_in, {2, 3, 4, 4}),
                        GraphBuilder::ref(grad_w, {3, 3, 1, 1}));

  ir::Node random(aten("aten::normal", "float_float"));
  random.args = {ir::Arg::runtime(0.0),
                 ir::Arg::runtime(1.0),
                 ir::Arg::constant(std::vector<int64_t>{4}),
                 ir::Arg::constant(at::make_generator<at::CPUGeneratorImpl>(7)),
                 ir::Arg::constant(c10::IValue()),
                 ir::Arg::constant(c10::IValue()),
                 ir::Arg::constant(c10::IValue()),
                 ir::Arg::constant(c10::IValue())};
  random.outputs = {GraphBuilder::vec(noise)};
  random.fresh_returns = {true};
  random.seed = 1234;
  random.generator_arg = 3;
  random.placement = {2, 1, 0, 3};  // block 2: stage 1, phase 0, ipu 3
  random.matmul = {ir::MatMulPlan::Split::kReducingDim, 4, 0.25f};  // a matmul's, kept as it is
  random.deterministic = true;
  random.denormal_mode = 0x8040;  // flush-to-zero and denormals-are-zero
  random.observed = {c10::IValue(int64_t{3})};
  b.append(std::move(random));

  ir::Node& add = b.add(noise, noise, sum);
  add.guard = ir::Guard::kShape;
  add.args.push_back(ir::Arg::runtime(int64_t{1}));  // alpha, which the builder leaves out
  b.addInPlace(GraphBuilder::vec(sum), GraphBuilder::vec(noise), 0.5);

  ir::Node fill(aten("aten::fill_", "Scalar"));
  fill.inputs = {GraphBuilder::vec(sum)};
  fill.args = {ir::Arg::tensor(0), ir::Arg::runtime(at::scalar_tensor(2.0))};
  fill.writes = {sum};
  fill.fresh_returns = {false};
  b.append(std::move(fill));

  b.square(noise, square);  // runs with its out= variant
  b.graph.guard_sites[3] = "model.py:12";
  return b.graph;
}

// The constant of a `Scalar[]` argument, as capture finds it on the stack.
c10::IValue scalarList() {
  c10::impl::GenericList list(c10::NumberType::get());
  list.push_back(2.0);
  list.push_back(int64_t{1});
  return list;
}

void expectSameRef(const ir::TensorRef& a, const ir::TensorRef& b) { EXPECT_TRUE(a == b); }

void expectSameNode(const ir::Node& a, const ir::Node& b) {
  EXPECT_EQ(a.name(), b.name());
  ASSERT_EQ(a.args.size(), b.args.size());
  for (size_t i = 0; i < a.args.size(); ++i) {
    const ir::Arg& x = a.args[i];
    const ir::Arg& y = b.args[i];
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.refs, y.refs);
    EXPECT_EQ(x.optional_elements, y.optional_elements);
    EXPECT_EQ(x.layout, y.layout);
    if (x.kind == ir::ArgKind::kRuntime) {
      EXPECT_TRUE(y.value.isNone()) << "runtime values are run data";
    } else if (x.value.isGenerator()) {
      EXPECT_TRUE(y.value.isNone()) << "a generator is replaced by a seeded one when run";
    } else if (x.value.isTensor()) {
      EXPECT_TRUE(y.value.isTensor() && !y.value.toTensor().defined());
    } else {
      EXPECT_TRUE(x.value == y.value) << a.name() << " argument " << i;
      EXPECT_EQ(*x.value.type(), *y.value.type()) << a.name() << " argument " << i;
    }
  }
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (size_t i = 0; i < a.inputs.size(); ++i) expectSameRef(a.inputs[i], b.inputs[i]);
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i) expectSameRef(a.outputs[i], b.outputs[i]);
  EXPECT_EQ(a.writes, b.writes);
  EXPECT_EQ(a.fresh_returns, b.fresh_returns);
  EXPECT_EQ(a.source_index, b.source_index);
  EXPECT_EQ(a.seed.has_value(), b.seed.has_value()) << "the seed itself is run data";
  EXPECT_EQ(a.generator_arg, b.generator_arg);
  EXPECT_EQ(a.guard, b.guard);
  EXPECT_EQ(a.placement, b.placement);
  EXPECT_EQ(a.matmul, b.matmul);
  EXPECT_EQ(a.denormal_mode, b.denormal_mode);
  EXPECT_EQ(a.deterministic, b.deterministic);
  EXPECT_EQ(a.deterministic_warn_only, b.deterministic_warn_only);
  // Run data: observed values.
  EXPECT_TRUE(b.observed.empty());
}

void expectSameExecutable(const compiler::Executable& a, const compiler::Executable& b) {
  EXPECT_EQ(a.key, b.key);
  ASSERT_EQ(a.program.buffers.size(), b.program.buffers.size());
  for (size_t i = 0; i < a.program.buffers.size(); ++i) {
    const ir::BufferInfo& x = a.program.buffers[i];
    const ir::BufferInfo& y = b.program.buffers[i];
    EXPECT_EQ(x.nbytes, y.nbytes);
    EXPECT_EQ(x.device, y.device);
    EXPECT_EQ(x.existed_before, y.existed_before);
    EXPECT_EQ(x.live_after, y.live_after);
  }
  ASSERT_EQ(a.program.nodes.size(), b.program.nodes.size());
  for (size_t i = 0; i < a.program.nodes.size(); ++i) {
    expectSameNode(a.program.nodes[i], b.program.nodes[i]);
  }
  EXPECT_TRUE(b.program.guard_sites.empty()) << "where guards read is run data";
  EXPECT_EQ(a.roles, b.roles);
  EXPECT_EQ(a.flexible_layout, b.flexible_layout);
  EXPECT_EQ(a.release_after, b.release_after);
  EXPECT_EQ(a.peak_temporary_bytes, b.peak_temporary_bytes);
  EXPECT_EQ(a.arena_offset, b.arena_offset);
  EXPECT_EQ(a.arena_bytes, b.arena_bytes);
  EXPECT_EQ(a.out_variant, b.out_variant);
  EXPECT_EQ(a.has_guards, b.has_guards);
  EXPECT_EQ(a.guarded_writes, b.guarded_writes);
  // Derived again when decoded, not stored.
  EXPECT_EQ(a.dependencies.successors, b.dependencies.successors);
  ASSERT_EQ(a.dependencies.segments.size(), b.dependencies.segments.size());
  for (size_t s = 0; s < a.dependencies.segments.size(); ++s) {
    EXPECT_EQ(a.dependencies.segments[s].begin, b.dependencies.segments[s].begin);
    EXPECT_EQ(a.dependencies.segments[s].end, b.dependencies.segments[s].end);
  }
}

std::shared_ptr<const compiler::Executable> compiled(const ir::Graph& graph) {
  return compiler::compile(graph, ir::structuralHash(graph));
}

TEST(Serialization, AnExecutableRoundTripsThroughThePickler) {
  ir::Graph graph = sampleGraph();
  ir::Node upsample(aten("aten::upsample_nearest2d", "vec"));
  upsample.inputs = {GraphBuilder::ref(0, {2, 3, 4, 4})};
  const auto up = graph.addBuffer({2 * 3 * 4 * 4 * 4, {c10::DeviceType::IPU, 0}, false, true});
  upsample.args = {ir::Arg::tensor(0), ir::Arg::constant(c10::IValue()),
                   ir::Arg::constant(std::vector<double>{1.0, 1.0})};
  upsample.outputs = {GraphBuilder::ref(up, {2, 3, 4, 4})};
  upsample.fresh_returns = {true};
  upsample.source_index = static_cast<int32_t>(graph.nodes.size());
  graph.nodes.push_back(std::move(upsample));
  const auto exe = compiled(graph);
  ASSERT_TRUE(exe->has_guards);
  ASSERT_TRUE(std::any_of(exe->out_variant.begin(), exe->out_variant.end(),
                          [](const auto& op) { return op.has_value(); }));
  ASSERT_TRUE(std::any_of(exe->flexible_layout.begin(), exe->flexible_layout.end(),
                          [](bool f) { return f; }));

  const std::vector<char> bytes = torch::jit::pickle(compiler::executableToIValue(*exe));
  const auto back =
      compiler::executableFromIValue(torch::jit::unpickle(bytes.data(), bytes.size()));
  expectSameExecutable(*exe, *back);
  compiler::checkFits(*back, graph);
}

TEST(Serialization, TypedListConstantsKeepTheirType) {
  GraphBuilder b;
  const auto x = b.buffer(4, true, false);
  const auto out = b.buffer(4, false, true);
  // A kernel reads a Scalar[] argument as a list of Scalars: the decoded
  // constant must be one too, not a list of Any.
  ir::Node node(aten("aten::_foreach_clamp_min", "ScalarList"));
  node.inputs = {GraphBuilder::vec(x)};
  ir::Arg tensors;
  tensors.kind = ir::ArgKind::kTensorList;
  tensors.refs = {0};
  node.args = {tensors, ir::Arg::constant(scalarList())};
  node.outputs = {GraphBuilder::vec(out)};
  node.fresh_returns = {true};
  b.append(std::move(node));
  const auto exe = compiled(b.graph);
  const std::vector<char> bytes = torch::jit::pickle(compiler::executableToIValue(*exe));
  const auto back =
      compiler::executableFromIValue(torch::jit::unpickle(bytes.data(), bytes.size()));
  const c10::IValue& list = back->program.nodes[0].args[1].value;
  EXPECT_EQ(*list.type(), *scalarList().type());
  EXPECT_TRUE(list == scalarList());
}

TEST(Serialization, AnEntryRoundTripsAndKeepsTheStructure) {
  const ir::Graph graph = sampleGraph();
  const compiler::Entry entry{compiled(graph), compiler::structureOf(graph)};
  const compiler::Entry back = compiler::decodeEntry(compiler::encodeEntry(entry));
  EXPECT_EQ(back.structure, entry.structure);
  expectSameExecutable(*entry.executable, *back.executable);
}

TEST(Serialization, TheStructureCoversWhatTheHashCovers) {
  const ir::Graph graph = sampleGraph();
  ir::Graph changed_runtime = graph;  // runtime values are not structure
  changed_runtime.nodes[4].args[2].value = 0.25;
  changed_runtime.nodes[2].seed = 99;
  EXPECT_EQ(compiler::structureOf(graph), compiler::structureOf(changed_runtime));
  ir::Graph changed_constant = graph;
  changed_constant.nodes[0].args[8] = ir::Arg::constant(int64_t{3});  // groups
  EXPECT_NE(compiler::structureOf(graph), compiler::structureOf(changed_constant));
  ir::Graph changed_buffer = graph;
  changed_buffer.buffers[0].live_after = true;
  EXPECT_NE(compiler::structureOf(graph), compiler::structureOf(changed_buffer));
}

TEST(Serialization, DamagedEntriesAreErrors) {
  const ir::Graph graph = sampleGraph();
  const std::string bytes = compiler::encodeEntry({compiled(graph), compiler::structureOf(graph)});
  EXPECT_THROW(compiler::decodeEntry(bytes.substr(0, bytes.size() / 2)), c10::Error);
  EXPECT_THROW(compiler::decodeEntry("not an entry"), c10::Error);
  // Every byte of the content is covered: flip one in each part.
  size_t failures = 0;
  const size_t step = bytes.size() / 64;
  for (size_t at = 0; at < bytes.size(); at += step) {
    std::string damaged = bytes;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x10);
    try {
      const compiler::Entry entry = compiler::decodeEntry(damaged);
      // A flip outside the content (zip bookkeeping) leaves the entry intact.
      expectSameExecutable(*compiled(graph), *entry.executable);
      EXPECT_EQ(entry.structure, compiler::structureOf(graph));
    } catch (const c10::Error&) {
      ++failures;
    }
  }
  EXPECT_GT(failures, 32u);
}

TEST(Serialization, AnEntryOfAnotherBuildIsRefused) {
  auto tree = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  tree.insert("identity", "poptorch executable format 0, torch 1.0, build 0");
  const std::vector<char> bytes = torch::jit::pickle_save(tree);
  try {
    compiler::decodeEntry(std::string(bytes.begin(), bytes.end()));
    FAIL() << "an entry of another build was decoded";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("another build"), std::string::npos);
  }
}

TEST(Serialization, AnExecutableMustFitItsGraph) {
  const ir::Graph graph = sampleGraph();
  const auto exe = compiled(graph);
  ir::Graph other = graph;
  other.buffers[1].nbytes *= 2;
  EXPECT_THROW(compiler::checkFits(*exe, other), c10::Error);
}

TEST(Serialization, AGeneratorWithoutASeedIsNotStored) {
  ir::Graph graph = sampleGraph();
  graph.nodes[2].seed.reset();
  EXPECT_THROW(compiler::structureOf(graph), compiler::NotSerializable);
}

}  // namespace
}  // namespace poptorch
