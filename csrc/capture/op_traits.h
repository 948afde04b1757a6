// What capture needs to know of an operator's schema, worked out once per
// operator: type tests on a schema (subtype checks, alias sets, tag lookups)
// cost more than the rest of capturing a small op, which repeats them at every
// call.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace poptorch::capture {

struct ArgTraits {
  bool optional_tensor_list = false;  // Tensor?[] (index lists), not Tensor[]
  bool runtime_number = false;        // a float or Scalar: data, not structure
  bool writes = false;                // its alias annotation says the op writes it
  bool is_out = false;                // an out= argument
  bool scalar_type = false;           // a ScalarType (passed as an int)
};

// Arguments an op writes although its schema does not say so (PyTorch keeps
// these schemas for compatibility).
enum class UnannotatedWrites : uint8_t {
  kNone,
  kBatchNorm,             // native_batch_norm, training: running mean and var
  kBatchNormUpdateStats,  // batch_norm_update_stats: running mean and var
};

struct OpTraits {
  explicit OpTraits(c10::OperatorName op_name) : name(std::move(op_name)) {}

  c10::OperatorName name;
  std::vector<ArgTraits> args;  // one per schema argument
  size_t tensor_args = 0;       // Tensor and Tensor? arguments (a node's inputs but lists')
  bool pointwise = false;
  bool any_optional_tensor_list = false;
  int32_t generator_arg = -1;  // the Generator? argument, if any
  UnannotatedWrites unannotated_writes = UnannotatedWrites::kNone;
};

// The traits of `op`, from this thread's table (no lock).
const OpTraits& traitsOf(const c10::OperatorHandle& op);

// The traits of `op`, worked out now (for a caller that keeps them).
std::unique_ptr<OpTraits> computeTraits(const c10::OperatorHandle& op);

}  // namespace poptorch::capture
