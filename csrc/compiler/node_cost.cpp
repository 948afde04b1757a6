#include "compiler/node_cost.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <string_view>

namespace poptorch::compiler {
namespace {

// Single-thread rates of this project's machine (AMD EPYC, AVX2), the 10th
// percentile of 40 runs of each kernel at several sizes (docs/performance.md):
// MKL's sgemm 40-50 GFLOP/s from 4 MFLOP up; oneDNN's channels-last
// convolution 30-60 GFLOP/s forward, ~10 backward (input and weight gradients
// together); elementwise kernels 15 GB/s out of cache, 35-40 in it.
constexpr double kGemmFlopsPerUs = 45e3;
constexpr double kConvFlopsPerUs = 40e3;
constexpr double kConvBackwardFlopsPerUs = 10e3;
constexpr double kAttentionFlopsPerUs = 20e3;
constexpr double kBytesPerUs = 15e3;
// What any node costs beyond its arithmetic: the dispatcher, the kernel's
// set-up, its tensors' views (an `add` of 64 elements takes 3 us).
constexpr double kNodeUs = 3.0;
// PyTorch's random kernels on this CPU run element by element on one thread
// (without MKL's generators, which PyTorch uses on Intel CPUs only).
constexpr double kRandomUsPerElement = 0.008;
// poptorch::bernoulli_ (csrc/kernels/bernoulli.cpp), vectorised, split over
// threads like an elementwise kernel and compute-bound: 0.9 ns an element.
constexpr double kCounterRandomUsPerElement = 0.0009;
constexpr double kCounterRandomSpeedUp = 1.9;
// What a kernel split over two threads pays to fork and join its OpenMP team.
constexpr double kForkJoinUs = 1.5;
// ATen's elementwise kernels stay on one thread below this many elements
// (at::internal::GRAIN_SIZE).
constexpr int64_t kGrain = 32768;

// The speed-up of a kernel on two cores over one: the matrix products and
// convolutions of a model are split well once large (MKL and oneDNN use one
// thread for the smallest); memory-bound kernels share the memory bandwidth.
double computeSpeedUp(double flops, double half_speed_flops) {
  return 1.0 + 0.85 * flops / (flops + half_speed_flops);
}
constexpr double kMemorySpeedUp = 1.6;

int64_t bytesOf(const ir::TensorRef& ref) {
  return ref.numel() * static_cast<int64_t>(c10::elementSize(ref.dtype));
}

// The FLOPs of a matrix product (batched or not, with or without bias).
double gemmFlops(const ir::Node& node) {
  const auto [lhs, rhs] = node.matMulOperands();
  return 2.0 * static_cast<double>(lhs->numel()) * static_cast<double>(rhs->sizes.back());
}

// The FLOPs of a convolution: per output element, a dot product over the
// kernel's window of its group's input channels.
double convolutionFlops(const ir::TensorRef& output, const ir::TensorRef& weight) {
  const int64_t out_channels = weight.sizes.empty() ? 1 : std::max<int64_t>(weight.sizes[0], 1);
  return 2.0 * static_cast<double>(output.numel()) *
         static_cast<double>(weight.numel() / out_channels);
}

NodeCost computeBound(double flops, double flops_per_us, double half_speed_flops) {
  NodeCost cost;
  cost.one_core_us = kNodeUs + flops / flops_per_us;
  // The smallest stay on one thread (MKL and oneDNN choose so).
  cost.two_cores_us = std::min(
      cost.one_core_us,
      kNodeUs + kForkJoinUs + flops / flops_per_us / computeSpeedUp(flops, half_speed_flops));
  return cost;
}

// Whether `name` is aten::<op> or poptorch's kernel for it (the narrow
// convolutions of kernels/narrow_convolution.cpp cost as their FLOPs do too).
bool isAtenOrOwn(std::string_view name, std::string_view op) {
  constexpr std::string_view kAten = "aten::", kOwn = "poptorch::";
  return (name.substr(0, kAten.size()) == kAten && name.substr(kAten.size()) == op) ||
         (name.substr(0, kOwn.size()) == kOwn && name.substr(kOwn.size()) == op);
}

bool isRandomFill(std::string_view name) {
  static constexpr std::string_view kRandom[] = {
      "aten::bernoulli_", "aten::bernoulli",   "aten::normal_",
      "aten::uniform_",   "aten::random_",     "aten::exponential_",
      "aten::geometric_", "aten::log_normal_", "aten::cauchy_"};
  return std::find(std::begin(kRandom), std::end(kRandom), name) != std::end(kRandom);
}

}  // namespace

NodeCost estimateNodeCost(const ir::Node& node) {
  const std::string& name = node.op.operator_name().name;
  if (node.isMatMul()) return computeBound(gemmFlops(node), kGemmFlopsPerUs, 12e6);
  if (isAtenOrOwn(name, "convolution") && node.inputs.size() >= 2 && !node.outputs.empty()) {
    return computeBound(convolutionFlops(node.outputs[0], node.inputs[1]), kConvFlopsPerUs, 10e6);
  }
  if (isAtenOrOwn(name, "convolution_backward") && node.inputs.size() >= 3) {
    // Input and weight gradients each cost the forward's FLOPs; the bias
    // gradient (one dimension) is a reduction.
    const double forward = convolutionFlops(node.inputs[0], node.inputs[2]);
    const auto gradients = std::count_if(node.outputs.begin(), node.outputs.end(),
                                         [](const ir::TensorRef& r) { return r.sizes.size() > 1; });
    return computeBound(forward * static_cast<double>(gradients), kConvBackwardFlopsPerUs, 10e6);
  }
  if (name.rfind("aten::_scaled_dot_product_flash_attention", 0) == 0 && node.inputs.size() >= 2) {
    // Per (batch, head): Q K^T and P V, 2 L S E FLOPs each; the backward
    // computes about two and a half times as much.
    const ir::TensorRef& q = node.inputs[0];
    const ir::TensorRef& k = node.inputs[1];
    const double keys = k.sizes.size() >= 2 ? static_cast<double>(k.sizes[k.sizes.size() - 2]) : 1;
    const double forward = 4.0 * static_cast<double>(q.numel()) * keys;
    const bool backward = name.find("backward") != std::string::npos;
    return computeBound(backward ? 2.5 * forward : forward, kAttentionFlopsPerUs, 8e6);
  }
  int64_t bytes = 0;
  int64_t largest = 0;  // elements of the largest tensor, which decides the split
  for (const ir::TensorRef& in : node.inputs) {
    bytes += bytesOf(in);
    largest = std::max(largest, in.numel());
  }
  for (const ir::TensorRef& out : node.outputs) {
    bytes += bytesOf(out);
    largest = std::max(largest, out.numel());
  }
  NodeCost cost;
  if (name == "poptorch::bernoulli_") {
    cost.one_core_us = kNodeUs + kCounterRandomUsPerElement * static_cast<double>(largest);
    cost.two_cores_us =
        largest < kGrain
            ? cost.one_core_us
            : kNodeUs + kForkJoinUs +
                  kCounterRandomUsPerElement * static_cast<double>(largest) / kCounterRandomSpeedUp;
    return cost;
  }
  if (isRandomFill(name)) {
    cost.one_core_us = kNodeUs + kRandomUsPerElement * static_cast<double>(largest);
    cost.two_cores_us = cost.one_core_us;
    return cost;
  }
  cost.one_core_us = kNodeUs + static_cast<double>(bytes) / kBytesPerUs;
  cost.two_cores_us =
      largest < kGrain
          ? cost.one_core_us
          : kNodeUs + kForkJoinUs + static_cast<double>(bytes) / kBytesPerUs / kMemorySpeedUp;
  return cost;
}

}  // namespace poptorch::compiler
