"""How a wrapped model matches a call's inputs with the compiled step: by the
forward signature, defaults filled in (as PopTorch does), and what it says
when a call does not fit. Outputs are compared with the model on the CPU."""
import functools
import re

import pytest
import torch

import poptorch
from poptorch._logging import logger


class Optional(torch.nn.Module):
    def forward(self, t1, t2, t3=torch.ones(1), t4=torch.zeros(1)):
        return t1 * t3 + t2 * t4


class Many(torch.nn.Module):
    def forward(self, a, b, *c, y=None, z=None, u=3, **w):
        r = b * a + sum(w.values(), torch.zeros(()))
        for i, x in enumerate(c):
            r = r + (i + 1) * x
        if y is not None:
            r = r + y
        if z is not None:
            r = r * z
        return u * r


class Forwarding(Many):
    def forward(self, *args, **kwargs):  # pylint: disable=signature-differs
        return super().forward(*args, **kwargs)


def tensors(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, generator=g) for _ in range(n)]


def test_defaults_make_calls_with_and_without_an_argument_one_step():
    model = Optional()
    inference = poptorch.inferenceModel(model)
    t1, t2, t4 = torch.tensor([1.]), torch.tensor([2.]), torch.tensor([4.])
    for args, kwargs in [((t1, t2), {}), ((t1, t2), {"t4": t4}),
                         ((), {"t4": t4, "t1": t1, "t2": t2}), ((t1, t2, torch.ones(1)), {})]:
        torch.testing.assert_close(inference(*args, **kwargs), model(*args, **kwargs))


def test_var_positional_and_keyword_arguments():
    model = Many()
    inference = poptorch.inferenceModel(model)
    b, c, d, t, z = tensors(5)
    torch.testing.assert_close(inference(2, b, c, d, t=t, z=z), model(2, b, c, d, t=t, z=z))
    torch.testing.assert_close(inference(2, b, d, c, z=z, t=t), model(2, b, d, c, z=z, t=t))


def _adds_a_keyword(forward):
    """As transformers' decorators do (``use_cache`` from the config): the
    keyword is added unless the call gave the parameter by position."""
    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if len(args) < 2 and kwargs.get("scale") is None:
            kwargs["scale"] = self.default_scale
        return forward(self, *args, **kwargs)
    return wrapper


class Decorated(torch.nn.Module):
    default_scale = 3.0

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.positional = []
        self.register_forward_pre_hook(lambda _, args: self.positional.append(len(args)))

    @_adds_a_keyword
    def forward(self, x, scale=None, shift=torch.ones(2)):
        return self.lin(x) * scale + shift


def test_forward_is_called_with_the_callers_positional_arguments_only():
    # Defaults are filled in to match calls (bind), but forward sees the call
    # as the caller made it: a decorator that adds a keyword argument got it
    # twice ("got multiple values for argument"), and pre-hooks saw the defaults.
    model = Decorated()
    x = torch.randn(4, 2)
    expected = model(x)
    inference = poptorch.inferenceModel(model)
    torch.testing.assert_close(inference(x), expected)
    assert model.positional == [1, 1]  # the CPU call's, then the capture's
    # A default tensor is an input of the step, as before: the call that gives
    # shift is the same step, with its own value.
    torch.testing.assert_close(inference(x, shift=torch.zeros(2)), model(x, shift=torch.zeros(2)))


def test_positional_only_defaults_stay_positional():
    class PositionalOnly(torch.nn.Module):
        def forward(self, x, y=torch.full((2,), 2.0), /, z=torch.ones(2)):
            return x * y + z

    model = PositionalOnly()
    x = torch.randn(3, 2)
    torch.testing.assert_close(poptorch.inferenceModel(model)(x), model(x))


def test_a_call_that_does_not_fit_the_signature_raises_the_cpu_type_error():
    # The CPU model's TypeError, which is also PopTorch's poptorch.Error (its words first).
    inference = poptorch.inferenceModel(Many())
    with pytest.raises(TypeError, match="^Mandatory parameter b missing: "
                       "missing a required argument: 'b'$") as raised:
        inference(2)
    assert isinstance(raised.value, poptorch.Error)
    with pytest.raises(TypeError, match="^got an unexpected keyword argument 'u'$") as raised:
        poptorch.inferenceModel(Optional())(torch.ones(1), torch.ones(1), u=1)
    assert isinstance(raised.value, poptorch.Error)


