"""Moving a module to or from the ipu keeps its Parameter objects, as moves
between the CPU and CUDA do: tied weights stay tied, and an optimiser made
before `model.to("ipu")` trains the model. Each test runs the same code on the
CPU (where PyTorch keeps the objects) and on the ipu, and compares."""
from __future__ import annotations

import copy
import io
from typing import Callable, Iterator, List

import pytest
import torch
from torch import nn

import poptorch
from conftest import assert_same


class TiedLM(nn.Module):
    """An embedding and an output projection sharing one weight, as GPT-2's do."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(20, 8)
        self.hidden = nn.Linear(8, 8)
        self.lm_head = nn.Linear(8, 20, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.hidden(self.wte(ids))))


def _tied_lm() -> TiedLM:
    torch.manual_seed(0)
    return TiedLM()


@pytest.fixture(params=[False, True], ids=["set_data", "swap_tensors"])
def conversion(request: pytest.FixtureRequest) -> Iterator[None]:
    """Both ways `nn.Module._apply` keeps parameters: `param.data = moved` (the
    default) and `torch.utils.swap_tensors` (`torch.__future__`'s flag)."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(request.param)
    yield
    torch.__future__.set_swap_module_params_on_conversion(before)


MOVES: List[Callable[[nn.Module, str], nn.Module]] = [
    lambda m, device: m.to(device),
    lambda m, device: m.to(device).cpu(),
    lambda m, device: m.to(device, torch.float16),
    lambda m, device: m.to(device).half(),
    lambda m, device: m.to(torch.device(device)).to("cpu").to(device),
]


@pytest.mark.parametrize("move", range(len(MOVES)))
def test_a_move_keeps_parameters_and_ties(device: str, move: int, conversion: None) -> None:
    model = _tied_lm()
    expected = copy.deepcopy(model)
    params = list(model.parameters())
    result = MOVES[move](model, device)
    MOVES[move](expected, "cpu")

    assert result is model
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert model.lm_head.weight is model.wte.weight
    assert isinstance(model.wte.weight, nn.Parameter) and model.wte.weight.requires_grad
    for p, e in zip(model.parameters(), expected.parameters()):
        assert p.dtype == e.dtype
        torch.testing.assert_close(p.detach().cpu(), e.detach())


def test_the_gradients_move_with_their_parameters(device: str, conversion: None) -> None:
    model = _tied_lm()
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    grads = [p.grad for p in model.parameters()]
    expected = [g.clone() for g in grads]

    model.to(device)

    for p, g, e in zip(model.parameters(), grads, expected):
        assert p.grad is g and g.device.type == device
        torch.testing.assert_close(g.cpu(), e)
    model.cpu()
    assert all(p.grad is g and g.device.type == "cpu" for p, g in zip(model.parameters(), grads))


def test_to_empty_keeps_parameters_and_ties(device: str) -> None:
    model = _tied_lm()
    params = list(model.parameters())

    model.to_empty(device=device)

    assert all(p is q and p.device.type == device for p, q in zip(model.parameters(), params))
    assert model.lm_head.weight is model.wte.weight


def _batches() -> List[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randint(0, 20, (4, 6)) for _ in range(4)]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, device: str) -> List[float]:
    losses = []
    for ids in _batches():
        optimizer.zero_grad()
        logits = model(ids.to(device))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten().to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
    lambda params: torch.optim.AdamW(params, lr=0.05),
], ids=["sgd", "adamw"])
def test_an_optimiser_made_before_the_move_trains_the_model(
        device: str, optimizer: Callable[..., torch.optim.Optimizer]) -> None:
    reference = _tied_lm()
    expected_losses = _train(reference, optimizer(reference.parameters()), "cpu")

    model = _tied_lm()
    opt = optimizer(model.parameters())
    model.to(device)
    losses = _train(model, opt, device)

    assert model.lm_head.weight is model.wte.weight
    torch.testing.assert_close(losses, expected_losses, rtol=1e-4, atol=1e-6)
    for p, e in zip(model.parameters(), reference.parameters()):
        assert p.device.type == device
        torch.testing.assert_close(p.detach().cpu(), e.detach(), rtol=1e-4, atol=1e-6)
    # The optimiser's state (momentum, moments) lives beside the parameters.
    state = [s for s in opt.state.values()]
    assert state and all(t.device.type == device for s in state for t in s.values()
                         if isinstance(t, torch.Tensor) and t.dim() > 0)


