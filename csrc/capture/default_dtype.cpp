#include "capture/default_dtype.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DefaultDtype.h>

#include <algorithm>
#include <string>

#include "capture/op_traits.h"
#include "device/ipu_tensor.h"

namespace poptorch::capture {
namespace {

constexpr size_t kMaxArguments = 64;  // one bit each

// A tensor of another dtype that type promotion sees as it sees `t`: a Python
// number PyTorch wrapped keeps its own category.
bool isWrappedNumber(const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); }

// The arguments the kernel would cast from an integer dtype to the default
// one: integer and bool tensors it reads (bits of `integers`, of which bools
// in `bools`), when no floating-point tensor or explicit dtype decides the
// computation's dtype, and a floating-point result says that the default
// does (or, for a pointwise op, whose tensors are all operands, a Python
// float: `a > 0.5` compares in the default dtype). False if the op cannot
// read the default dtype so. The tensors an op writes are never cast: an
// out= tensor's dtype does not decide (div(a, b, out=) of integers computes
// in the default dtype), an in-place op's self does (copy_ of an integer
// tensor into a float one).
bool integerInputs(const OpTraits& traits, c10::ArrayRef<c10::IValue> arguments,
                   const MetaResult& result, uint64_t* integers, uint64_t* bools) {
  bool python_float = false;
  for (size_t i = 0; i < arguments.size() && i < traits.args.size(); ++i) {
    const c10::IValue& value = arguments[i];
    if (traits.args[i].scalar_type && !value.isNone()) return false;  // an explicit dtype
    if (traits.args[i].is_out) continue;
    if (value.isDouble()) python_float = true;
    if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) {
        if (t.defined() && !c10::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
          return false;
        }
      }
    }
    if (!value.isTensor() || !value.toTensor().defined()) continue;
    const at::Tensor& t = value.toTensor();
    if (isWrappedNumber(t)) {
      python_float = python_float || c10::isFloatingType(t.scalar_type());
      continue;
    }
    if (!c10::isIntegralType(t.scalar_type(), /*includeBool=*/true)) return false;
    if (traits.args[i].writes || i >= kMaxArguments) continue;
    *integers |= uint64_t{1} << i;
    if (t.scalar_type() == c10::ScalarType::Bool) *bools |= uint64_t{1} << i;
  }
  if (*integers == 0) return false;
  auto floating = [](const std::vector<Layout>& layouts) {
    for (const Layout& layout : layouts) {
      if (layout.defined && c10::isFloatingType(layout.dtype)) return true;
    }
    return false;
  };
  bool floating_result = false;
  for (const ReturnInfo& info : result.returns) floating_result |= floating(info.tensors);
  return floating_result || (python_float && traits.pointwise);
}

// `arguments` with each one that `casts` names replaced by `cast` of its tensor.
template <typename Cast>
std::vector<c10::IValue> withCasts(c10::ArrayRef<c10::IValue> arguments,
                                   const DefaultDtypeCasts& casts, const Cast& cast) {
  std::vector<c10::IValue> result(arguments.begin(), arguments.end());
  for (size_t i = 0; i < result.size() && i < kMaxArguments; ++i) {
    if (casts.arguments >> i & 1) result[i] = cast(arguments[i].toTensor());
  }
  return result;
}

// What the ipu tensors of `arguments` look like to a Meta kernel, with the
// casts applied as `Tensor.to` would (its strides).
std::vector<c10::IValue> castMetaTwins(c10::ArrayRef<c10::IValue> arguments,
                                       const DefaultDtypeCasts& casts) {
  return withCasts(arguments, casts, [&casts](const at::Tensor& t) {
    const c10::Device device = t.is_ipu() ? c10::Device(c10::kMeta) : t.device();
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(device)).to(casts.dtype);
  });
}

// True if one of `arguments` is a Python float.
bool anyPythonFloat(c10::ArrayRef<c10::IValue> arguments) {
  return std::any_of(arguments.begin(), arguments.end(), [](const c10::IValue& value) {
    return value.isDouble() ||
           (value.isTensor() && value.toTensor().defined() && isWrappedNumber(value.toTensor()) &&
            c10::isFloatingType(value.toTensor().scalar_type()));
  });
}

