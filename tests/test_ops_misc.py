"""PopTorch's other ops against plain PyTorch on the CPU: nop, dynamic_slice,
dynamic_update, MultiConv, serializedMatMul, set_available_memory,
set_overlap_for_input/output, fps, nearest and ctc_beam_search_decoder."""
import itertools
import math

import pytest
import torch

import poptorch
from poptorch._ops.ctc_decoder import decode_one


def _on(device, *tensors):
    return [t.to(device) for t in tensors]


def test_nop_is_an_identity_that_stays_in_the_graph(device):
    x = torch.tensor([1.0, -2.0], device=device, requires_grad=True)
    y = poptorch.nop(x) * 2
    if device == "ipu":
        assert "poptorch::nop" in poptorch._C.pending_graph()
    y.sum().backward()
    assert y.tolist() == [2.0, -4.0] and x.grad.tolist() == [2.0, 2.0]


def test_dynamic_slice_and_update_match_narrow(device):
    x = torch.arange(20.).reshape(4, 5)
    start = torch.tensor(1)
    # As in PopTorch: x[:, start:start + size:step] (upstream slice_test)
    for size, step in ((2, 2), (4, 3), (4, 2), (3, 1)):
        sliced = poptorch.dynamic_slice(*_on(device, x), 1, start.to(device), size, step)
        torch.testing.assert_close(sliced.cpu(), x[:, 1:1 + size:step])
    src = -torch.ones(2, 5)
    updated = poptorch.dynamic_update(*_on(device, x, src), 0, start.to(device), 2)
    expected = x.clone()
    expected[1:3] = src
    torch.testing.assert_close(updated.cpu(), expected)


class Slicer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1, 1, 8))

    def forward(self, start, target):
        window = poptorch.dynamic_slice(self.weight, 0, start, 3, 1)
        return window, ((window - target) ** 2).mean()


def test_dynamic_slice_reads_its_start_on_the_device():
    starts = torch.tensor([[0], [4], [2]])
    targets = torch.zeros(3, 3)
    model = Slicer()
    wrapped = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(3))
    out, _ = wrapped(starts, targets)
    torch.testing.assert_close(out, torch.cat([model.weight.detach()[s:s + 3] for s in
                                               [0, 4, 2]]))
    compiled = poptorch.metrics()["graphs_compiled"]
    out, _ = wrapped(starts.flip(0), targets)
    torch.testing.assert_close(out, torch.cat([model.weight.detach()[s:s + 3] for s in
                                               [2, 4, 0]]))
    assert poptorch.metrics()["graphs_compiled"] == compiled
    assert poptorch.metrics()["guard_failures"] == 0


def test_dynamic_slice_trains_like_the_cpu():
    model, reference = Slicer(), Slicer()
    start, target = torch.tensor([3]), torch.ones(3)
    wrapped = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.5))
    wrapped(start, target)
    reference(start, target)[1].backward()
    with torch.no_grad():
        expected = reference.weight - 0.5 * reference.weight.grad
    torch.testing.assert_close(model.weight.detach(), expected)


def test_dynamic_slicing_errors():
    x = torch.zeros(4, 4)
    with pytest.raises(poptorch.Error, match="start must be a torch.Tensor"):
        poptorch.dynamic_slice(x, 0, 1, 2, 1)
    with pytest.raises(poptorch.Error, match="one element"):
        poptorch.dynamic_slice(x, 0, torch.tensor([0.5]), 2, 1)
    with pytest.raises(poptorch.Error, match="size must be at least 1.*must be different"):
        poptorch.dynamic_slice(x, 0, torch.tensor(0), 0, 1)
    with pytest.raises(poptorch.Error, match="end less than the start is not supported"):
        poptorch.dynamic_slice(x, 0, torch.tensor(2), -2, 1)
    with pytest.raises(poptorch.Error, match="same dtype"):
        poptorch.dynamic_update(x, torch.zeros(1, 4, dtype=torch.int32), 0, torch.tensor(0), 1)
    with pytest.raises(poptorch.Error, match=r"src must have shape \[2, 4\]"):
        poptorch.dynamic_update(x, torch.zeros(1, 4), 0, torch.tensor(0), 2)
    with pytest.raises(IndexError):  # past the end: an error when it runs, as on the CPU
        poptorch.dynamic_slice(x.to("ipu"), 0, torch.tensor(3).to("ipu"), 2, 1).cpu()


