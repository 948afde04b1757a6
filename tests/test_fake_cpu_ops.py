"""Which ops capture infers on fake CPU tensors (poptorch._fake_cpu), checked against PyTorch.

Capture runs an op's Meta kernel on meta tensors, which have no device. The Python Meta
kernels that decide a result's shape, layout or checks by the device answer for CUDA there,
so they run on FakeTensor's CPU tensors instead (the list in poptorch._fake_cpu), or capture
corrects their answer in C++ (capture/cpu_alignment.cpp). These tests read PyTorch's own
kernels, so that a PyTorch with another device-dependent kernel fails here rather than give
an ipu result the CPU's layout does not have.
"""
import functools
import sys
import types
from typing import Callable, Dict, Iterator, Set

import pytest
import torch
from torch._decomp import decomposition_table, global_decomposition_table, meta_table
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import torch_decomp_decompositions

from conftest import run_python
from poptorch import _fake_cpu

_KERNEL_MODULES = ("torch._meta_registrations", "torch._refs", "torch._prims",
                   "torch._prims_common", "torch._decomp")

# Functions that ask for the device but answer on a meta tensor as for the CPU.
_AS_FOR_THE_CPU = {
    # handle_noncontiguous_outputs: only the HPU differs; calc_conv_nd_return_shape: only
    # cuDNN allows empty outputs; the flash attention kernel: XPU and ROCm only.
    "torch._refs.handle_noncontiguous_outputs",
    "torch._meta_registrations.calc_conv_nd_return_shape",
    "torch._meta_registrations.meta__scaled_dot_product_flash_attention",
    # Decompositions that FakeTensor runs with devices reporting the CPU: CUDA-only
    # branches (is_cuda, 32-bit indices, CUDA's channels-last choice), a same-device check,
    # the CPU-scalar test.
    "torch._decomp.decompositions.log_sigmoid_forward",
    "torch._decomp.decompositions._addmm_activation",
    "torch._decomp.decompositions._grid_sampler_2d",
    "torch._decomp.decompositions._upsample_nearest",
    "torch._decomp.decompositions._upsample_linear",
    "torch._decomp.decompositions._index_add",
    "torch._prims_common.wrappers.is_cpu_scalar",
}

# Ops whose device-dependent answer capture corrects in C++ (cpu_alignment.cpp:
# correctForCpu): convolutions' memory format, batch and layer norm's saved statistics.
_CORRECTED_IN_CPP = {
    "aten::convolution", "aten::convolution_backward", "aten::native_batch_norm",
    "aten::native_batch_norm.out", "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit.no_stats", "aten::_batch_norm_with_update",
    "aten::native_layer_norm",
}

# Ops with a FakeTensor rule of their own that capture never infers on meta tensors (the
# ipu's own kernels, ops whose output shape depends on the data) or whose rule answers as
# the Meta kernel does for tensors of one device (factories: the device becomes meta, as
# capture's twins do).
_FAKE_RULE_NOT_NEEDED = {
    "aten::_local_scalar_dense", "aten::empty_like", "aten::nonzero", "aten::nonzero.out",
    "aten::repeat_interleave.Tensor", "aten::_make_dep_token", "aten::tril_indices",
    "aten::triu_indices",
}


def _op(name: str) -> torch._ops.OpOverload:
    namespace, qualified = name.split("::")
    base, _, overload = qualified.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")


def _inferred_ops() -> Dict[str, torch._ops.OpOverload]:
    """The ops with a Python Meta kernel that capture runs: neither a composite kernel at
    the ipu's dispatch key (it decomposes them first) nor a structured one (it answers)."""
    import torch._meta_registrations as registrations

    ops = {}
    for impl in registrations._meta_lib_dont_use_me_use_register_meta._op_impls:
        namespace, qualified, _ = impl.split("/")
        name = f"{namespace}::{qualified}"
        table = torch._C._dispatch_dump_table(name)
        ipu = next(line for line in table.splitlines() if line.startswith("IPU:"))
        if "Composite" in ipu or torch._C._dispatch_has_kernel_for_dispatch_key(
                name, "CompositeExplicitAutogradNonFunctional"):
            continue
        if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, "CPU"):
            continue  # refused on the ipu: no host kernel
        ops[name] = _op(name)
    return ops