def test_a_state_dict_saved_after_the_move_loads_on_the_cpu(device: str) -> None:
    model = _tied_lm()
    expected = copy.deepcopy(model).state_dict()
    model.to(device)

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu")

    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(loaded[key], value)
    # The tie is one storage in the checkpoint, as on the CPU.
    assert loaded["wte.weight"].data_ptr() == loaded["lm_head.weight"].data_ptr()


class WithLoss(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, ids: torch.Tensor):
        logits = self.model(ids)
        return logits, self.loss(logits.flatten(0, 1), ids.flatten())


def test_training_model_of_a_model_on_the_ipu_trains_it_in_place() -> None:
    reference = _tied_lm()
    expected_losses = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.5), "cpu")

    model = _tied_lm().to("ipu")
    params = list(model.parameters())
    training = poptorch.trainingModel(WithLoss(model),
                                      optimizer=poptorch.optim.SGD(model.parameters(), lr=0.5))
    losses = [training(ids)[1].item() for ids in _batches()]

    torch.testing.assert_close(losses, expected_losses, rtol=1e-4, atol=1e-6)
    # The model stays on the ipu, with its own Parameter objects, tied and trained.
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert model.lm_head.weight is model.wte.weight
    for p, e in zip(model.parameters(), reference.parameters()):
        assert p.device.type == "ipu"
        assert_same(e.detach(), p.detach(), rtol=1e-4, atol=1e-6)
    training.detachFromDevice()
    for p, e in zip(model.parameters(), reference.parameters()):
        assert p.device.type == "ipu"
        assert_same(e.detach(), p.detach(), rtol=1e-4, atol=1e-6)


def test_inference_model_of_a_model_on_the_ipu_leaves_it_there() -> None:
    reference = _tied_lm().eval()
    model = copy.deepcopy(reference).to("ipu")
    ids = torch.randint(0, 20, (4, 6))

    result = poptorch.inferenceModel(model)(ids)

    torch.testing.assert_close(result, reference(ids).detach(), rtol=1e-4, atol=1e-6)
    assert all(p.device.type == "ipu" for p in model.parameters())
    assert model.lm_head.weight is model.wte.weight


def test_shallow_copy_compatibility_is_the_cuda_answer() -> None:
    """`param.data = t` (and so `Module._apply`) may move a dense tensor between
    the CPU and the ipu, as between the CPU and CUDA; not to a meta or a sparse
    tensor, which PyTorch refuses for CUDA too."""
    ask = torch._has_compatible_shallow_copy_type
    cpu, ipu = torch.zeros(2), torch.zeros(2, device="ipu")
    assert ask(cpu, ipu) and ask(ipu, cpu) and ask(ipu, ipu.half())
    assert not ask(ipu, torch.zeros(2, device="meta"))
    assert not ask(ipu, torch.zeros(2).to_sparse())
    p = nn.Parameter(torch.ones(3))
    p.data = torch.full((3,), 2.0, device="ipu")
    assert p.is_ipu and p.requires_grad
    assert_same(torch.full((3,), 2.0), p.detach())


def test_gpt2_trains_in_lazy_mode_as_on_the_cpu() -> None:
    """Hugging Face GPT-2 (random weights from a small config), an optimiser made
    before `model.to("ipu")`, a few SGD steps: the CPU's losses and weights, and
    lm_head still tied to the token embedding."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(config)
    model = copy.deepcopy(reference)
    opt_cpu = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt_ipu = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("ipu")
    assert model.lm_head.weight is model.transformer.wte.weight

    for _ in range(3):
        ids = torch.randint(0, 64, (2, 12))
        for net, opt, device in ((reference, opt_cpu, "cpu"), (model, opt_ipu, "ipu")):
            opt.zero_grad()
            loss = net(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            opt.step()
            if device == "cpu":
                expected = loss.item()
            else:
                torch.testing.assert_close(loss.item(), expected, rtol=1e-4, atol=0)

    assert model.lm_head.weight is model.transformer.wte.weight
    for (name, p), (_, e) in zip(model.named_parameters(), reference.named_parameters()):
        assert p.device.type == "ipu", name
        assert_same(e.detach(), p.detach(), rtol=1e-4, atol=1e-6)
