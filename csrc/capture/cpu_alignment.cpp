#include "capture/cpu_alignment.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/accumulate.h>

#include <string>
#include <vector>

namespace poptorch::capture {

namespace {

// A bfloat16 meta twin of `t` whose strides (but for unit strides) are
// multiples of 16 bytes.
at::Tensor alignedBFloat16(const at::Tensor& t) {
  std::vector<int64_t> strides = t.strides().vec();
  for (int64_t& stride : strides) stride = stride == 1 ? 1 : 8 * stride;
  return at::empty_strided(t.sizes(), strides, t.options().dtype(at::kBFloat16));
}

}  // namespace

// Arguments on which a PyTorch Meta kernel disagrees with the CPU kernel,
// rewritten to ones that mean the same to the CPU. nansum (and nanmean, built
// on it) reduces over every dim for an empty dim list on the CPU, but its Meta
// kernel (meta_nansum in torch/_meta_registrations.py) reduces over none.
// _grouped_mm's Meta kernel checks CUDA's rules: bfloat16 only, where the CPU
// takes float32 and float16 too (its result is then the inputs' dtype,
// correctForCpu): it is given aligned bfloat16 twins of the same sizes, and no
// out_dtype. The CPU kernel's own checks (dtypes, 16-byte strides, out_dtype
// the inputs') come from its run at the call (cpu_checks.h).
void alignWithCpuKernel(const c10::OperatorHandle& op, torch::jit::Stack& meta_args) {
  const std::string& name = op.schema().name();
  if (name == "aten::nansum" && meta_args.size() > 1 && meta_args[1].isIntList() &&
      meta_args[1].toIntList().empty()) {
    meta_args[1] = c10::IValue();
  }
  if (name == "aten::_grouped_mm" && meta_args.size() == 5 && meta_args[0].isTensor() &&
      meta_args[1].isTensor()) {
    meta_args[0] = alignedBFloat16(meta_args[0].toTensor());
    meta_args[1] = alignedBFloat16(meta_args[1].toTensor());
    meta_args[4] = c10::IValue();
  }
}

// An out= tensor that a pointwise (TensorIterator) kernel resizes takes on the
// CPU the layout TensorIterator gives the result: its inputs' order of
// strides (a transposed input, a transposed result). Python Meta kernels
// restride it to a memory format instead (contiguous, or channels-last).
void restrideResizedOut(c10::ArrayRef<c10::IValue> arguments, const at::Tensor& out,
                        Layout& layout) {
  if (out.sizes().equals(layout.sizes)) return;  // not resized: the layout stays
  at::TensorIteratorConfig config;
  config.promote_inputs_to_common_dtype(true).set_check_mem_overlap(false);
  config.add_owned_output(at::Tensor());
  bool any_input = false;
  for (const c10::IValue& value : arguments) {
    if (!value.isTensor() || value.toTensor().is_same(out)) continue;
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || !t.is_ipu()) continue;  // host scalars do not order strides
    config.add_owned_const_input(
        at::detail::empty_strided_meta(t.sizes(), t.strides(), t.options().device(c10::kMeta)));
    any_input = true;
  }
  if (!any_input) return;
  try {
    const at::TensorIterator iter = config.build();
    const at::Tensor& result = iter.output();
    if (result.sizes().equals(layout.sizes)) {
      layout.strides.assign(result.strides().begin(), result.strides().end());
    }
  } catch (const c10::Error&) {
    // Not TensorIterator's kind of arguments: the Meta kernel's layout stands.
  }
}