class TwoConvs(torch.nn.Module):
    def __init__(self, multi):
        super().__init__()
        self.a = torch.nn.Conv2d(2, 3, 3)
        self.b = torch.nn.Conv2d(2, 3, 1)
        self.multi = multi

    def forward(self, x):
        if self.multi is None:
            return self.a(x) + self.b(x)[..., 1:-1, 1:-1]
        with self.multi:
            y, z = self.a(x), self.b(x)
        return y + z[..., 1:-1, 1:-1]


def test_multiconv_computes_the_plain_convolutions():
    torch.manual_seed(0)
    multi = (poptorch.MultiConv().availableMemoryProportions((0.4, 0.5))
             .partialsTypes(torch.float).planType(poptorch.MultiConvPlanType.Parallel)
             .perConvReservedTiles(20).cycleBackOff(0.3).enableConvDithering([True, False]))
    model = TwoConvs(multi)
    reference = TwoConvs(None)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2 * 2, 2, 6, 6)
    wrapped = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    torch.testing.assert_close(wrapped(x), reference(x))


def test_multiconv_errors():
    with pytest.raises(poptorch.Error, match="in \\[0, 1\\)"):
        poptorch.MultiConv().availableMemoryProportions(1.5)
    # PopTorch's error types (both are poptorch.Error too) and words first.
    for bad in (torch.int32, "half", [torch.float, torch.int8], []):
        with pytest.raises(ValueError, match="^Invalid partials types") as raised:
            poptorch.MultiConv().partialsTypes(bad)
        assert isinstance(raised.value, poptorch.Error)
    with pytest.raises(AssertionError, match="^Invalid plan type") as raised:
        poptorch.MultiConv().planType("parallel")
    assert isinstance(raised.value, poptorch.Error)
    model = TwoConvs(poptorch.MultiConv().availableMemoryProportions([0.1, 0.2, 0.3]))
    with pytest.raises(poptorch.Error, match="3 values for 2 convolutions"):
        model(torch.randn(1, 2, 6, 6))


class _MisusedMultiConv(torch.nn.Module):
    def __init__(self, nested):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.nested = nested

    def forward(self, x):
        with poptorch.MultiConv():
            if self.nested:
                with poptorch.MultiConv():
                    return self.conv(x)
            return x * 2  # no convolution in the scope


@pytest.mark.parametrize("nested, message", [
    (True, "Nested poptorch.MultiConv is not supported"),
    (False, "Unexpected end_multi_conv: the poptorch.MultiConv scope ran no convolution")])
def test_multiconv_scopes_misused_in_a_wrapped_model(nested, message):
    """PopTorch's compiler refuses both; on the CPU its MultiConv does nothing."""
    x = torch.randn(1, 1, 5, 5)
    model = _MisusedMultiConv(nested)
    model(x)  # the CPU
    opts = poptorch.Options().showCompilationProgressBar(False)
    with pytest.raises(poptorch.Error, match=message):
        poptorch.inferenceModel(model, opts)(x)
    # the scope state is clean again: a proper scope works afterwards
    proper, reference = TwoConvs(poptorch.MultiConv()), TwoConvs(None)
    reference.load_state_dict(proper.state_dict())
    y = torch.randn(1, 2, 6, 6)
    torch.testing.assert_close(poptorch.inferenceModel(proper, opts.clone())(y), reference(y))

def test_serialized_matmul_is_the_product(device):
    a, b = torch.randn(4, 6), torch.randn(6, 8)
    for mode, factor in [(poptorch.MatMulSerializationMode.InputChannels, 2),
                         (poptorch.MatMulSerializationMode.ReducingDim, 3),
                         (poptorch.MatMulSerializationMode.OutputChannels, 4),
                         (poptorch.MatMulSerializationMode.Disabled, 0)]:
        out = poptorch.serializedMatMul(*_on(device, a, b), mode, factor)
        torch.testing.assert_close(out.cpu(), a @ b)
    with pytest.raises(poptorch.Error, match="must divide"):
        poptorch.serializedMatMul(a, b, poptorch.MatMulSerializationMode.ReducingDim, 4)


