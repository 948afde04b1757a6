// Creating ipu tensors: strided TensorImpls over lazy ipu storages.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace poptorch::device {

// Throws a TypeError for dtypes an IPU cannot hold (64-bit floating point), unless
// `scalar` (a 0-dim tensor) and this thread allows float64 scalars, or the autograd
// engine is applying one of PyTorch's derivative formulas (whose own float64 it is), or
// a Float64Intermediates lives.
void checkSupportedDtype(c10::ScalarType dtype, bool scalar = false);

// True for the dtypes an IPU cannot hold; why, and what to do (the message of
// checkSupportedDtype's error).
bool isUnsupportedDtype(c10::ScalarType dtype);
std::string unsupportedDtypeMessage(c10::ScalarType dtype);

// Whether this thread may make 0-dim float64 ipu tensors; returns the previous setting.
// Only torch.amp.GradScaler needs them: it computes its inverse scale as
// scale.double().reciprocal().float() (poptorch/_grad_scaler.py).
bool setFloat64ScalarsAllowed(bool allowed);

// While one lives, this thread may make float64 ipu tensors of any shape: an op's
// kernel computes intermediates in float64 for float32 inputs on the CPU, and its
// results are not float64 (linalg.pinv's and linalg.matrix_rank's tolerances; see
// capture/float64_intermediates.cpp). The user never holds one.
class Float64Intermediates {
 public:
  Float64Intermediates();
  ~Float64Intermediates();
  Float64Intermediates(const Float64Intermediates&) = delete;
  Float64Intermediates& operator=(const Float64Intermediates&) = delete;

 private:
  bool previous_;
};

// A new ipu tensor with the given layout whose bytes are reserved on ipu:index
// but not yet computed.
at::Tensor emptyIpuTensor(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                          int index, int64_t storage_offset = 0);

// An ipu tensor on `storage` with the given view metadata (no new bytes).
at::Tensor ipuView(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                   int64_t storage_offset, c10::ScalarType dtype);

// A materialised ipu copy of a host tensor (contiguous, same dtype).
at::Tensor uploadToIpu(const at::Tensor& host, int index);

}  // namespace poptorch::device
