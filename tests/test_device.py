"""The ipu is a PyTorch device like any other."""
import pytest
import torch

import poptorch
from conftest import assert_same, run_python


def test_factories_and_moves():
    x = torch.zeros(3, device="ipu")
    assert x.device == torch.device("ipu:0") and x.is_ipu
    assert torch.equal(x.cpu(), torch.zeros(3))
    y = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(y.to("ipu").cpu(), y)
    assert y.to("ipu:1").device == torch.device("ipu:1")
    assert torch.equal(y.to("ipu:1").to("ipu:0").cpu(), y)


HOST = torch.arange(6.0).reshape(2, 3) - 2.5

# Generic kernels re-run with a device argument: each must give the CPU's values on the
# device it names (ipu:1 where named), from a host or a pending ipu source.
MOVES = {
    "_to_copy": lambda s, d: torch.ops.aten._to_copy(s, device=d),
    "_to_copy with dtype": lambda s, d: torch.ops.aten._to_copy(s, dtype=torch.half, device=d),
    "to non_blocking": lambda s, d: s.to(d, non_blocking=True),
    "to a tensor": lambda s, d: s.to(torch.ones(1, dtype=torch.int32, device=d)),
    "to with memory_format": lambda s, d: s[None, None].to(d, memory_format=torch.channels_last),
    "copy_ non_blocking": lambda s, d: torch.zeros(2, 3, device=d).copy_(s, non_blocking=True),
    "empty_like, zeroed": lambda s, d: torch.empty_like(s, device=d).zero_(),
    "ones_like": lambda s, d: torch.ones_like(s, device=d),
    "full_like": lambda s, d: torch.full_like(s, 7, device=d),
    "new_zeros": lambda s, d: s.new_zeros((2, 2), device=d),
    "new_full": lambda s, d: s.new_full((2,), 4.0, device=d),
    "new_tensor": lambda s, d: s.new_tensor([1, 2], device=d),
    "as_tensor": lambda s, d: torch.as_tensor(s, device=d),
}


@pytest.mark.parametrize("target", ["ipu", "ipu:1"])
@pytest.mark.parametrize("pending", [False, True], ids=["host source", "pending ipu source"])
@pytest.mark.parametrize("move", MOVES.values(), ids=MOVES.keys())
def test_a_device_argument_gives_the_cpus_values_on_that_device(move, pending, target):
    source = HOST.to("ipu") * 1 if pending else HOST
    result = move(source, target)
    expected = move(HOST, "cpu")
    assert result.device == torch.device(target if ":" in target else "ipu:0")
    assert result.dtype == expected.dtype and result.stride() == expected.stride()
    torch.testing.assert_close(result.cpu(), expected)


class _MakesTensorsOn(torch.nn.Module):
    """Makes tensors on a device named in its code, as models written for one device do."""

    def __init__(self, device):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.device = device

    def forward(self, x):
        d = self.device
        made = (torch.zeros(2, 3, device=d) + x.new_zeros((2, 3), device=d) +
                torch.empty_like(x, device=d).zero_() + torch.ones_like(x, device=d) *
                torch.full((3,), 2.0, device=d) + torch.tensor([1.0, 2.0, 3.0], device=d) +
                torch.arange(3, device=d) + torch.linspace(0, 1, 3).to(d, non_blocking=True) +
                x.new_tensor([1.0, 1.0, 1.0], device=d) + torch.eye(3, device=d)[0])
        moved = (x.to(made) + x.to(d, non_blocking=True) + torch.ops.aten._to_copy(x, device=d) +
                 torch.ones(3).to(x) + x.new_ones(3).to(device=d, dtype=torch.half).float())
        out = self.linear(made + moved)
        return out.sum(), out


def test_a_wrapped_model_making_tensors_on_the_ipu_matches_the_cpu():
    torch.manual_seed(0)
    model, reference = _MakesTensorsOn("ipu"), _MakesTensorsOn("cpu")
    reference.load_state_dict(model.state_dict())
    inputs = [torch.randn(2, 3) for _ in range(3)]
    ipu = poptorch.inferenceModel(model)
    for x in inputs:
        torch.testing.assert_close(ipu(x), reference(x))
    ipu.destroy()
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x in inputs:
        loss, _ = ipu(x)
        optimizer.zero_grad()
        expected, _ = reference(x)
        expected.backward()
        optimizer.step()
        torch.testing.assert_close(loss, expected.detach())
    ipu.copyWeightsToHost()
    torch.testing.assert_close(model.state_dict(), reference.state_dict())


