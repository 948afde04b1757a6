"""Misuses an outside tester writes (issue 9, bad input): each gives a clear error
naming what was wrong and how to fix it, or the CPU's own error, never a crash, an
internal assert or a silent wrong result."""
import inspect

import pytest
import torch

import poptorch
from conftest import run_python


# Nested tensors (the ops tests/test_device.py checks are left out) ------------

PIECES = [[1.0, 2.0], [3.0, 4.0, 5.0]]


def _pieces(device):
    return [torch.tensor(p, device=device) for p in PIECES]


STRIDED_NESTED = {
    "nested_tensor of lists": lambda: torch.nested.nested_tensor(PIECES, device="ipu:0"),
    "nested_tensor of ipu tensors": lambda: torch.nested.nested_tensor(_pieces("ipu")),
    "as_nested_tensor to the ipu": lambda: torch.nested.as_nested_tensor(
        _pieces("cpu"), device=torch.device("ipu")),
    "as_nested_tensor of a batch": lambda: torch.nested.as_nested_tensor(
        torch.ones(2, 3, device="ipu")),
    "a host nested tensor moved": lambda: torch.nested.nested_tensor(_pieces("cpu")).to("ipu"),
    "narrow": lambda: torch.nested.narrow(torch.ones(2, 6, device="ipu"), 1, 0, 3,
                                          layout=torch.strided),
}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make", STRIDED_NESTED.values(), ids=STRIDED_NESTED.keys())
def test_a_strided_nested_tensor_on_the_ipu_says_to_use_the_jagged_layout(make):
    # The constructors with device="ipu" failed PyTorch's INTERNAL ASSERT.
    with pytest.raises(poptorch.UnsupportedError,
                       match=r"nested tensors of the strided layout.*layout=torch\.jagged"):
        make()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_strided_nested_tensors_stay_usable_on_the_cpu():
    nt = torch.nested.nested_tensor(_pieces("cpu"), dtype=torch.half)
    assert nt.is_nested and nt.is_cpu and nt.dtype == torch.half
    assert torch.nested.as_nested_tensor(_pieces("cpu"), device="cpu").is_nested


# Quantized tensors ------------------------------------------------------------

def _quantized():
    return torch.quantize_per_tensor(torch.tensor([-1.0, 0.5, 2.0]), 0.1, 0, torch.qint8)


QUANTIZED_TO_THE_IPU = {
    "to": lambda q: q.to("ipu"),
    "to with a dtype": lambda q: q.to("ipu", torch.float32),
    "to a copy": lambda q: q.to(device="ipu:0", copy=True),
    "to another tensor's device": lambda q: q.to(torch.ones(1, device="ipu")),
    "torch.tensor": lambda q: torch.tensor(q, device="ipu"),
    "as_tensor": lambda q: torch.as_tensor(q, device="ipu"),
    "empty_like": lambda q: torch.empty_like(q, device="ipu"),
    "zeros_like": lambda q: torch.zeros_like(q, device="ipu"),
    "new_empty": lambda q: q.new_empty(3, device="ipu"),
    "copy_": lambda q: torch.empty(3, device="ipu").copy_(q),
    "setitem": lambda q: torch.empty(3, device="ipu").__setitem__(slice(None), q),
    "where": lambda q: torch.where(torch.ones(3, dtype=torch.bool, device="ipu"), q, q),
    "quantize an ipu tensor": lambda q: torch.quantize_per_tensor(
        q.dequantize().to("ipu"), 0.1, 0, torch.qint8),
    "empty of a quantized dtype": lambda q: torch.empty(3, dtype=torch.qint8, device="ipu"),
}


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("move", QUANTIZED_TO_THE_IPU.values(), ids=QUANTIZED_TO_THE_IPU.keys())
def test_a_quantized_tensor_on_the_ipu_says_to_dequantize(move):
    # .to("ipu") (and torch.tensor, as_tensor) returned a quantized CPU tensor
    # without a word: _to_copy's BackendSelect kernel sends it to QuantizedIPU,
    # where PyTorch's generic kernel copies with the tensor's quantizer on the
    # CPU. The others failed with PyTorch's message about a missing kernel.
    with pytest.raises(poptorch.UnsupportedError,
                       match=r"quantized tensors are not supported on the ipu; keep them and the "
                       r"quantized ops on the CPU, or move q.dequantize\(\)"):
        move(_quantized())


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_an_unsupported_tensor_error_is_a_poptorch_error_at_the_users_line():
    # Raised by the C++ core inside PyTorch's dispatcher: still a
    # poptorch.Error, located at the user's line, and the NotImplementedError
    # PyTorch raises for a missing kernel.
    q = _quantized()
    with pytest.raises(poptorch.Error) as raised:
        q.to("ipu")
    line = inspect.currentframe().f_lineno - 1
    assert isinstance(raised.value, NotImplementedError)
    assert raised.value.location == f"{__file__}:{line}"
    assert raised.value.message.startswith("aten::_to_copy: quantized tensors")


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_tensors_stay_usable_on_the_cpu_and_dequantized_on_the_ipu():
    q = _quantized()
    copied = q.to("cpu", copy=True)
    assert copied.is_quantized and torch.equal(copied.int_repr(), q.int_repr())
    torch.testing.assert_close(q.dequantize().to("ipu").cpu(), q.dequantize())


