#include "compiler/memory_plan.h"

#include <gtest/gtest.h>

#include "compiler/out_variants.h"
#include "graph_builder.h"

namespace poptorch {
namespace {

using testing::aten;
using testing::GraphBuilder;

// [offset, offset + nbytes) of temporary b in the arena.
bool overlap(const compiler::Executable& exe, ir::BufferId a, ir::BufferId b) {
  const int64_t a_end = exe.arena_offset[a] + exe.program.buffers[a].nbytes;
  const int64_t b_end = exe.arena_offset[b] + exe.program.buffers[b].nbytes;
  return exe.arena_offset[a] < b_end && exe.arena_offset[b] < a_end;
}

TEST(MemoryPlan, TemporariesAliveTogetherDoNotShareBytes) {
  GraphBuilder b;
  const auto x = b.buffer(64, true);
  const auto t1 = b.buffer(64);
  const auto t2 = b.buffer(64);
  const auto t3 = b.buffer(64);
  const auto out = b.buffer(64, false, true);
  b.square(x, t1);
  b.add(t1, x, t2);  // t1 and t2 alive together
  b.square(t2, t3);  // t1 is free: t3 can take its place
  b.add(t3, t2, out);
  const auto exe = compiler::compile(b.graph, 1);
  EXPECT_EQ(exe->arena_offset[x], -1);
  EXPECT_EQ(exe->arena_offset[out], -1);
  EXPECT_FALSE(overlap(*exe, t1, t2));
  EXPECT_FALSE(overlap(*exe, t2, t3));
  EXPECT_EQ(exe->arena_offset[t3], exe->arena_offset[t1]);
  // Two 256-byte temporaries at a time.
  EXPECT_EQ(exe->arena_bytes, 512);
  EXPECT_EQ(exe->peak_temporary_bytes, std::vector<int64_t>{512});
}

TEST(MemoryPlan, TemporariesCountOnTheIpuOfTheBlockThatMakesThem) {
  GraphBuilder b;
  const auto x = b.buffer(64, true);
  const auto t1 = b.buffer(64);
  const auto t2 = b.buffer(64);
  const auto out = b.buffer(64, false, true);
  b.square(x, t1).placement = {0, 0, 0, 1};  // t1 made on ipu 1
  b.square(t1, t2).placement = {1, 1, 0, 3};  // t2 on ipu 3, while t1 is alive
  b.add(t2, t1, out).placement = {1, 1, 0, 3};
  const auto exe = compiler::compile(b.graph, 1);
  EXPECT_EQ(exe->peak_temporary_bytes, (std::vector<int64_t>{0, 256, 0, 256}));
  const std::vector<std::vector<int64_t>> by_node{{0, 256}, {0, 256, 0, 256}, {0, 256, 0, 256}};
  EXPECT_EQ(compiler::temporaryBytesByNode(*exe), by_node);
}

TEST(MemoryPlan, TemporaryBytesByNodeFollowEachTemporaryFromFirstToLastUse) {
  GraphBuilder b;
  const auto x = b.buffer(64, true);
  const auto t1 = b.buffer(64);
  const auto t2 = b.buffer(64);
  const auto t3 = b.buffer(64);
  const auto out = b.buffer(64, false, true);
  b.square(x, t1);     // t1
  b.add(t1, x, t2);    // t1 and t2; t1's last use
  b.square(t2, t3);    // t2 and t3
  b.add(t3, t2, out);  // t2 and t3, both last used here
  const auto exe = compiler::compile(b.graph, 1);
  const std::vector<std::vector<int64_t>> expected{{256}, {512}, {512}, {512}};
  EXPECT_EQ(compiler::temporaryBytesByNode(*exe), expected);
}

TEST(Compiler, GuardedWritesAreTheExternalWritesBeforeTheLastGuard) {
  GraphBuilder b;
  const auto stats = b.buffer(4, true, true);
  const auto param = b.buffer(4, true, true);
  const auto grad = b.buffer(4, true, true);
  const auto checked = b.buffer(4);
  b.addInPlace(b.vec(stats), b.vec(grad), 0.1);
  b.square(grad, checked).guard = ir::Guard::kShape;
  b.addInPlace(b.vec(param), b.vec(grad), -0.1);  // after the guard: never undone
  const auto exe = compiler::compile(b.graph, 1);
  EXPECT_TRUE(exe->has_guards);
  EXPECT_EQ(exe->guarded_writes, std::vector<ir::BufferId>{stats});
}

TEST(MemoryPlan, AlignsEveryTemporary) {
  GraphBuilder b;
  const auto x = b.buffer(3, true);
  const auto t1 = b.buffer(3);
  const auto t2 = b.buffer(3);
  const auto out = b.buffer(3, false, true);
  b.binary(aten("aten::mul", "Tensor"), b.ref(x, {3}), b.ref(x, {3}), b.ref(t1, {3}));
  b.binary(aten("aten::mul", "Tensor"), b.ref(t1, {3}), b.ref(x, {3}), b.ref(t2, {3}));
  b.binary(aten("aten::add", "Tensor"), b.ref(t1, {3}), b.ref(t2, {3}), b.ref(out, {3}));
  const auto exe = compiler::compile(b.graph, 2);
  EXPECT_EQ(exe->arena_offset[t1] % 64, 0);
  EXPECT_EQ(exe->arena_offset[t2] % 64, 0);
  EXPECT_FALSE(overlap(*exe, t1, t2));
}

TEST(OutVariants, FindsNativeOutKernels) {
  auto out_of = [](const char* name, const char* overload) {
    auto found = compiler::outVariantOf(aten(name, overload));
    return found ? found->operator_name().overload_name : std::string("none");
  };
  EXPECT_EQ(out_of("aten::mm", ""), "out");
  EXPECT_EQ(out_of("aten::add", "Tensor"), "out");
  EXPECT_EQ(out_of("aten::add", "Scalar"), "none");  // add.Scalar_out is generated
  EXPECT_EQ(out_of("aten::sum", "dim_IntList"), "IntList_out");
  EXPECT_EQ(out_of("aten::threshold_backward", ""), "grad_input");
  // relu.out is generated (runs relu, then copies): no gain.
  EXPECT_EQ(out_of("aten::relu", ""), "none");
  // In-place and multi-result ops keep their own kernels.
  EXPECT_EQ(out_of("aten::add_", "Tensor"), "none");
  EXPECT_EQ(out_of("aten::max", "dim"), "none");
}

TEST(OutVariants, WritesWholeContiguousResultsOnly) {
  GraphBuilder b;
  const auto x = b.buffer(8, true);
  const auto whole = b.buffer(8);
  const auto part = b.buffer(16);
  const auto out = b.buffer(8, false, true);
  b.binary(aten("aten::mul", "Tensor"), b.ref(x, {8}), b.ref(x, {8}), b.ref(whole, {8}));
  b.binary(aten("aten::mul", "Tensor"), b.ref(x, {8}), b.ref(whole, {8}), b.ref(part, {8}));
  b.binary(aten("aten::add", "Tensor"), b.ref(part, {8}), b.ref(whole, {8}), b.ref(out, {8}));
  const auto exe = compiler::compile(b.graph, 3);
  ASSERT_EQ(exe->out_variant.size(), 3u);
  EXPECT_TRUE(exe->out_variant[0].has_value());
  EXPECT_FALSE(exe->out_variant[1].has_value());  // a view of half its buffer
  EXPECT_TRUE(exe->out_variant[2].has_value());   // an external buffer, written in place
}

}  // namespace
}  // namespace poptorch
