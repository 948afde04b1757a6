#include "kernels/own_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace poptorch {
namespace {

std::string qualified(std::string_view ns, std::string_view name) {
  return std::string(ns) + "::" + std::string(name);
}

// Every poptorch:: op this binary registers (the C++ kernels; Python's custom
// ops, which act on the host, are not loaded here) is in the table, so that
// the passes never take a new kernel for one with host effects. guard_equal
// is capture's guard (ir::Guard::kValue), which has no effect when it holds.
TEST(OwnKernels, TheTableListsEveryKernelRegistered) {
  int found = 0;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("poptorch::", 0) != 0 || name.name == "poptorch::guard_equal") continue;
    ++found;
    EXPECT_TRUE(kernels::isOwnKernel(name.name)) << name.name << " is not in kOwnKernels";
  }
  EXPECT_GT(found, 0);
}

TEST(OwnKernels, EachHasACpuAndAMetaKernelAndMatchesTheAtenOpItStandsFor) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const kernels::OwnKernel& kernel : kernels::kOwnKernels) {
    const std::string own_name = qualified("poptorch", kernel.name);
    const auto own = dispatcher.findSchema({own_name, ""});
    ASSERT_TRUE(own.has_value()) << own_name << " is not registered";
    EXPECT_TRUE(own->hasKernelForDispatchKey(c10::DispatchKey::CPU)) << own_name;
    EXPECT_TRUE(own->hasKernelForDispatchKey(c10::DispatchKey::Meta)) << own_name;
    if (kernel.stands_for.empty()) {
      EXPECT_FALSE(kernel.aten_captured_whole) << own_name;
      continue;
    }
    const std::string aten_name = qualified("aten", kernel.stands_for);
    const auto aten = dispatcher.findSchema({aten_name, ""});
    ASSERT_TRUE(aten.has_value()) << aten_name;
    const auto& own_args = own->schema().arguments();
    const auto& aten_args = aten->schema().arguments();
    ASSERT_EQ(own_args.size(), aten_args.size()) << own_name;
    for (size_t i = 0; i < own_args.size(); ++i) {
      EXPECT_EQ(*own_args[i].type(), *aten_args[i].type()) << own_name << " argument " << i;
    }
    EXPECT_EQ(own->schema().returns().size(), aten->schema().returns().size()) << own_name;
    EXPECT_EQ(kernels::atenCapturedWhole(aten_name), kernel.aten_captured_whole) << aten_name;
  }
}

TEST(OwnKernels, NamesOutsideTheTableAreNotOwnKernels) {
  EXPECT_TRUE(kernels::isOwnKernel("poptorch::tanh"));
  EXPECT_FALSE(kernels::isOwnKernel("aten::tanh"));
  EXPECT_FALSE(kernels::isOwnKernel("poptorch::host_call"));
  EXPECT_FALSE(kernels::isOwnKernel("poptorch::"));
  EXPECT_TRUE(kernels::atenCapturedWhole("aten::_safe_softmax"));
  EXPECT_FALSE(kernels::atenCapturedWhole("aten::tanh"));
  EXPECT_FALSE(kernels::atenCapturedWhole("poptorch::_safe_softmax"));
}

}  // namespace
}  // namespace poptorch
