// How a CPU kernel's argument checks see a float argument: the class of values
// they cannot tell apart. The checks at the call (checkAsCpuKernelOnce in
// meta_inference.cpp) run once per signature in which a float counts only by
// its class, so that a value that changes at every step (a learning rate,
// Adam's bias corrections) is not checked again, while one that a check could
// judge differently is.
#pragma once

#include <cstdint>

namespace poptorch::capture {

// nan, -inf, negative, 0, between 0 and 1, 1, above 1, +inf: what a probability,
// a standard deviation or a rate is checked against.
int64_t signClass(double x);

// Where `x` lies among the range limits of PyTorch's dtypes: a Scalar converted
// to a tensor's dtype is refused beyond them (c10::checked_convert: fill_ of a
// half tensor with 1e5, full(300.0, dtype=int8)), and uniform_ refuses a
// `to - from` beyond its dtype's maximum. 2i when `x` lies between the limits
// i - 1 and i, 2i + 1 when it is limit i; -1 for nan.
int64_t rangeClass(double x);

}  // namespace poptorch::capture
