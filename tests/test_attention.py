"""Attention on the ipu runs the CPU's fused flash kernel where the CPU would,
and its results and gradients are the CPU's."""
import copy

import pytest
import torch
from torch import nn

import poptorch
from conftest import assert_same, run_python


def qkv(batch=2, heads=3, length=5, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=g) for _ in range(3)]


MASKS = {
    "none": lambda: None,
    "float": lambda: torch.randn(5, 5, generator=torch.Generator().manual_seed(1)),
    "bool": lambda: torch.rand(5, 5, generator=torch.Generator().manual_seed(2)) > 0.3,
}


# (PyTorch rejects an explicit mask together with is_causal.)
@pytest.mark.parametrize("mask,causal", [("none", False), ("none", True), ("float", False),
                                         ("bool", False)])
def test_results_and_gradients_match_the_cpu(mask, causal):
    attn_mask = MASKS[mask]()
    q, k, v = (t.requires_grad_() for t in qkv())
    ipu = [t.detach().to("ipu").requires_grad_() for t in (q, k, v)]
    ipu_mask = None if attn_mask is None else attn_mask.to("ipu")
    expected = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=causal)
    got = nn.functional.scaled_dot_product_attention(*ipu, ipu_mask, is_causal=causal)
    expected.pow(2).sum().backward()
    got.pow(2).sum().backward()
    assert_same(expected.detach(), got.detach(), rtol=1e-5, atol=1e-5)
    for cpu_input, ipu_input in zip((q, k, v), ipu):
        assert_same(cpu_input.grad, ipu_input.grad, rtol=1e-4, atol=1e-5)
    assert poptorch.metrics()["host_fallbacks"] == 0


def test_the_ipu_chooses_the_cpu_kernel():
    q, k, v = qkv()
    ipu = [t.to("ipu") for t in (q, k, v)]
    assert torch._fused_sdp_choice(*ipu) == torch._fused_sdp_choice(q, k, v)
    assert (torch._fused_sdp_choice(*ipu, dropout_p=0.5)
            == torch._fused_sdp_choice(q, k, v, dropout_p=0.5))


def mask_gradients(device, wrap_in_subclass):
    """The gradients of q, k, v and a float mask that requires grad, on `device`:
    computed directly, or through composite compliance's tensor subclass (as PyTorch's
    test_ops.py TestCompositeCompliance.test_backward does), which hides requires_grad
    from the choice of kernel if that choice is asked through the dispatcher."""
    from torch.testing._internal import composite_compliance

    inputs = [t.to(device).requires_grad_() for t in qkv()]
    mask = MASKS["float"]().to(device).requires_grad_()
    if wrap_in_subclass:  # raises where a kernel without a mask gradient ran
        composite_compliance.check_backward_formula(
            nn.functional.scaled_dot_product_attention, inputs, {"attn_mask": mask}, None,
            lambda op, *args, **kwargs: op(*args, **kwargs), torch.testing.assert_close)
        return None
    nn.functional.scaled_dot_product_attention(*inputs, attn_mask=mask).pow(2).sum().backward()
    return [t.grad for t in (*inputs, mask)]


# The CPU runs the math path when the mask requires grad (the flash kernel has no mask
# gradient); so must the ipu, also under a tensor subclass.
@pytest.mark.parametrize("wrap_in_subclass", [False, True])
def test_a_mask_that_requires_grad_gets_the_cpus_gradient(wrap_in_subclass):
    expected = mask_gradients("cpu", wrap_in_subclass)
    got = mask_gradients("ipu", wrap_in_subclass)
    if not wrap_in_subclass:
        for cpu_grad, ipu_grad in zip(expected, got):
            assert_same(cpu_grad, ipu_grad, rtol=1e-4, atol=1e-5)


def test_dropout_and_inference_mode_run():
    q, k, v = (t.to("ipu") for t in qkv())
    with torch.inference_mode():
        cpu = nn.functional.scaled_dot_product_attention(*qkv())
        assert_same(cpu, nn.functional.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-5)
    dropped = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert dropped.shape == q.shape and torch.isfinite(dropped.cpu()).all()


def test_a_transformer_encoder_trains_like_the_cpu():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    reference = copy.deepcopy(model)
    ipu_model = model.to("ipu")
    x = torch.randn(3, 7, 16)
    losses = []
    for m, device in ((reference, "cpu"), (ipu_model, "ipu")):
        optimiser = torch.optim.SGD(m.parameters(), lr=0.1)
        per_step = []
        for _ in range(3):
            optimiser.zero_grad()
            loss = m(x.to(device)).pow(2).mean()
            loss.backward()
            optimiser.step()
            per_step.append(loss.item())
        losses.append(per_step)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=0)
    with torch.no_grad():
        assert_same(reference.eval()(x), ipu_model.eval()(x.to("ipu")), rtol=1e-4, atol=1e-5)


def test_attention_without_dropout_leaves_the_default_generator_as_the_cpu_does():
    # The kernel draws no random numbers, and takes no seed from the generator.
    q, k, v = qkv()
    draws = []
    for device in ("cpu", "ipu"):
        torch.manual_seed(0)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.to(device), k.to(device), v.to(device))
        out.cpu()
        draws.append(torch.randn(4))
    assert torch.equal(draws[1], draws[0])


def test_an_attention_model_runs_its_inference_micro_batches_on_both_lanes():
    # A seeded op without a generator argument keeps its program on the calling
    # thread; attention without dropout takes no seed.
    code = """
import torch, poptorch
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
x = torch.randn(4 * 2, 5, 16)
with torch.no_grad():
    expected = torch.cat([layer(rows) for rows in x.split(2)])
out = poptorch.inferenceModel(layer, poptorch.Options().deviceIterations(4))(x)
torch.testing.assert_close(out, expected)
print("ok")
"""
    result = run_python(code, env={"POPTORCH_LOG_LEVEL": "DEBUG"})
    assert result.stdout.strip() == "ok", result.stderr
    assert "the inference micro-batches run on two lanes" in result.stderr