# Streams and events ---------------------------------------------------------

def test_record_stream_takes_ipu_streams_and_changes_nothing():
    x = torch.arange(6.0).to("ipu") * 2
    side = torch.ipu.Stream()
    with torch.ipu.stream(side):
        y = x + 1
    x.record_stream(torch.ipu.current_stream())  # was "unknown parameter type"
    y.record_stream(side)
    assert isinstance(side, torch.Stream) and side.device == torch.device("ipu", 0)
    torch.testing.assert_close(y.cpu(), torch.arange(6.0) * 2 + 1)


def test_record_stream_of_another_device_is_an_error():
    with pytest.raises(RuntimeError, match="an ipu tensor takes a stream of the ipu"):
        torch.ones(2, device="ipu").record_stream(torch.Stream("cpu"))


# Device indices ---------------------------------------------------------------

NO_SUCH_IPU = {
    "Stream": lambda: torch.ipu.Stream(99),
    "Stream of ipu:7": lambda: torch.ipu.Stream("ipu:7"),
    "get_rng_state": lambda: torch.ipu.get_rng_state(99),
    "set_rng_state": lambda: torch.ipu.set_rng_state(torch.get_rng_state(), 99),
    "set_device": lambda: torch.ipu.set_device(99),
    "device": lambda: torch.ipu.device(-1).__enter__(),
    "memory_stats": lambda: torch.ipu.memory_stats(99),
    "mem_get_info": lambda: torch.ipu.mem_get_info("ipu:7"),
    "a tensor": lambda: torch.ones(2, device="ipu:99"),
    "synchronize": lambda: torch.ipu.synchronize(99),
}


@pytest.mark.parametrize("call", NO_SUCH_IPU.values(), ids=NO_SUCH_IPU.keys())
def test_an_ipu_index_that_is_not_there_is_an_index_error(call):
    # Streams and the random state took any index without a word.
    with pytest.raises(IndexError, match=r"is not a device: this machine has \d+ IPUs"):
        call()


def test_a_device_of_another_type_is_a_value_error():
    with pytest.raises(ValueError, match="expected an ipu device, got cpu"):
        torch.ipu.Stream("cpu")


