"""Issue 9's reproductions, as a new user would run them: each numbered item of
"What users hit" (and the bullets of "What must hold" that a short script can
show) in a fresh interpreter, compared with the CPU.

    python scripts/issue9_reproductions.py            # every item
    python scripts/issue9_reproductions.py 2 8 11     # some

Each script asserts what the CPU does and prints "ok"; the table says which
held. The tests that prove each item for good are listed in docs/testing.md
("Issue 9 acceptance"); these scripts are the issue's own words, kept runnable.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, Tuple

ROOT = Path(__file__).resolve().parent.parent

# What every script starts with: a CPU-versus-ipu comparison of values,
# layouts and raised exception types.
PRELUDE = """
import copy, io, pickle, threading
import torch, torch.nn.functional as F, poptorch
torch.manual_seed(0)

def same(ipu, cpu, **tol):
    torch.testing.assert_close(ipu.cpu() if isinstance(ipu, torch.Tensor) else ipu, cpu, **tol)

def same_error(call):
    # The ipu raises what the CPU raises, at the call (no read follows it).
    try:
        call("cpu")
        expected = None
    except Exception as error:
        expected = type(error)
    try:
        call("ipu")
        got = None
    except Exception as error:
        got = type(error)
    assert got is expected, f"cpu raised {expected}, the ipu {got} at the call"
"""

ITEMS: Dict[str, Tuple[str, str]] = {}


def item(number: str, title: str, code: str) -> None:
    ITEMS[number] = (title, textwrap.dedent(code))


item("1", "mse/huber/smooth_l1/bce losses, lazy and in trainingModel", """
    a, b = torch.rand(4, 5), torch.rand(4, 5)
    losses = [F.mse_loss, F.huber_loss, F.smooth_l1_loss, F.binary_cross_entropy,
              lambda x, y, reduction: torch.nn.MSELoss(reduction=reduction)(x, y)]
    for fn in losses:
        for reduction in ("mean", "sum", "none"):
            ca, ia = a.clone().requires_grad_(), a.to("ipu").requires_grad_()
            cpu, ipu = fn(ca, b, reduction=reduction), fn(ia, b.to("ipu"), reduction=reduction)
            same(ipu, cpu)
            cpu.sum().backward(); ipu.sum().backward()
            same(ia.grad, ca.grad)

    class Net(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.lin, self.fn = torch.nn.Linear(5, 5), fn
        def forward(self, x, y):
            return self.fn(torch.sigmoid(self.lin(x)), y)

    for fn in (F.mse_loss, F.huber_loss, F.smooth_l1_loss, F.binary_cross_entropy):
        model = Net(fn); ref = copy.deepcopy(model)
        ipu = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
        opt = torch.optim.SGD(ref.parameters(), lr=0.5)
        for step in range(3):
            x, y = torch.randn(4, 5), torch.rand(4, 5)
            loss = ipu(x, y)
            opt.zero_grad(); expected = ref(x, y); expected.backward(); opt.step()
            same(loss, expected.detach(), rtol=1e-5, atol=1e-6)
    print("ok")
""")

item("2", "host reads inside wrapped models: guarded, never stale; the error names the line", """
    class Scales(torch.nn.Module):
        def forward(self, x):
            return x * x[0, 0].item()
    model = poptorch.inferenceModel(Scales())
    for v in (1.0, 2.0, 3.0, 2.0):
        x = torch.full((2, 3), v) + torch.arange(3.0)
        same(model(x), x * v)

    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)
        def forward(self, x, y):
            loss = (self.lin(x).squeeze(1) - y).pow(2).mean()
            return loss + 0.01 * torch.unique(x).sum() + 0.001 * x.nonzero().shape[0]
    model = Counts(); ref = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randint(0, 2 + step % 3, (4, 3), generator=g).float(), torch.randn(4)
        loss = ipu(x, y)
        opt.zero_grad(); expected = ref(x, y); expected.backward(); opt.step()
        same(loss, expected.detach(), rtol=1e-5, atol=1e-6)

    # A read whose value keeps changing: past the variants kept, an error naming
    # the user's line (here, the first thing forward does: no op captured before).
    import os
    os.environ["POPTORCH_MAX_STEP_VARIANTS"] = "2"
    class Reads(torch.nn.Module):
        def forward(self, x):
            n = int(x.sum().item())
            return x * n
    model = poptorch.inferenceModel(Reads())
    model(torch.ones(1, 2)); model(torch.full((1, 2), 2.0))
    try:
        model(torch.full((1, 2), 3.0))
        raise AssertionError("no error past the variants kept")
    except poptorch.Error as error:
        assert "<string>" in str(error) and "forward" in str(error), error
    print("ok")