// True if an out= call of `op` computes in an integer dtype although its
// floating-point out= tensors made `result` floating: the kernel computes in
// the dtype its inputs give, then converts into out=, so sub(a, b, out=f) of
// uint8 tensors computes 5 - 8 in uint8 (253), where a cast of a and b gives
// -3. An op that takes out= tensors of its integer inputs' promoted dtype
// computes in it (TensorIterator refuses to convert a floating-point
// computation into an integer out=); div(a, b, out=) does not. A pointwise op
// with a Python float computes in the default dtype whatever out= takes
// (gt(a, 0.5, out=) compares in it).
bool computesInIntegers(const c10::OperatorHandle& op, const OpTraits& traits,
                        c10::ArrayRef<c10::IValue> arguments, uint64_t integers,
                        const MetaRunner& infer) {
  std::optional<c10::ScalarType> inputs;
  uint64_t floating_outs = 0;
  for (size_t i = 0; i < arguments.size() && i < traits.args.size() && i < kMaxArguments; ++i) {
    if (integers >> i & 1) {
      const c10::ScalarType dtype = arguments[i].toTensor().scalar_type();
      inputs = inputs ? c10::promoteTypes(*inputs, dtype) : dtype;
    } else if (traits.args[i].is_out && arguments[i].isTensor() &&
               arguments[i].toTensor().defined() &&
               c10::isFloatingType(arguments[i].toTensor().scalar_type())) {
      floating_outs |= uint64_t{1} << i;
    }
  }
  if (!inputs || floating_outs == 0 || (traits.pointwise && anyPythonFloat(arguments))) {
    return false;
  }
  std::vector<c10::IValue> probe(arguments.begin(), arguments.end());
  for (size_t i = 0; i < probe.size() && i < kMaxArguments; ++i) {
    if (!(floating_outs >> i & 1)) continue;
    const at::Tensor& out = arguments[i].toTensor();
    probe[i] = at::empty_strided(out.sizes(), out.strides(),
                                 out.options().device(c10::kMeta).dtype(*inputs));
  }
  return infer(op, probe).has_value();
}

// The casts of a call of `op` itself (see defaultDtypeCasts).
DefaultDtypeCasts castsOfTheOp(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                               const MetaResult& result, const MetaRunner& infer) {
  uint64_t integers = 0;
  uint64_t bools = 0;
  const OpTraits& traits = traitsOf(op);
  if (!integerInputs(traits, arguments, result, &integers, &bools) ||
      computesInIntegers(op, traits, arguments, integers, infer)) {
    return {};
  }
  const c10::ScalarType dtype = c10::typeMetaToScalarType(c10::get_default_dtype());
  // Bool tensors too (`mask / 2`), unless the op takes them as conditions
  // (where(mask, a, 0.5)), which a cast breaks.
  for (uint64_t candidate : {integers, integers & ~bools}) {
    if (candidate == 0) continue;
    const DefaultDtypeCasts casts{candidate, dtype};
    const std::optional<MetaResult> cast = infer(op, castMetaTwins(arguments, casts));
    if (cast && sameResults(*cast, result)) return casts;
  }
  return {};
}

// The out-of-place op of an in-place one that writes its first argument and
// returns it (lt_.Scalar: lt.Scalar), with the same arguments otherwise.
std::optional<c10::OperatorHandle> outOfPlaceTwin(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  const std::string& name = schema.name();
  const c10::AliasInfo* self =
      schema.arguments().empty() ? nullptr : schema.arguments()[0].alias_info();
  if (name.size() < 2 || name.back() != '_' || !self || !self->isWrite() ||
      schema.returns().size() != 1) {
    return std::nullopt;
  }
  std::optional<c10::OperatorHandle> twin = c10::Dispatcher::singleton().findOp(
      c10::OperatorName(name.substr(0, name.size() - 1), schema.overload_name()));
  if (!twin || !twin->hasSchema()) return std::nullopt;
  const c10::FunctionSchema& twin_schema = twin->schema();
  if (twin_schema.is_mutable() || twin_schema.returns().size() != 1 ||
      twin_schema.returns()[0].alias_info() != nullptr ||
      twin_schema.arguments().size() != schema.arguments().size()) {
    return std::nullopt;
  }
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    if (*twin_schema.arguments()[i].type() != *schema.arguments()[i].type()) return std::nullopt;
  }
  return twin;
}