def test_identity_annotations(device):
    x = torch.ones(2, device=device)
    assert poptorch.set_available_memory(x, 0.3) is x
    nested = {"a": [x, (x,)]}
    assert poptorch.set_overlap_for_input(
        nested, poptorch.OverlapMode.OverlapAccumulationLoop) is nested
    assert poptorch.set_overlap_for_output(x, poptorch.OverlapMode.NoOverlap) is x
    with pytest.raises(poptorch.Error, match="between 0 and 1"):
        poptorch.set_available_memory(x, 1.5)
    with pytest.raises(poptorch.Error, match="OverlapMode"):
        poptorch.set_overlap_for_input(x, "overlap")
    with pytest.raises(poptorch.Error, match="torch.Tensor inputs"):
        poptorch.set_overlap_for_input([x, 1], poptorch.OverlapMode.NoOverlap)


class _Overlapping(torch.nn.Module):
    """Marks per PopTorch's rules (or, with ``wrong``, breaks one of them)."""

    def __init__(self, wrong=None):
        super().__init__()
        self.wrong = wrong

    def forward(self, x, y):
        mode = poptorch.OverlapMode.OverlapAccumulationLoop
        x = poptorch.set_overlap_for_input(x, mode)
        if self.wrong == "input":
            y = poptorch.set_overlap_for_input(y + 1, mode)  # not an input any more
        out = x * y
        total = poptorch.set_overlap_for_output(out.sum(), mode)
        if self.wrong == "output":
            return out  # the marked tensor is not returned
        return out, total


def test_overlap_marks_in_a_wrapped_model_follow_poptorch_rules():
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    opts = poptorch.Options().showCompilationProgressBar(False)
    out, total = poptorch.inferenceModel(_Overlapping(), opts)(x, y)
    torch.testing.assert_close(out, x * y)
    torch.testing.assert_close(total, (x * y).sum())
    with pytest.raises(poptorch.Error, match="set_overlap_for_input applied on a node which "
                       "is not a tensor input to the model"):
        poptorch.inferenceModel(_Overlapping("input"), opts.clone())(x, y)
    with pytest.raises(poptorch.Error, match="set_overlap_for_output applied on a node which "
                       "is not a tensor output to the model"):
        poptorch.inferenceModel(_Overlapping("output"), opts.clone())(x, y)
    _Overlapping("input")(x, y)  # on the CPU nothing is checked, as in PopTorch

def _fps_reference(src, ptr, ratio):
    """Farthest point sampling by its definition, point by point."""
    picked = []
    for start, end in zip(ptr[:-1], ptr[1:]):
        points = src[start:end]
        chosen = [0]
        for _ in range(math.ceil((end - start) * ratio) - 1):
            far = max(range(len(points)), key=lambda i: (min(
                float(((points[i] - points[j]) ** 2).sum()) for j in chosen), -i))
            chosen.append(far)
        picked += [start + c for c in chosen]
    return picked


def test_fps_samples_the_farthest_points(device):
    torch.manual_seed(0)
    src = torch.randn(13, 3)
    ptr = [0, 5, 13]
    out = poptorch.fps(src.to(device), ptr, 0.5)
    assert out.dtype == torch.int64 and out.cpu().tolist() == _fps_reference(src, ptr, 0.5)


def test_fps_random_start_in_an_inference_model():
    torch.manual_seed(0)

    class Sampler(torch.nn.Module):
        def forward(self, points):
            return poptorch.fps(points, [0, 6], 0.5, random_start=True)
    wrapped = poptorch.inferenceModel(Sampler(), poptorch.Options().randomSeed(3))
    points = torch.randn(6, 2)
    first = wrapped(points)
    assert first.shape == (3,) and len(set(first.tolist())) == 3
    # The chosen points are the farthest from the (random) first one.
    chosen = first.tolist()
    rest = [min(float(((points[i] - points[j]) ** 2).sum()) for j in chosen[:1])
            for i in range(6)]
    assert rest[chosen[1]] == max(rest)


def test_fps_errors():
    src = torch.zeros(4, 2)
    with pytest.raises(poptorch.Error, match="at least 2"):
        poptorch.fps(src, [0])
    with pytest.raises(poptorch.Error, match="rise from 0"):
        poptorch.fps(src, [0, 3])
    with pytest.raises(poptorch.Error, match="ratio"):
        poptorch.fps(src, [0, 4], 2.0)


def _nearest_reference(x, y, batch_x, batch_y):
    out = []
    for i, p in enumerate(x):
        candidates = [j for j in range(len(y)) if batch_y[j] == batch_x[i]]
        out.append(min(candidates, key=lambda j: (float(((p - y[j]) ** 2).sum()), j)))
    return out