def test_item_tolist_print_and_numpy():
    t = torch.tensor([1.5, 2.5], device="ipu") * 2
    assert t.sum().item() == 8.0
    assert t.tolist() == [3.0, 5.0]
    assert "device='ipu:0'" in str(t) and "3." in str(t)
    assert (t.cpu().numpy() == [3.0, 5.0]).all()


def test_model_to_ipu_moves_every_parameter_and_buffer():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("ipu")
    assert all(p.device.type == "ipu" for p in model.parameters())
    assert all(b.device.type == "ipu" for b in model.buffers())
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    x = torch.randn(5, 4)
    torch.testing.assert_close(model(x.to("ipu")).cpu(), cpu(x))


def test_device_module():
    assert torch.ipu.is_available()
    assert torch.ipu.device_count() == 4
    torch.ipu.synchronize()
    with torch.ipu.device(2):
        assert torch.ipu.current_device() == 2
        assert torch.empty(2, device="ipu").device == torch.device("ipu:2")
    assert torch.ipu.current_device() == 0


def test_memory_allocated_counts_live_tensors():
    before = torch.ipu.memory_allocated(1)
    t = torch.ones(1024, device="ipu:1")
    assert torch.ipu.memory_allocated(1) == before + 4096
    del t
    assert torch.ipu.memory_allocated(1) == before


def test_mixing_cpu_and_ipu_tensors_raises_like_cuda():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="ipu") + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="ipu:0") + torch.ones(3, device="ipu:1")


@pytest.mark.parametrize(
    "op",
    [
        lambda ipu, cpu: torch.linalg.lstsq(ipu, cpu),  # its output shape depends on the data
        lambda ipu, cpu: torch.linalg.lstsq(cpu, ipu),
        lambda ipu, cpu: torch.masked_select(ipu, cpu > 0.5),
    ],
)
def test_mixing_cpu_and_ipu_tensors_raises_in_ops_run_on_the_host(op):
    """Ops the ipu runs on the host (their output shape depends on the data) get every argument
    there: linalg.lstsq(ipu, cpu) ran without the error (PyTorch's test_linalg_lstsq_input_checks)."""
    ipu, cpu = torch.rand(2, 2, 2, device="ipu"), torch.rand(2, 2, 2)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        op(ipu, cpu)


def test_cpu_scalar_tensors_mix_with_ipu_tensors():
    result = torch.ones(3, device="ipu") + torch.tensor(2.0)
    assert torch.equal(result.cpu(), torch.full((3,), 3.0))


@pytest.mark.parametrize(
    "op",
    [
        lambda ipu, cpu: torch.add(ipu, ipu, out=cpu),
        lambda ipu, cpu: torch.bitwise_not(ipu.long(), out=cpu.long()),
        lambda ipu, cpu: torch.mul(ipu, 2.0, out=cpu),
        lambda ipu, cpu: cpu.add_(ipu),
    ],
)
def test_cpu_scalar_tensors_are_not_written_by_ipu_ops(op):
    """A 0-dim CPU tensor mixes with ipu tensors as an input only, as CUDA's TensorIterator
    allows: as out= or as the target of an in-place op, the op raises the device error (it ran
    without one and left the CPU tensor unwritten; PyTorch's test_ops test_out, case 3)."""
    ipu, cpu = torch.tensor(1.0, device="ipu"), torch.tensor(7.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        op(ipu, cpu)
    assert cpu.item() == 7.0


# A CPU scalar first: PyTorch's Python Meta kernels refused it (the op ran on the
# host and its result stayed there), and PyTorch's host fallback returns results
# on the device of its first tensor argument.
def _check_cpu_scalar_first(op, scalar, other):
    expected = op(scalar, other)
    result = op(scalar, other.to("ipu"))
    assert result.device.type == "ipu"
    assert result.dtype == expected.dtype
    torch.testing.assert_close(result.cpu(), expected)


@pytest.mark.parametrize("op", [torch.mul, torch.add, torch.sub, torch.div])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.int64])
def test_a_cpu_scalar_first_gives_an_ipu_result_with_the_cpu_values(op, dtype):
    _check_cpu_scalar_first(op, torch.tensor(3, dtype=dtype), torch.tensor([1, -2, 4], dtype=dtype))


@pytest.mark.parametrize(
    "op", [torch.maximum, torch.atan2, lambda weight, t: torch.lerp(t, t * 2, weight)])
def test_a_cpu_scalar_first_in_float_ops(op):
    _check_cpu_scalar_first(op, torch.tensor(0.25), torch.tensor([1.0, -2.0, 4.0]))


def test_a_cpu_scalar_first_in_an_op_that_runs_on_the_host():
    _check_cpu_scalar_first(torch.masked_select, torch.tensor(2.0),
                            torch.tensor([True, False, True]))