""")

item("3", "Hugging Face BERT under trainingModel and inferenceModel", """
    import transformers
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=12, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=3)
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertForSequenceClassification(config)
        def forward(self, ids, mask, labels):
            out = self.bert(input_ids=ids, attention_mask=mask, labels=labels)
            return out.loss, out.logits
    def batch(step, padded):
        g = torch.Generator().manual_seed(step)
        ids, mask = torch.randint(0, 64, (4, 12), generator=g), torch.ones(4, 12, dtype=torch.long)
        if padded:
            mask[1:, -3:] = 0
        return ids, mask, torch.randint(0, 3, (4,), generator=g)
    model = WithLoss(); ref = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05))
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step, padded in enumerate([False, True, False, True]):
        loss, _ = ipu(*batch(step, padded))
        opt.zero_grad(); expected, _ = ref(*batch(step, padded)); expected.backward(); opt.step()
        same(loss, expected.detach(), rtol=1e-4, atol=1e-5)
    ipu.destroy()
    ref.eval(); model.eval()
    infer = poptorch.inferenceModel(model)
    for step, padded in enumerate([True, False]):
        with torch.no_grad():
            expected = ref(*batch(step, padded))
        for got, want in zip(infer(*batch(step, padded)), expected):
            same(got, want, rtol=1e-4, atol=1e-5)
    print("ok")
""")

item("4", "torch.save/load, pickle, deepcopy of ipu tensors and state dicts", """
    model = torch.nn.Linear(3, 2).to("ipu")
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    buffer = io.BytesIO(); torch.save(model.state_dict(), buffer)
    for location in (None, "cpu", "ipu"):
        buffer.seek(0)
        loaded = torch.load(buffer, map_location=location)
        for k, v in loaded.items():
            assert v.device.type == (location or "ipu"), (k, v.device)
            same(v, expected[k])
    t = torch.randn(3, 4).to("ipu") * 2  # pending
    for copied in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t)):
        assert copied.device.type == "ipu"
        same(copied, t.cpu())
    print("ok")