namespace {

Layout contiguousLayout(c10::ScalarType dtype, c10::IntArrayRef sizes) {
  Layout layout;
  layout.dtype = dtype;
  layout.sizes.assign(sizes.begin(), sizes.end());
  const c10::DimVector strides = c10::contiguous_strides(sizes);
  layout.strides.assign(strides.begin(), strides.end());
  return layout;
}

// A CPU tensor with `t`'s metadata and no data, for PyTorch's functions that
// decide by metadata and device alone.
at::Tensor dataless(const at::Tensor& t) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       c10::DataPtr(nullptr, c10::Device(c10::kCPU)), nullptr, false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

c10::SymIntArrayRef symInts(const std::vector<int64_t>& values) {
  return c10::fromIntArrayRefSlow(values);
}

// The memory format the CPU gives convolution's result, and the input and
// weight gradients of its backward: its backend's for these arguments (oneDNN
// keeps channels-last, the other CPU backends mostly not), decided as
// FakeTensor decides it for CPU tensors (torch/_subclasses/fake_impls.py:
// conv). The Meta kernel cannot: it leaves every result contiguous. `first` is
// the index of the input among the arguments, followed by the weight and the
// bias (convolution) or the bias sizes (convolution_backward), then stride,
// padding, dilation, transposed, output padding and groups.
c10::MemoryFormat convolutionFormat(c10::ArrayRef<c10::IValue> arguments, size_t first,
                                    bool backward) {
  const at::Tensor weight = dataless(arguments[first + 1].toTensor());
  // PyTorch runs a 1-D convolution as a 2-D one with a unit height, on its
  // input made contiguous (select_conv_backend copies it): the copy, as these
  // tensors have no data to copy.
  const at::Tensor& ipu_input = arguments[first].toTensor();
  const at::Tensor input = dataless(
      weight.dim() == 3 ? at::empty(ipu_input.sizes(), ipu_input.options().device(c10::kMeta))
                        : ipu_input);
  const c10::IValue& third = arguments[first + 2];
  std::optional<at::Tensor> bias;
  std::optional<std::vector<int64_t>> bias_sizes;
  if (!backward && third.isTensor() && third.toTensor().defined()) {
    bias = dataless(third.toTensor());
  } else if (backward && third.isIntList()) {
    bias_sizes = third.toIntVector();
  }
  const std::vector<int64_t> stride = arguments[first + 3].toIntVector();
  const std::vector<int64_t> padding = arguments[first + 4].toIntVector();
  const std::vector<int64_t> dilation = arguments[first + 5].toIntVector();
  const std::vector<int64_t> output_padding = arguments[first + 7].toIntVector();
  const at::native::ConvBackend backend = at::native::select_conv_backend(
      input, weight, bias, symInts(stride), symInts(padding), symInts(dilation),
      arguments[first + 6].toBool(), symInts(output_padding), arguments[first + 8].toInt(),
      bias_sizes ? at::OptionalSymIntArrayRef(symInts(*bias_sizes)) : at::OptionalSymIntArrayRef());
  if (weight.dim() != 3) {
    return at::native::_determine_backend_memory_format(input, weight, backend);
  }
  return at::native::_determine_backend_memory_format(input.unsqueeze(2), weight.unsqueeze(2),
                                                      backend);
}

// `layout` as the result of `.to(memory_format=format)` (a 1-D convolution's
// three-dimensional results through a unit height) leaves it.
void toFormat(Layout& layout, c10::MemoryFormat format) {
  if (!layout.defined) return;
  at::Tensor t = at::empty_strided(layout.sizes, layout.strides,
                                   at::TensorOptions().dtype(layout.dtype).device(c10::kMeta));
  auto to = [format](const at::Tensor& x) { return x.to(x.options(), false, false, format); };
  t = t.dim() == 3 && format == c10::MemoryFormat::ChannelsLast ? to(t.unsqueeze(2)).squeeze(2)
                                                                : to(t);
  layout.strides.assign(t.strides().begin(), t.strides().end());
}

// Convolution's results in the CPU's memory format (convolutionFormat).
void correctConvolution(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                        MetaResult& result) {
  const bool backward = op.operator_name().name == "aten::convolution_backward";
  c10::MemoryFormat format;
  try {
    format = convolutionFormat(arguments, backward ? 1 : 0, backward);
  } catch (const c10::Error&) {
    return;  // arguments the CPU refuses: its run at the call raises the error
  }
  toFormat(result.returns[0].tensors[0], format);
  if (backward) toFormat(result.returns[1].tensors[0], format);
}

// ldexp's Meta kernel is its Python decomposition, which raises a float32 2
// for an integral or bool input, where the CPU kernel raises the Python scalar
// 2.0, whose power takes a floating exponent's dtype: an int32 tensor times
// 2 ** a 0-dim float16 tensor is float16 on the CPU, float32 on Meta. The
// dtype of the CPU kernel's result (BinaryOps.cpp: ldexp and its _pow2).
at::ScalarType ldexpDtype(const at::Tensor& self, const at::Tensor& other) {
  const at::ScalarType self_type = self.scalar_type();
  if (c10::isIntegralType(other.scalar_type(), /*includeBool=*/true) &&
      c10::isFloatingType(self_type)) {
    return self_type;  // std::ldexp into a tensor like self
  }
  auto meta = [](c10::IntArrayRef sizes, at::ScalarType type) {
    return at::empty(sizes, at::TensorOptions().dtype(type).device(c10::kMeta));
  };
  at::native::ResultTypeState power{};
  power = c10::isIntegralType(self_type, /*includeBool=*/true) || self_type == at::kFloat
              ? at::native::update_result_type_state(c10::Scalar(2.0), power)
              : at::native::update_result_type_state(meta({}, self_type), power);
  power = at::native::update_result_type_state(meta(other.sizes(), other.scalar_type()), power);
  at::native::ResultTypeState product{};
  product = at::native::update_result_type_state(meta(self.sizes(), self_type), product);
  product = at::native::update_result_type_state(
      meta(other.sizes(), at::native::result_type(power)), product);
  return at::native::result_type(product);
}

}  // namespace