def test_bad_device_index():
    with pytest.raises(IndexError, match="ipu:9 is not a device.*4 IPUs"):
        torch.ones(3, device="ipu:9")
    with pytest.raises(IndexError):
        torch.ipu.set_device(7)


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="no 64-bit floating point"):
        torch.ones(3, device="ipu", dtype=torch.float64)
    with pytest.raises(TypeError, match="no 64-bit floating point"):
        torch.ones(3, dtype=torch.float64).to("ipu")


_DENSE = [[0.0, 1.0], [2.0, 0.0]]
_COO = (torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]))

# Each way of making a sparse ipu tensor, with the op the error names; each
# works on the CPU.
_SPARSE_MAKERS = {
    "to_sparse": (lambda d: torch.tensor(_DENSE, device=d).to_sparse(), "_to_sparse"),
    "to_sparse_csr": (lambda d: torch.tensor(_DENSE, device=d).to_sparse_csr(), "_to_sparse_csr"),
    "to_sparse_bsr": (lambda d: torch.tensor(_DENSE, device=d).to_sparse_bsr((1, 1)),
                      "_to_sparse_bsr"),
    "sparse_coo_tensor": (lambda d: torch.sparse_coo_tensor(*_COO, (2, 2), device=d),
                          "_sparse_coo_tensor_with_dims_and_tensors"),
    "empty_sparse": (lambda d: torch.empty(2, 2, layout=torch.sparse_coo, device=d),
                     "empty"),
    "sparse_to_ipu": (lambda d: torch.tensor(_DENSE).to_sparse().to(d),
                      "_sparse_coo_tensor_with_dims_and_tensors"),
}


@pytest.mark.parametrize("make", _SPARSE_MAKERS)
def test_sparse_layouts_are_refused_with_a_clear_error(make):
    function, op = _SPARSE_MAKERS[make]
    on_cpu = function("cpu")
    assert on_cpu.layout != torch.strided and on_cpu.shape == (2, 2)
    with pytest.raises(poptorch.UnsupportedError,
                       match=f"aten::{op}.*sparse tensors are not supported on the ipu.*to_dense"):
        function("ipu")
    # Nothing of the refused op is left pending: the device goes on as before.
    assert (torch.tensor(_DENSE, device="ipu") * 2).cpu().tolist() == [[0.0, 2.0], [4.0, 0.0]]


# Nested tensors of the strided layout, each way, with the op the error names;
# each works on the CPU.
_NESTED_MAKERS = {
    "as_nested_tensor": (lambda d: torch.nested.as_nested_tensor(
        [torch.ones(2, device=d), torch.ones(3, device=d)]), "_nested_tensor_from_tensor_list"),
    "from_mask": (lambda d: torch._nested_tensor_from_mask(
        torch.ones(2, 3, 4, device=d), torch.ones(2, 3, dtype=torch.bool, device=d)),
                  "_nested_tensor_from_mask"),
}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", _NESTED_MAKERS)
def test_strided_nested_tensors_are_refused_with_a_clear_error(make):
    function, op = _NESTED_MAKERS[make]
    assert function("cpu").is_nested
    with pytest.raises(poptorch.UnsupportedError,
                       match=f"aten::{op}.*nested tensors of the strided layout.*jagged"):
        function("ipu")


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("parts", [[torch.ones(2, 3), torch.ones(4, 3)], []], ids=["two", "none"])
def test_nested_tensor_constructor_with_an_ipu_device(parts):
    assert torch.nested.nested_tensor(parts).is_nested
    with pytest.raises(poptorch.UnsupportedError, match="nested tensors of the strided layout"):
        torch.nested.nested_tensor(parts, device="ipu")


def test_jagged_nested_tensors_hold_ipu_tensors():
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    cpu = torch.nested.nested_tensor(parts, layout=torch.jagged)
    ipu = torch.nested.nested_tensor(parts, layout=torch.jagged, device="ipu")
    assert ipu.device.type == "ipu"
    assert_same((cpu * 2).to_padded_tensor(0.0), (ipu * 2).to_padded_tensor(0.0))


def test_out_of_memory_is_reported_like_cuda():
    result = run_python(
        "import torch, poptorch\n"
        "try:\n"
        "    torch.empty(2 * 1024 * 1024, device='ipu')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM:', e)\n",
        env={"POPTORCH_IPU_MEMORY_MB": "4"},
    )
    assert "OOM: IPU out of memory" in result.stdout, result.stderr
    assert "ipu:0, which has 4 MiB in total" in result.stdout