def _kernel(op: torch._ops.OpOverload) -> Callable:
    """The Python Meta kernel PyTorch registers for `op` (torch._meta_registrations'
    activate_meta: the meta table first, then the decompositions)."""
    for kind in ("meta", "post_autograd", "pre_autograd"):
        if op in global_decomposition_table[kind]:
            return global_decomposition_table[kind][op]
    raise AssertionError(f"no Python Meta kernel for {op}")


def _code_names(code: types.CodeType) -> Set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _code_names(constant)
    return names


def _reached(kernel: Callable) -> Iterator[types.FunctionType]:
    """The functions of PyTorch's kernel modules that `kernel` may call, by name."""
    pending, seen = [kernel], set()
    while pending:
        f = pending.pop()
        if isinstance(f, functools.partial):
            f = f.func
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        yield f
        candidates = [getattr(f, "__wrapped__", None)]
        for cell in f.__closure__ or ():
            try:
                candidates.append(cell.cell_contents)
            except ValueError:
                pass
        candidates += [f.__globals__.get(name) for name in _code_names(f.__code__)]
        pending += [c for c in candidates if isinstance(c, (types.FunctionType, functools.partial))
                    and (getattr(c, "__module__", None) or "").startswith(_KERNEL_MODULES)]


def _asks_for_the_device(f: types.FunctionType, runs_with_cpu_devices: bool) -> bool:
    names = _code_names(f.__code__)
    if names & {"device_hint", "fake_device"}:
        return True
    # FakeTensor runs decompositions outside its kernel invocation, where a tensor's
    # device is the CPU (inside, as on a meta tensor, it is meta).
    return runs_with_cpu_devices and ({"device", "type"} <= names
                                      or bool(names & {"is_cuda", "is_cpu", "is_xpu"}))


def _device_dependent(name: str, op: torch._ops.OpOverload) -> bool:
    in_decomposition_leg = (op not in meta_table and op in decomposition_table
                            and torch_decomp_decompositions(op))
    return any(_asks_for_the_device(f, in_decomposition_leg)
               and f"{f.__module__}.{f.__qualname__}" not in _AS_FOR_THE_CPU
               for f in _reached(_kernel(op)))


def _has_fake_rule(op: torch._ops.OpOverload) -> bool:
    return any(check(op) for check, _ in fake_impls.op_implementations_checks)


def test_every_device_dependent_meta_kernel_is_inferred_on_the_cpu_or_corrected():
    listed = set(_fake_cpu.device_dependent_ops())
    handled = listed | _CORRECTED_IN_CPP
    missing = sorted(name for name, op in _inferred_ops().items()
                     if name not in handled and _device_dependent(name, op))
    assert not missing, f"device-dependent Meta kernels neither listed nor corrected: {missing}"


def test_every_fake_tensor_rule_is_used_or_not_needed():
    handled = set(_fake_cpu.device_dependent_ops()) | _CORRECTED_IN_CPP | _FAKE_RULE_NOT_NEEDED
    missing = sorted(name for name, op in _inferred_ops().items()
                     if name not in handled and _has_fake_rule(op))
    assert not missing, f"ops with a FakeTensor rule of their own, not reviewed: {missing}"


@pytest.mark.parametrize("name", _fake_cpu.device_dependent_ops())
def test_each_listed_op_is_one_capture_infers(name):
    assert name in _inferred_ops(), f"{name}: no Python Meta kernel capture would run"


# Lazy mode's first ops (a model's forward and backward, convolutions, batch norm) import
# neither torch._dynamo nor torch._inductor. (Making a torch.optim optimizer imports
# torch._dynamo, on the CPU too: Optimizer.add_param_group is wrapped by
# torch._disable_dynamo.)
FIRST_OPS = """
import sys, torch, poptorch
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(16 * 6 * 6, 10)).to("ipu")
x, y = torch.randn(4, 3, 8, 8, device="ipu"), torch.randint(0, 10, (4,), device="ipu")
torch.nn.functional.cross_entropy(model(x), y).backward()
with torch.no_grad():
    for p in model.parameters():
        p -= 0.1 * p.grad
model.eval()
with torch.no_grad():
    model(x).cpu()
assert poptorch.metrics()["fallback_ops"] == {}, poptorch.metrics()["fallback_ops"]
print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules))
"""


def test_first_ops_do_not_import_dynamo():
    result = run_python(FIRST_OPS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