// Where PyTorch's Meta kernel (2.13) disagrees with its CPU kernel, even on
// fake CPU tensors: the CPU's answer.
void correctForCpu(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                   MetaResult& result) {
  const std::string& name = op.operator_name().name;
  if (name == "aten::native_batch_norm" && op.operator_name().overload_name == "out" &&
      !arguments[5].toBool()) {
    // (input, weight, bias, running_mean, running_var, training, momentum,
    //  eps, out, save_mean, save_invstd.) Out of training, the CPU kernel
    // leaves the saved statistics as they are (their Meta kernel resizes
    // them to 0 elements).
    for (size_t i : {size_t{9}, size_t{10}}) {
      result.written[i][0] = layoutOf(arguments[i].toTensor(), -1);
      Layout& returned = result.returns[i - 8].tensors[0];
      returned = layoutOf(arguments[i].toTensor(), returned.storage);
    }
  }
  if ((name == "aten::native_batch_norm" || name == "aten::_native_batch_norm_legit") &&
      op.operator_name().overload_name.empty() && !arguments[5].toBool()) {
    // (input, weight, bias, running_mean, running_var, training, ...). Out of
    // training, the CPU's saved statistics have no elements; the Meta kernel
    // (a decomposition that asks for the device) gives CUDA's.
    for (size_t i : {size_t{1}, size_t{2}}) {
      Layout& saved = result.returns[i].tensors[0];
      saved = contiguousLayout(saved.dtype, {0});
    }
  }
  if (name == "aten::convolution" || name == "aten::convolution_backward") {
    correctConvolution(op, arguments, result);
  }
  if ((name == "aten::native_batch_norm" || name == "aten::_native_batch_norm_legit" ||
       name == "aten::_native_batch_norm_legit_no_training" ||
       name == "aten::_batch_norm_with_update" || name == "aten::native_layer_norm") &&
      (arguments[0].toTensor().scalar_type() == at::kHalf ||
       arguments[0].toTensor().scalar_type() == at::kBFloat16)) {
    // Batch and layer norm's saved statistics (returns 1 and 2) are float32 for
    // a float16/bfloat16 input on CUDA (and Meta), but the CPU keeps the
    // input's dtype unless a parameter is float32 (its mixed-type kernel), and
    // its backward refuses saved statistics of another dtype. FakeTensor on
    // the CPU device does not know the mixed-type kernel either.
    const at::ScalarType input = arguments[0].toTensor().scalar_type();
    at::ScalarType statistics = input;
    for (const c10::IValue& parameter : arguments.slice(1)) {
      if (parameter.isTensor() && parameter.toTensor().defined() &&
          parameter.toTensor().scalar_type() == at::kFloat) {
        statistics = at::kFloat;  // the mixed-type kernel: float32 statistics
      }
    }
    for (size_t i = 1; i < result.returns.size() && i < 3; ++i) {
      for (Layout& layout : result.returns[i].tensors) layout.dtype = statistics;
    }
  } else if (name == "aten::native_batch_norm_backward") {
    // Its Python decomposition (the Meta kernel) computes grad_input whatever
    // output_mask says; the CPU kernel leaves a masked-out result undefined
    // (an input that does not require grad: batch norm as a model's first layer).
    const c10::List<bool> mask = arguments.back().toBoolList();
    for (size_t i = 0; i < mask.size() && i < result.returns.size(); ++i) {
      if (!mask[i] && !result.returns[i].tensors.empty()) {
        result.returns[i].tensors[0] = Layout{};
        result.returns[i].tensors[0].defined = false;
      }
    }
  } else if (name == "aten::_embedding_bag_forward_only" || name == "aten::_embedding_bag") {
    // (weight, indices, offsets, scale_grad_by_freq, mode, sparse,
    //  per_sample_weights, include_last_offset, padding_idx)
    constexpr int64_t kSum = 0;
    constexpr int64_t kMax = 2;
    const at::Tensor& weight = arguments[0].toTensor();
    const at::Tensor& offsets = arguments[2].toTensor();
    const int64_t mode = arguments[4].toInt();
    // The CPU's fast sum path, which leaves offset2bag empty, takes bfloat16
    // weights too.
    const bool scale_fast = arguments[6].isNone() || !arguments[6].toTensor().defined() ||
                            arguments[6].toTensor().stride(0) == 1;
    if (mode == kSum && weight.scalar_type() == c10::kBFloat16 && weight.stride(1) == 1 &&
        arguments[8].toInt() < 0 && scale_fast) {
      result.returns[1].tensors[0] = contiguousLayout(result.returns[1].tensors[0].dtype, {0});
    }
    // With include_last_offset, the forward-only kernel sizes bag_size like the
    // offsets only in sum mode (else one per bag), and max_indices like
    // bag_size but in max mode.
    if (name == "aten::_embedding_bag_forward_only" && arguments[7].toBool()) {
      const std::vector<int64_t> bags{offsets.size(0) - 1};
      Layout& bag_size = result.returns[2].tensors[0];
      bag_size = contiguousLayout(bag_size.dtype, mode == kSum ? offsets.sizes() : bags);
      if (mode != kMax) {
        result.returns[3].tensors[0] =
            contiguousLayout(result.returns[3].tensors[0].dtype, bag_size.sizes);
      }
    }
  } else if (name == "aten::ldexp" && op.operator_name().overload_name == "Tensor") {
    result.returns[0].tensors[0].dtype =
        ldexpDtype(arguments[0].toTensor(), arguments[1].toTensor());
  } else if (name == "aten::_grouped_mm") {
    // The CPU's result has the inputs' dtype (alignWithCpuKernel).
    result.returns[0].tensors[0].dtype = arguments[0].toTensor().scalar_type();
  } else if (name == "aten::max_unpool2d") {
    // The CPU gives a batched result the input's memory format.
    const at::Tensor& input = arguments[0].toTensor();
    Layout& output = result.returns[0].tensors[0];
    if (output.sizes.size() == 4 &&
        input.suggest_memory_format() == c10::MemoryFormat::ChannelsLast) {
      const std::vector<int64_t> strides = c10::get_channels_last_strides_2d(output.sizes);
      output.strides.assign(strides.begin(), strides.end());
    }
  } else if ((name == "aten::arange" || name == "aten::linspace" || name == "aten::logspace") &&
             !arguments.empty() && op.schema().arguments().back().is_out()) {
    // The CPU kernels write an out= tensor that holds the result's number of
    // elements as it is, whatever its shape (a narrowed view keeps its
    // strides); their Python Meta kernels resize it to 1-D.
    const at::Tensor& out = arguments.back().toTensor();
    Layout& returned = result.returns[0].tensors[0];
    if (out.numel() == c10::multiply_integers(returned.sizes)) {
      returned = layoutOf(out, returned.storage);
      result.written.back()[0] = layoutOf(out, -1);
    }
  } else if (name == "aten::sort" && op.operator_name().overload_name == "stable") {
    // Sort's C++ meta function gives both results self's strides when self is
    // dense (msort, argsort), but the structured path ends in the Python Meta
    // kernel of sort's out= form, which restrides them as empty_like's Python
    // Meta kernel does: other strides for dims of size 1, which steer later
    // ops on the CPU (matmul's path).
    const at::Tensor& self = arguments[0].toTensor();
    const std::vector<int64_t> strides =
        self.is_non_overlapping_and_dense() ? self.strides().vec()
                                            : at::infer_dense_strides(self.sizes(), self.strides());
    for (ReturnInfo& r : result.returns)
      r.tensors[0].strides.assign(strides.begin(), strides.end());
  }
}

}  // namespace poptorch::capture