""")

item("5", "an optimiser state loaded before wrapping is the state the training resumes from", """
    def make(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3))
        return model, torch.optim.Adam(model.parameters(), lr=0.01)
    def data(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    class WithLoss(torch.nn.Module):
        def __init__(self, model):
            super().__init__(); self.model = model
        def forward(self, x, y):
            return F.cross_entropy(self.model(x), y)
    model, opt = make(0)
    for step in range(3):
        opt.zero_grad(); F.cross_entropy(model(*data(step)[:1]), data(step)[1]).backward(); opt.step()
    ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    for step in range(3, 6):
        opt.zero_grad(); F.cross_entropy(model(*data(step)[:1]), data(step)[1]).backward(); opt.step()
    resumed, resumed_opt = make(1)
    resumed.load_state_dict(ckpt["model"]); resumed_opt.load_state_dict(ckpt["opt"])
    ipu = poptorch.trainingModel(WithLoss(resumed), optimizer=resumed_opt)
    for step in range(3, 6):
        ipu(*data(step))
    ipu.copyWeightsToHost()
    for got, want in zip(resumed.parameters(), model.parameters()):
        same(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)
    print("ok")
""")

item("6", "one wrapped model called from several threads", """
    model = torch.nn.Linear(16, 8)
    ipu = poptorch.inferenceModel(copy.deepcopy(model))
    failures = []
    def calls(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(20):
            x = torch.randn(4, 16, generator=g)
            try:
                with torch.no_grad():
                    same(ipu(x), model(x), rtol=1e-5, atol=1e-6)
            except Exception as error:
                failures.append(error)
    threads = [threading.Thread(target=calls, args=(seed,)) for seed in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not failures, failures[0]
    print("ok")
""")

item("7a", "POPTORCH_STREAM_NODES: a forked child syncs", """
    import os
    os.environ["POPTORCH_STREAM_NODES"] = "3"  # read at the first op
    x = torch.ones(4, device="ipu")
    for _ in range(10): x = x + 1
    pid = os.fork()
    if pid == 0:
        y = torch.ones(4, device="ipu") * 3
        os._exit(0 if torch.equal(y.cpu(), torch.full((4,), 3.0)) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, status
    same(x, torch.full((4,), 11.0))
    print("ok")
""")

item("7b", "Ctrl-C raised in a Python Meta kernel reaches the caller", """
    lib = torch.library.Library("issue9", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    ran = []
    def host(x):
        ran.append(1); return x * 2
    def meta(x):
        raise KeyboardInterrupt
    lib.impl("twice", host, "CPU"); lib.impl("twice", meta, "Meta")
    x = torch.ones(3, device="ipu")
    try:
        torch.ops.issue9.twice(x)
        raise AssertionError("the interrupt was swallowed")
    except KeyboardInterrupt:
        pass
    assert not ran, "the op ran on the host"
    same(x + 1, torch.full((3,), 2.0))
    print("ok")
""")

item("8", "empty max/min, copy_(2.0), strides of results, batch norm eval, embedding_bag", """
    for op in (torch.max, torch.min):
        same_error(lambda d: op(torch.empty(0, device=d) + 1))
    x = torch.ones(3, device="ipu") * 5
    x.copy_(2.0)
    same(x, torch.full((3,), 2.0))
    t = torch.randn(3, 4).t()
    for f in (lambda u: u.half(), lambda u: u.int(), lambda u: u.abs(), lambda u: u + 1):
        assert f(t.to("ipu")).stride() == f(t).stride()
        try:
            f(t).view(-1); cpu_ok = True
        except RuntimeError:
            cpu_ok = False
        try:
            f(t.to("ipu")).view(-1); ipu_ok = True
        except RuntimeError:
            ipu_ok = False
        assert cpu_ok == ipu_ok
    image = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    conv, bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(3)
    for m in (conv, bn, torch.nn.GroupNorm(1, 3)):
        want = m(image)
        got = copy.deepcopy(m).to("ipu")(image.to("ipu"))
        assert got.stride() == want.stride(), (m, got.stride(), want.stride())
        same(got, want.detach(), rtol=1e-5, atol=1e-5)
    out_cpu, out_ipu = torch.empty(0), torch.empty(0, device="ipu")
    torch.add(t, 1, out=out_cpu); torch.add(t.to("ipu"), 1, out=out_ipu)
    assert out_ipu.stride() == out_cpu.stride()
    args = [torch.randn(2, 3, 4), torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3)]
    want = torch.native_batch_norm(*args, False, 0.1, 1e-5)
    got = torch.native_batch_norm(*[a.to("ipu") for a in args], False, 0.1, 1e-5)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        same(g, w)
    weight = torch.randn(10, 3)
    for offsets in ([0, 2, 2, 5], [0, 0, 1], [0, 6]):
        for last in (False, True):
            for mode in ("sum", "mean", "max"):
                ids, off = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor(offsets)
                want = F.embedding_bag(ids, weight, off, mode=mode, include_last_offset=last)
                got = F.embedding_bag(ids.to("ipu"), weight.to("ipu"), off.to("ipu"), mode=mode,
                                      include_last_offset=last)
                same(got, want)
    print("ok")
""")

item("9", "a bounded executable cache, evictions in metrics()", """
    capacity = poptorch._C.executable_cache_capacity()
    for n in range(1, 1001):
        x = torch.arange(n, dtype=torch.float32)
        same((x.to("ipu") * 2 + 1), x * 2 + 1)
    m = poptorch.metrics()
    assert poptorch._C.executable_cache_size() <= capacity, poptorch._C.executable_cache_size()
    assert m["cache_evictions"] >= 1000 - capacity, m["cache_evictions"]
    print("ok")
""")

item("11", "errors at the call, poisoned results, out= views, max_unpool2d, mode(out=), uint8 masks", """
    same_error(lambda d: F.elu_(torch.randn(1, device=d).expand(4)))
    same_error(lambda d: torch.empty(3, device=d).random_(5, 2))
    same_error(lambda d: torch.neg(torch.randn(3, device=d),
                                   out=torch.empty(3, dtype=torch.complex64, device=d)))
    # An error only the run can find: raised at the first read of what depends
    # on it, never at an unrelated read, never garbage.
    x = torch.arange(4.0, device="ipu")
    bad = x[torch.tensor([1, 9], device="ipu")]
    fine = x * 2
    same(fine, torch.arange(4.0) * 2)
    for read in (lambda: bad.cpu(), lambda: (bad + 1).cpu()):
        try:
            read(); raise AssertionError("a failed graph's result read back")
        except IndexError:
            pass
    for factory, args in ((torch.arange, (0.0, 5.0)), (torch.linspace, (0.0, 1.0, 5)),
                          (torch.logspace, (0.0, 1.0, 5))):
        cpu, ipu = torch.zeros(12), torch.zeros(12, device="ipu")
        factory(*args, out=cpu[2:7]); factory(*args, out=ipu[2:7])
        same(ipu, cpu)
    values = torch.randn(2, 3, 8, 8)
    pooled, indices = F.max_pool2d(values, 2, return_indices=True)
    strided = pooled.transpose(2, 3).contiguous().transpose(2, 3)
    ind = indices.transpose(2, 3).contiguous().transpose(2, 3)
    same(F.max_unpool2d(strided.to("ipu"), ind.to("ipu"), 2), F.max_unpool2d(strided, ind, 2))
    v = torch.tensor([[1, 2, 2, 3], [4, 4, 5, 5]])
    cpu_out = (torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))
    ipu_out = tuple(t.to("ipu") for t in cpu_out)
    torch.mode(v, 1, out=cpu_out); torch.mode(v.to("ipu"), 1, out=ipu_out)
    for g, w in zip(ipu_out, cpu_out):
        same(g, w)
    # torch 2.13's CPU refuses a uint8 mask with a scalar (masked_fill_) and
    # takes it with values (deprecated): the ipu the same.
    import warnings
    warnings.simplefilter("ignore")
    def fill(d, value):
        x = torch.zeros(5, device=d)
        x[torch.tensor([1, 0, 1, 0, 0], dtype=torch.uint8, device=d)] = value(d)
        return x
    same_error(lambda d: fill(d, lambda d: 1.0))
    same(fill("ipu", lambda d: torch.tensor([3.0, 4.0], device=d)),
         fill("cpu", lambda d: torch.tensor([3.0, 4.0])))
    print("ok")
""")

item("float64", "lazy mode refuses float64; wrapped models demote it with one warning", """
    import warnings
    try:
        torch.ones(2, dtype=torch.float64, device="ipu")
        raise AssertionError("float64 accepted in lazy mode")
    except TypeError as error:
        assert "float64" in str(error) or "Double" in str(error), error
    model = poptorch.inferenceModel(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = model(x), model(x)
    assert first.dtype == torch.float32
    same(first, model.model(x.float()).detach())
    print("ok")
""")


def run(number: str) -> Tuple[bool, str, float]:
    """Runs one item's script in a fresh interpreter: (held, what it said, seconds)."""
    _, code = ITEMS[number]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    start = time.monotonic()
    try:
        result = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True,
                                text=True, env=env, timeout=900, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return False, "timed out after 900 s", time.monotonic() - start
    elapsed = time.monotonic() - start
    if result.returncode == 0 and result.stdout.strip().endswith("ok"):
        return True, "", elapsed
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    return False, "\n".join(lines[-6:]) or f"exit {result.returncode}", elapsed


def main() -> int:
    chosen = sys.argv[1:] or list(ITEMS)
    unknown = [n for n in chosen if n not in ITEMS]
    if unknown:
        print(f"unknown items {unknown}: choose among {list(ITEMS)}", file=sys.stderr)
        return 2
    failed = 0
    for number in chosen:
        held, said, seconds = run(number)
        failed += not held
        print(f"{number:>7}  {'holds' if held else 'FAILS'}  {ITEMS[number][0]}  ({seconds:.0f} s)")
        if said:
            print(textwrap.indent(said, " " * 9))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