@pytest.mark.parametrize("as_tensors", [False, True])
def test_nearest_within_each_sample(device, as_tensors):
    torch.manual_seed(0)
    x, y = torch.randn(7, 2), torch.randn(5, 2)
    batch_x, batch_y = [0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1]
    bx, by = ((torch.tensor(batch_x, device=device), torch.tensor(batch_y, device=device))
              if as_tensors else (batch_x, batch_y))
    out = poptorch.nearest(x.to(device), y.to(device), bx, by)
    assert out.cpu().tolist() == _nearest_reference(x, y, batch_x, batch_y)
    whole = poptorch.nearest(x.to(device), y.to(device))
    assert whole.cpu().tolist() == _nearest_reference(x, y, [0] * 7, [0] * 5)


def test_nearest_in_an_inference_model():
    class Model(torch.nn.Module):
        def forward(self, x, y):
            return poptorch.nearest(x, y, [0, 0, 1], [0, 1, 1])
    x, y = torch.randn(2 * 3, 2), torch.randn(2 * 3, 2)
    wrapped = poptorch.inferenceModel(Model(), poptorch.Options().deviceIterations(2))
    out = wrapped(x, y)
    assert out.tolist() == [v for a, b in zip(x.split(3), y.split(3))
                            for v in _nearest_reference(a, b, [0, 0, 1], [0, 1, 1])]


def test_nearest_errors():
    x = torch.zeros(3, 2)
    with pytest.raises(poptorch.Error, match="sorted"):
        poptorch.nearest(x, x, [1, 0, 0], [0, 0, 1])
    with pytest.raises(poptorch.Error, match="no point"):
        poptorch.nearest(x, x, [0, 0, 2], [0, 0, 1])
    with pytest.raises(poptorch.Error, match="both"):
        poptorch.nearest(x, x, [0, 0, 0], None)


def _brute_force_ctc(log_probs, blank, top):
    """Every labelling's probability, summing all its alignments."""
    time, classes = log_probs.shape
    totals = {}
    for path in itertools.product(range(classes), repeat=time):
        labels = tuple(c for i, c in enumerate(path) if c != blank and (i == 0 or c != path[i - 1]))
        p = math.exp(sum(float(log_probs[t, c]) for t, c in enumerate(path)))
        totals[labels] = totals.get(labels, 0.0) + p
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


def test_ctc_beam_search_with_a_wide_beam_finds_the_most_likely_labellings():
    torch.manual_seed(0)
    log_probs = torch.randn(5, 3).log_softmax(-1)
    best = decode_one(log_probs.tolist(), blank=0, beam_width=1000, top_paths=3)
    for (score, labels), (want_labels, want_p) in zip(best, _brute_force_ctc(log_probs, 0, 3)):
        assert labels == want_labels
        assert math.exp(score) == pytest.approx(want_p, rel=1e-9)


def test_ctc_beam_search_decoder_in_an_inference_model_matches_the_cpu():
    torch.manual_seed(42)

    class Decoder(torch.nn.Module):
        def forward(self, log_probs, lengths):
            return poptorch.ctc_beam_search_decoder(log_probs, lengths, 0, 8, 2)
    log_probs = torch.randn(9, 3, 5).log_softmax(-1)
    lengths = torch.tensor([9, 5, 7], dtype=torch.int32)
    cpu = Decoder()(log_probs, lengths)
    ipu = poptorch.inferenceModel(Decoder())(log_probs, lengths)
    assert [t.shape for t in ipu] == [(3, 2), (3, 2), (3, 2, 9)]
    for a, b in zip(ipu, cpu):
        torch.testing.assert_close(a, b)
    for b in range(3):
        best = decode_one(log_probs[:lengths[b], b].tolist(), 0, 8, 2)
        for rank, (score, labels) in enumerate(best):
            assert cpu[1][b, rank] == len(labels)
            assert cpu[2][b, rank, :len(labels)].tolist() == list(labels)
            assert not cpu[2][b, rank, len(labels):].any()


def test_ctc_beam_search_decoder_errors():
    log_probs = torch.zeros(4, 2, 3)
    lengths = torch.tensor([4, 4])
    with pytest.raises(poptorch.Error, match="shape \\[input_length"):
        poptorch.ctc_beam_search_decoder(log_probs[0], lengths)
    with pytest.raises(poptorch.Error, match="blank"):
        poptorch.ctc_beam_search_decoder(log_probs, lengths, blank=3)
    with pytest.raises(poptorch.Error, match="cannot exceed"):
        poptorch.ctc_beam_search_decoder(log_probs, lengths, beam_width=2, top_paths=3)