// The casts of an in-place call on an integer (or bool) tensor through its
// out-of-place twin, when the twin casts that tensor. Its result, of the
// tensor's shape, then goes into the tensor as the in-place kernel's would:
// computed in the default dtype, converted to the tensor's. Only a Python
// float can make such a call compute in the default dtype (a floating-point
// tensor decides the dtype itself, and a floating-point function of an
// integer tensor cannot write it), so calls without one are not examined.
DefaultDtypeCasts castsOfTheTwin(const c10::OperatorHandle& op,
                                 c10::ArrayRef<c10::IValue> arguments, const MetaRunner& infer) {
  if (arguments.empty() || !arguments[0].isTensor() || !anyPythonFloat(arguments)) return {};
  const at::Tensor& self = arguments[0].toTensor();
  if (!self.defined() || !c10::isIntegralType(self.scalar_type(), /*includeBool=*/true)) return {};
  std::optional<c10::OperatorHandle> twin = outOfPlaceTwin(op);
  if (!twin) return {};
  const std::optional<MetaResult> twin_result = infer(*twin, arguments);
  if (!twin_result || twin_result->returns.size() != 1 || twin_result->returns[0].is_list ||
      twin_result->returns[0].tensors.size() != 1 ||
      !self.sizes().equals(twin_result->returns[0].tensors[0].sizes)) {
    return {};
  }
  DefaultDtypeCasts casts = castsOfTheOp(*twin, arguments, *twin_result, infer);
  if (!(casts.arguments & 1)) return {};
  casts.out_of_place = std::move(twin);
  return casts;
}

}  // namespace

bool sameResults(const MetaResult& a, const MetaResult& b) {
  // Storage numbers are left out: they number the arguments' storages, and the
  // casts put new tensors among the arguments.
  auto same = [](std::vector<Layout> x, std::vector<Layout> y) {
    for (Layout& layout : x) layout.storage = -1;
    for (Layout& layout : y) layout.storage = -1;
    return x == y;
  };
  if (a.returns.size() != b.returns.size() || a.written.size() != b.written.size()) return false;
  for (size_t r = 0; r < a.returns.size(); ++r) {
    if (a.returns[r].is_list != b.returns[r].is_list ||
        !same(a.returns[r].tensors, b.returns[r].tensors)) {
      return false;
    }
  }
  for (size_t w = 0; w < a.written.size(); ++w) {
    if (!same(a.written[w], b.written[w])) return false;
  }
  return true;
}

DefaultDtypeCasts defaultDtypeCasts(const c10::OperatorHandle& op,
                                    c10::ArrayRef<c10::IValue> arguments, const MetaResult& result,
                                    const MetaRunner& infer) {
  DefaultDtypeCasts casts = castsOfTheOp(op, arguments, result, infer);
  if (!casts.any()) casts = castsOfTheTwin(op, arguments, infer);
  // A float64 default would make the op compute in float64. Refused here, at
  // the call, and not as a TypeError (which making a float64 tensor raises, as
  // on MPS): Python's operators turn a TypeError into NotImplemented, so
  // `a > 0.5` said "'>' not supported" and `a == 0.5` compared identities (False).
  TORCH_CHECK(!casts.any() || !device::isUnsupportedDtype(casts.dtype),
              device::unsupportedDtypeMessage(casts.dtype));
  return casts;
}

std::vector<c10::IValue> castArguments(c10::ArrayRef<c10::IValue> arguments,
                                       const DefaultDtypeCasts& casts) {
  return withCasts(arguments, casts, [&casts](const at::Tensor& t) { return t.to(casts.dtype); });
}

}  // namespace poptorch::capture
