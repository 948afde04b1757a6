"""poptorch.ipu_print_tensor: printed on every run (each micro-batch a wrapped
model replays, forward and gradient), in the format options' layout, as the
same model prints on the CPU."""
import re

import pytest
import torch

import poptorch
from poptorch._ops.tensor_format import TensorFormat, format_tensor


def _printed(capsys):
    """What was printed on stderr (where PopTorch prints), one entry per
    print: a print starts with its title and may span lines."""
    prints = []
    for line in capsys.readouterr().err.splitlines():
        if re.match(r"\w+: ", line):
            prints.append(line)
        elif prints and not line.startswith(("[poptorch", "\r", "Graph compilation")):
            prints[-1] += "\n" + line
    return prints


def _numbers(line):
    return [float(v) for v in re.findall(r"-?\d+\.\d+(?:e[+-]\d+)?", line)]


class Printing(torch.nn.Module):
    def __init__(self, print_gradient=True):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.print_gradient = print_gradient

    def forward(self, x, target=None):
        hidden = poptorch.ipu_print_tensor(self.linear(x), "hidden",
                                           print_gradient=self.print_gradient)
        out = hidden.relu()
        if target is None:
            return out
        return out, ((out - target) ** 2).mean()


def _lines_match(ipu, cpu):
    assert len(ipu) == len(cpu), (ipu, cpu)
    for a, b in zip(ipu, cpu):
        assert a.split(":")[0] == b.split(":")[0], (a, b)
        assert _numbers(a) == pytest.approx(_numbers(b), abs=2e-3), (a, b)


def test_inference_prints_every_micro_batch_like_the_cpu(capsys):
    torch.manual_seed(0)
    model = Printing()
    x = torch.randn(4 * 2, 3)
    expected = [model(micro) for micro in x.split(2)]
    cpu = _printed(capsys)
    assert len(cpu) == 4 and all(line.startswith("hidden: ") for line in cpu)
    wrapped = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))
    out = wrapped(x)
    _lines_match(_printed(capsys), cpu)
    torch.testing.assert_close(out, torch.cat(expected))
    wrapped(x)  # replayed from C++: prints again, every micro-batch
    _lines_match(_printed(capsys), cpu)


@pytest.mark.parametrize("print_gradient", [True, False])
def test_training_prints_values_and_gradients_every_micro_batch(capsys, print_gradient):
    torch.manual_seed(0)
    model = Printing(print_gradient)
    reference = Printing(print_gradient)
    reference.load_state_dict(model.state_dict())
    x, target = torch.randn(2 * 2 * 2, 3), torch.randn(2 * 2 * 2, 2)
    # The CPU: two iterations of two accumulated micro-batches (each prints
    # the gradient of its own loss; their mean updates), SGD after each.
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for xs, ts in zip(x.split(4), target.split(4)):
        optimizer.zero_grad()
        for xm, tm in zip(xs.split(2), ts.split(2)):
            _, loss = reference(xm, tm)
            loss.backward()
        for p in reference.parameters():
            p.grad /= 2
        optimizer.step()
    cpu = _printed(capsys)
    titles = [line.split(":")[0] for line in cpu]
    assert titles == (["hidden", "hidden_gradient"] if print_gradient else ["hidden"]) * 4
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    wrapped(x, target)
    _lines_match(_printed(capsys), cpu)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach())


def test_lazy_mode_prints_when_the_graph_runs_even_if_unused(capsys):
    x = torch.tensor([1.0, 2.0]).to("ipu")
    poptorch.ipu_print_tensor(x * 2, "unused")
    y = poptorch.ipu_print_tensor(x + 1, "used")
    poptorch.ipu_print_tensor(x + 1, "used")  # the same op twice prints twice
    assert _printed(capsys) == []  # nothing ran yet
    assert y.cpu().tolist() == [2.0, 3.0]
    assert _printed(capsys) == ["unused: (2.000, 4.000)", "used: (2.000, 3.000)",
                                "used: (2.000, 3.000)"]


