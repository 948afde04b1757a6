// Graph-to-graph optimisations. Each keeps the observable effect of the graph
// on its live buffers, and keeps Node::source_index so that runtime arguments
// can still be read from the graph as captured.
#pragma once

#include "ir/graph.h"

namespace poptorch::passes {

// Removes nodes whose results and writes no live buffer can observe (nodes
// with host effects stay).
ir::Graph eliminateDeadCode(ir::Graph graph);

// Removes a node that repeats an earlier one (same op, same constant
// arguments, same inputs holding the same values) and makes its readers use
// the earlier node's results. Only pure, deterministic nodes without host
// effects whose results are temporaries and are never written afterwards are merged.
ir::Graph eliminateCommonSubexpressions(ir::Graph graph);

// Fuses a matrix product with the add_ of a bias vector that follows it (what
// linear runs on an input it must reshape) into one addmm: the bias is added
// in the product's pass. The addmm's beta is the add_'s alpha, read from the
// captured add_ (see ir::Arg::refs of a runtime argument).
ir::Graph fuseMatmulBias(ir::Graph graph);

// Fuses an addmm with the relu or exact gelu (BERT's) that is the only reader
// of its result into one _addmm_activation, as eager PyTorch's fused
// Transformer layers do: the activation runs on the product while it is in
// cache, and the product's temporary goes.
ir::Graph fuseMatmulActivations(ir::Graph graph);

// Fuses GELU's tanh approximation written as ops, as GPT-2's NewGELUActivation
// writes it, (x * half) * (tanh((x + alpha * (x ** e * kappa)) * beta) + one),
// into one poptorch::tanh_gelu (csrc/kernels/tanh_gelu.cpp): one pass over x
// instead of eight, each op rounded as the CPU rounds it. In training, where
// the chain's gradient as autograd records it (eleven ops) reads x * half, the
// tanh and the sum, that gradient becomes one poptorch::tanh_gelu_backward of
// the incoming gradient and x, run where its last op ran: no intermediate is
// kept from forward to backward. The scalars stay the captured ops' runtime
// arguments, so any values run; only float32 chains whose intermediates are
// temporaries read by the next op alone (and by the gradient's op, whose other
// intermediates are read by the next op alone) are fused.
ir::Graph fuseTanhGelu(ir::Graph graph);

// Removes a copy_ into a temporary (what .contiguous() and reshape record)
// whose readers can read its source instead: each reads the same elements
// through a view of the source's buffer, composed from its view of the copy.
// Only when nothing writes the source until the last reader has run, and each
// view of the copy steps along single dimensions of it (a transposed or sliced
// view of a permuted source qualifies; a flattening of it does not).
ir::Graph forwardCopies(ir::Graph graph);

// Chooses the layout of each 2-D convolution's tensors (forward and
// backward): channels-last, which oneDNN runs faster than NCHW, where that is
// safe, NCHW otherwise. The runtime then keeps the temporaries that follow a
// channels-last convolution in that layout (see
// compiler::Executable::flexible_layout), so a chain converts once.
ir::Graph planLayouts(ir::Graph graph);

// Runs aten::bernoulli_.float (dropout's mask) as poptorch::bernoulli_
// (csrc/kernels/bernoulli.cpp): the same distribution from a counter-based
// generator keyed by the node's seed, vectorised and split over threads,
// where PyTorch's CPU kernel draws element by element on one thread. The
// values differ from aten's for the same seed; the ipu's random values are
// its own (docs/user_guide.md, "Random numbers").
ir::Graph useCounterBasedRandomFills(ir::Graph graph);

// Runs float32 ops that poptorch has a kernel of its own for (csrc/kernels,
// the same arguments and results) with that kernel:
// - aten::tanh as poptorch::tanh: SLEEF's vectorised 3.5-ulp tanhf instead of
//   the CPU's MKL vsTanh, which runs a slow generic path on AMD CPUs. Values
//   within float32's tolerance of the CPU's, not bit-identical.
// - aten::max_pool2d_with_indices and its backward as poptorch's: 2x2 windows
//   with stride 2 over NCHW tensors vectorised, where the CPU's NCHW kernel is
//   a scalar loop. Values and indices bit for bit the CPU's; other poolings
//   run the CPU's kernels.
// - aten::_safe_softmax (attention's math path) as poptorch::_safe_softmax:
//   aten's softmax kernel and a scan for rows of -inf alone, where aten runs
//   four kernels (softmax, == -inf, a scalar `all`, `where`). Bit for bit.
// - aten::convolution and its backward as poptorch's where the convolution
//   is narrow (kernels::isNarrowConvolution: fewer than 16 channels in and
//   out, unit stride and dilation, planned NCHW): an im2col per image and
//   MKL's GEMM, where oneDNN's NCHW kernels for so few channels are generic
//   loops. Values within float32 rounding of the CPU's (sums in another
//   order); other convolutions stay oneDNN's.
ir::Graph useOwnKernels(ir::Graph graph);

}  // namespace poptorch::passes