# Sizes ------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda device: torch.arange(0, 2**40, device=device),
    lambda device: torch.zeros(2**40, device=device),
    lambda device: torch.ones(4, device=device).expand(2**40, 4).contiguous(),
], ids=["arange", "zeros", "expanded"])
def test_a_result_larger_than_the_ipu_is_its_out_of_memory_error(make):
    # arange's check at the call ran the CPU kernel at full size, and failed
    # for 8 TB of host memory instead.
    with pytest.raises(torch.OutOfMemoryError, match="IPU out of memory"):
        make("ipu")
    torch.testing.assert_close((torch.ones(3, device="ipu") + 1).cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize("make", [lambda device: torch.empty(-1, device=device),
                                  lambda device: torch.full((-2, 3), 1.0, device=device),
                                  lambda device: torch.empty(2**62, device=device),
                                  lambda device: torch.empty(2**63, device=device)],
                         ids=["negative", "negative full", "overflowing", "beyond int64"])
def test_impossible_sizes_raise_the_cpus_error(make):
    with pytest.raises(Exception) as on_cpu:
        make("cpu")
    with pytest.raises(type(on_cpu.value)) as on_ipu:
        make("ipu")
    assert str(on_ipu.value).split(" and strides")[0].split("\n")[0] == \
        str(on_cpu.value).split("\n")[0]


# Optimisers -------------------------------------------------------------------

def test_a_param_group_added_after_compiling_says_to_add_it_before():
    # The error named setOptimizer, which the user never called.
    linear = torch.nn.Linear(4, 2)

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = linear

        def forward(self, x):
            return self.linear(x).sum()

    optimizer = torch.optim.SGD([linear.weight], lr=0.1)
    model = poptorch.trainingModel(Loss(), optimizer=optimizer)
    x = torch.randn(2, 4)
    model(x)
    optimizer.add_param_group({"params": [linear.bias], "lr": 0.5})
    with pytest.raises(poptorch.Error, match=r"the optimiser changed since the model was "
                       r"compiled: the optimiser has 2 param groups, the model was compiled "
                       r"with 1.*add_param_group.*before the first call, or wrap the model "
                       r"again"):
        model(x)
    model.destroy()


# Wrapper arguments ------------------------------------------------------------

WRAPPER_ARGUMENTS = {
    # The optimiser passed second lands in options (PopTorch's signature is
    # trainingModel(model, options=None, optimizer=None)).
    "optimizer as options": (
        lambda m: poptorch.trainingModel(m, torch.optim.SGD(m.parameters(), lr=0.1)),
        r"trainingModel\(model, options, optimizer\): the second argument is a SGD, where a "
        r"poptorch.Options goes: pass the optimiser by name, optimizer=\.\.\."),
    "optimizer to inference": (
        lambda m: poptorch.inferenceModel(m, torch.optim.SGD(m.parameters(), lr=0.1)),
        r"inferenceModel takes no optimiser: use trainingModel\(model, optimizer=\.\.\.\)"),
    "options as a dict": (
        lambda m: poptorch.inferenceModel(m, {"deviceIterations": 2}),
        r"inferenceModel: options must be a poptorch.Options \(or None\), got dict: make one "
        r"with poptorch.Options\(\)"),
    "optimizer as a name": (
        lambda m: poptorch.trainingModel(m, optimizer="sgd"),
        r"trainingModel: optimizer must be a torch.optim.Optimizer .*got str"),
    # Was taken, and the next call failed far from the mistake.
    "setOptimizer with a name": (
        lambda m: poptorch.trainingModel(m).setOptimizer("sgd"),
        r"setOptimizer: optimizer must be a torch.optim.Optimizer .*got str"),
}


@pytest.mark.parametrize("wrap, message", WRAPPER_ARGUMENTS.values(),
                         ids=WRAPPER_ARGUMENTS.keys())
def test_wrapper_arguments_of_the_wrong_kind_are_named_at_the_wrap(wrap, message):
    # They failed with "'SGD' object has no attribute '_freeze'" (or, for a
    # str optimiser, at the first call).
    with pytest.raises(poptorch.Error, match=message) as error:
        wrap(torch.nn.Linear(2, 2))
    assert error.value.location.startswith(__file__)


def test_a_training_model_of_a_model_without_parameters_says_to_use_inference():
    # Was torch's "optimizer got an empty parameter list" from the default SGD.
    with pytest.raises(poptorch.Error, match=r"trainingModel: the model \(ReLU\) has no "
                       r"parameters.*poptorch.inferenceModel") as error:
        poptorch.trainingModel(torch.nn.ReLU())
    assert error.value.location.startswith(__file__)


# Grad modes around a wrapped model --------------------------------------------

class _Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        out = self.linear(x)
        return out, torch.nn.functional.cross_entropy(out, y)


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


def test_a_training_model_trains_under_no_grad_as_poptorch_does():
    # PopTorch differentiates the step itself: a compiled model trained under
    # no_grad, but its first call failed in backward ("element 0 of tensors
    # does not require grad").
    torch.manual_seed(0)
    model = _Classifier()
    cpu = _Classifier()
    cpu.load_state_dict(model.state_dict())
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    cpu_optimizer = torch.optim.SGD(cpu.parameters(), lr=0.1)
    for step in range(2):
        with torch.no_grad():
            loss = training(*_batch(step))[1]
        cpu_optimizer.zero_grad()
        cpu_loss = cpu(*_batch(step))[1]
        cpu_loss.backward()
        cpu_optimizer.step()
        torch.testing.assert_close(loss, cpu_loss.detach())
    torch.testing.assert_close(model.linear.weight.detach(), cpu.linear.weight.detach())


@pytest.mark.parametrize("compiled", [False, True])
def test_a_training_model_under_inference_mode_is_refused_at_the_call(compiled):
    # Its first call trained with wrong gradients.
    model = _Classifier()
    training = poptorch.trainingModel(model)
    if compiled:
        training.compile(*_batch(0))
    weight = model.linear.weight.detach().clone()
    with torch.inference_mode(), pytest.raises(
            poptorch.Error, match=r"a trainingModel was called under torch.inference_mode\(\)"
            r".*call it outside inference_mode \(torch.no_grad\(\) is allowed\), or evaluate "
            r"with poptorch.inferenceModel\(model\)") as error:
        training(*_batch(0))
    assert error.value.location.startswith(__file__)
    assert torch.equal(model.linear.weight.detach(), weight)
    training(*_batch(0))  # and outside it, trains
    assert not torch.equal(model.linear.weight.detach(), weight)


def test_an_inference_model_runs_under_inference_mode():
    model = _Classifier()
    inference = poptorch.inferenceModel(model)
    with torch.inference_mode():
        result = inference(*_batch(0))
    torch.testing.assert_close(result, model(*_batch(0)))


@pytest.mark.parametrize("regroup", ["another model's", "swapped groups"])
def test_set_optimizer_with_other_parameters_is_refused(regroup):
    # It was taken: the compiled update went on with the old parameters and
    # the new optimiser's hyper-parameters, and its state stayed empty.
    model = _Classifier()
    groups = lambda m: [{"params": [m.linear.weight]}, {"params": [m.linear.bias]}]  # noqa: E731
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(groups(model), lr=0.1))
    training(*_batch(0))
    if regroup == "swapped groups":
        params = groups(model)[::-1]
    else:
        params = groups(_Classifier())
    with pytest.raises(poptorch.Error, match=r"setOptimizer: param group 0 of the optimiser "
                       r"holds other parameters than those the model was compiled with"):
        training.setOptimizer(torch.optim.SGD(params, lr=0.5))
    training.setOptimizer(torch.optim.SGD(groups(model), lr=0.5))  # the same ones: taken


