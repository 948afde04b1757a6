// Which convolutions poptorch::convolution and poptorch::convolution_backward
// (narrow_convolution.cpp) compute with their own kernels: the one test that
// passes::useOwnKernels applies when it chooses them at compile time and the
// kernels apply to their arguments (others run aten's convolution).
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace poptorch::kernels {

// aten::convolution's arguments that decide it, as sizes and constants.
struct ConvolutionShape {
  c10::IntArrayRef input;   // N, C, H, W
  c10::IntArrayRef weight;  // C_out, C, KH, KW
  c10::IntArrayRef stride, padding, dilation;
  bool transposed;
  c10::IntArrayRef output_padding;
  int64_t groups;
};

// True for a 2-D, ungrouped, untransposed convolution with unit stride and
// dilation (any padding) whose input and output have fewer than 16 channels:
// there oneDNN's NCHW kernels (which passes::planLayouts keeps for fewer than
// 16 output channels) cost more than an im2col and a GEMM per image
// (docs/performance.md).
bool isNarrowConvolution(const ConvolutionShape& shape);

}  // namespace poptorch::kernels