@pytest.mark.parametrize("model", [Many, Forwarding])
def test_what_changed_is_named(model):
    inference = poptorch.inferenceModel(model())
    b, c, d, t, z = tensors(5)
    inference(2, b, c, d, t=t, z=z)
    forwarding = model is Forwarding
    missing = "Missing arguments: z." if forwarding else (
        "Type mismatch for z: expected Tensor but got NoneType")
    a, d_name = (r"args\[0\]", r"args\[3\]") if forwarding else ("a", r"c\[1\]")
    cases = [
        ((2, b, c, d), {"t": t}, re.escape(missing)),
        ((2, b, c, d), {"t": t, "z": z, "m": z}, "Unexpected arguments: m."),
        ((2, b, c), {"t": t, "z": z},
         "Number of positional arguments mismatch: expected 4 arguments but got 3"),
        ((3, b, c, d), {"t": t, "z": z}, rf"Value mismatch for {a}: expected 2 but got 3"),
        # a tensor where a fixed value was compiled: named by shape and dtype, not printed
        ((b, b, c, d), {"t": t, "z": z},
         rf"Value mismatch for {a}: expected 2 but got a tensor of shape \[.*\] and dtype "
         r"torch.float32: .*call destroy\(\)"),
        ((2, b, c, d), {"t": t, "z": z.half()},
         "Dtype mismatch for z: expected torch.float32 but got torch.float16"),
        ((2, b, c, d[:1]), {"t": t, "z": z},
         rf"Shape mismatch for {d_name}: expected torch.Size\(\[2, 2\]\) "
         r"but got torch.Size\(\[1, 2\]\): .*drop_last=True"),
        # a sequence that grows (a generation loop), not a short last batch
        ((2, b, c, torch.cat([d, d], 1)), {"t": t, "z": z},
         rf"Shape mismatch for {d_name}: .*pad the input to one length .*lazy mode"),
        ((2, b, c, (d, d)), {"t": t, "z": z},
         rf"Type mismatch for {d_name}: expected a Tensor or scalar but got a tuple of 2"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(poptorch.Error, match=message):
            inference(*args, **kwargs)


class AddsTwoEntries(torch.nn.Module):
    def forward(self, d):
        return d["a"] + d["b"]


def test_a_dict_input_with_other_keys_names_them():
    inference = poptorch.inferenceModel(AddsTwoEntries())
    inference({"a": torch.ones(2), "b": torch.ones(2)})
    with pytest.raises(poptorch.Error, match=r"expected a dict with keys \['a', 'b'\] but got "
                                             r"a dict with keys \['a', 'c'\]"):
        inference({"a": torch.ones(2), "c": torch.ones(2)})


def test_destroy_lets_the_model_compile_for_other_inputs():
    model = Optional()
    inference = poptorch.inferenceModel(model)
    inference(torch.ones(1), torch.ones(1))
    with pytest.raises(poptorch.Error, match="Shape mismatch for t1"):
        inference(torch.ones(3), torch.ones(3))
    inference.destroy()
    x, y = torch.arange(3.), torch.ones(3)
    torch.testing.assert_close(inference(x, y), model(x, y))


def test_an_output_computed_on_the_host_is_a_constant_of_the_step(caplog, monkeypatch):
    # The user guide's counter example: a plain tensor attribute (not a
    # buffer) is updated on the host while the step is captured; as in
    # PopTorch, each run returns its value at compilation.
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.i = torch.tensor([0.])

        def forward(self):
            self.i += 1
            return self.i

    monkeypatch.setattr(logger, "propagate", True)  # the poptorch logger does not
    model = Counter()
    inference = poptorch.inferenceModel(model)
    assert [float(inference()) for _ in range(3)] == [1.0] * 3
    assert float(model.i) == 1.0
    assert any("constant of the step" in r.getMessage() for r in caplog.records)


def test_an_input_that_requires_grad_is_detached_with_poptorchs_warning(caplog, monkeypatch):
    # Upstream tensor_ops_test test_requires_grad_true checks PopTorch's words.
    monkeypatch.setattr(logger, "propagate", True)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    x = torch.tensor([0.5], requires_grad=True)
    out = poptorch.inferenceModel(model)(x)
    torch.testing.assert_close(out, model(x).detach())
    assert not out.requires_grad and x.grad is None
    assert any("Input tensor has requires_grad=True set.This tensor will be detached."
               in r.getMessage() for r in caplog.records)