@pytest.mark.parametrize("loss", [3.0, None, [torch.ones(2)]], ids=["float", "None", "list"])
def test_identity_loss_of_something_not_a_tensor_says_so(loss):
    # A float failed with "'float' object has no attribute 'mean'".
    with pytest.raises(poptorch.Error, match="identity_loss takes the loss as a tensor") as error:
        poptorch.identity_loss(loss, reduction="mean")
    assert error.value.location.startswith(__file__)


@pytest.mark.parametrize("inner_compiled", [False, True], ids=["inner new", "inner compiled"])
def test_a_wrapped_model_called_in_another_wrapped_models_forward_is_refused(inner_compiled):
    # A new inner model failed with "a step is already being captured on this
    # thread"; a compiled one ran its step inside the capture, and failed with
    # a host read that changed, after warnings about constants.
    torch.manual_seed(0)
    inner = poptorch.inferenceModel(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3)
    if inner_compiled:
        inner(x)

    class Outer(torch.nn.Module):
        def __init__(self, call_inner):
            super().__init__()
            self.call_inner = call_inner

        def forward(self, t):
            return self.call_inner(t) * 2

    outer = poptorch.inferenceModel(Outer(inner))
    with pytest.raises(poptorch.Error, match=r"called inside the forward of another.*call the "
                       r"module it wraps \(its \.model\)") as error:
        outer(x)
    assert error.value.location == f"{__file__}:{Outer.forward.__code__.co_firstlineno + 1}"
    # What the message says works, and gives the CPU's result.
    fixed = poptorch.inferenceModel(Outer(inner.model))
    torch.testing.assert_close(fixed(x), inner.model(x) * 2)


@pytest.mark.parametrize("variable, value", [("POPTORCH_NUM_IPUS", "two"),
                                             ("POPTORCH_MAX_GRAPH_NODES", "-1"),
                                             ("POPTORCH_IPU_MEMORY_MB", "0")])
def test_a_bad_environment_variable_is_a_poptorch_error_at_the_first_use(variable, value):
    # Read by the C++ core, at the first ipu op: was a plain ValueError.
    code = ("import torch, poptorch\n"
            "try:\n"
            "    (torch.ones(2, device='ipu') + 1).cpu()\n"
            "except poptorch.Error as error:\n"
            "    assert isinstance(error, ValueError)\n"
            "    print(error.location, '|', error)\n")
    result = run_python(code, env={variable: value})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("<string>:3 | " + variable), result.stdout
    assert value in result.stdout


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan"), "128"])
def test_a_loss_scaling_that_scales_nothing_is_refused(value):
    # 0, inf and nan made every weight nan after one step on the device (the
    # CPU's step ignores loss scaling), without a word.
    model = torch.nn.Linear(3, 2)
    with pytest.raises(poptorch.Error, match=r"SGD: loss_scaling must be a finite number above "
                       r"0, got") as error:
        poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=value)
    assert error.value.location.startswith(__file__)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=128)
    with pytest.raises(poptorch.Error, match="loss_scaling must be a finite number"):
        optimizer.loss_scaling = value  # set later, as PopTorch's examples do
    assert optimizer.loss_scaling == 128