def test_a_host_read_while_capturing_prints_nothing_extra(capsys):
    class Branching(torch.nn.Module):
        def forward(self, x):
            x = poptorch.ipu_print_tensor(x, "x")
            if x.sum() > 0:  # read on the host while the step is captured
                return x * 2
            return x * 3

    wrapped = poptorch.inferenceModel(Branching(), poptorch.Options().deviceIterations(2))
    wrapped(torch.tensor([[1.0], [2.0]]))
    assert _printed(capsys) == ["x: (\n (1.000)\n)", "x: (\n (2.000)\n)"]


def test_print_tensor_errors():
    with pytest.raises(poptorch.Error, match="torch.Tensor"):
        poptorch.ipu_print_tensor([1.0])
    with pytest.raises(poptorch.Error, match="float_format"):
        poptorch.ipu_print_tensor(torch.zeros(1), float_format="hex")
    with pytest.raises(poptorch.Error, match="digits"):
        poptorch.ipu_print_tensor(torch.zeros(1), digits=-1)


# digits are significant digits (PopTorch's meaning), and the layout Poplar's:
# upstream's ipu_print_tensor_test checks three of its outputs.
FORMATS = [
    (torch.tensor([1.5, -2.25, 3.0]), TensorFormat(), "( 1.500, -2.250,  3.000)"),
    (torch.tensor([1.4962566, 17.68]), TensorFormat(digits=8), "( 1.496257, 17.680000)"),
    (torch.arange(6).reshape(2, 3), TensorFormat(), "(\n (0, 1, 2)\n (3, 4, 5)\n)"),
    (torch.arange(4).reshape(2, 1, 2), TensorFormat(),
     "(\n (\n  (0, 1)\n )\n (\n  (2, 3)\n )\n)"),
    (torch.arange(10.), TensorFormat(summarise_threshold=5, edge_items=2, digits=2),
     "(0.0, 1.0, ..., 8.0, 9.0)"),
    (torch.arange(10.), TensorFormat(summarise_threshold=0, digits=0, float_format="none"),
     "(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"),
    (torch.tensor([1e-9, 1.0]), TensorFormat(digits=2), "(1.0e-09, 1.0e+00)"),
    (torch.tensor([0.5, 100.0]), TensorFormat(digits=2, float_format="scientific"),
     "(5.0e-01, 1.0e+02)"),
    (torch.tensor([0.5, 100.0]), TensorFormat(digits=5, float_format="fixed", separator=" ",
                                              open_bracket="[", close_bracket="]"),
     "[  0.50 100.00]"),
    (torch.tensor([True, False]), TensorFormat(), "(true, false)"),
    (torch.tensor(float("nan")), TensorFormat(), "nan"),
    (torch.arange(8), TensorFormat(max_line_width=12, separator=" ", open_bracket="[",
                                   close_bracket="]"), "[0 1 2 3 4 5\n  6 7]"),
    (torch.tensor([[1.4962566, 1.7682219], [1.0884774, 1.1320305]]),
     TensorFormat(max_line_width=15, digits=8, float_format="scientific", separator=",",
                  open_bracket="[", close_bracket="]"),
     "[\n [1.4962566e+00,\n   1.7682219e+00]\n [1.0884774e+00,\n   1.1320305e+00]\n]"),
]


@pytest.mark.parametrize("tensor,fmt,text", FORMATS)
def test_format_options(tensor, fmt, text):
    assert format_tensor(tensor, fmt) == text


def test_format_options_reach_the_printed_text(capsys):
    x = torch.arange(6.).to("ipu")
    poptorch.ipu_print_tensor(x, "t", summarise_threshold=4, edge_items=1, digits=2,
                              separator=" ", open_bracket="<", close_bracket=">")
    poptorch.synchronize()
    assert _printed(capsys) == ["t: <0.0 ... 5.0>"]
