"""Small differences from the CPU that users met: each compared with the CPU."""
import pytest
import torch
import torch.nn.functional as F

import poptorch

from conftest import assert_same


@pytest.mark.parametrize("op", ["max", "min", "amax", "amin", "argmax", "argmin"])
def test_reducing_an_empty_tensor_with_pending_ops_raises_as_on_the_cpu(op):
    errors = {}
    for device in ("cpu", "ipu"):
        empty = torch.ones(0, device=device) * 2  # a pending op on the ipu
        with pytest.raises((RuntimeError, IndexError), match="Expected reduction dim") as error:
            getattr(empty, op)().cpu()
        errors[device] = error.type
    assert errors["ipu"] is errors["cpu"]


@pytest.mark.parametrize("value", [2.0, 3, True, torch.tensor(2.5, dtype=torch.float64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float16])
def test_copying_a_python_or_float64_scalar_into_a_pending_tensor(value, dtype):
    """x.copy_(2.0) copies from a float64 scalar: it converts, as on the CPU."""
    results = {}
    for device in ("cpu", "ipu"):
        x = torch.arange(6, device=device).to(dtype) * 2  # pending on the ipu
        source = value if not isinstance(value, (int, float)) else torch.tensor(value)
        x.copy_(source)
        results[device] = x
    assert_same(results["cpu"], results["ipu"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_with_offsets_matches_the_cpu(mode, include_last_offset, dtype):
    weight = torch.randn(5, 4).to(dtype)
    indices = torch.tensor([0, 1, 1, 0, 1, 4])
    offsets = torch.tensor([0, 3, 6]) if include_last_offset else torch.tensor([0, 3])
    expected = F.embedding_bag(indices, weight, offsets, mode=mode,
                               include_last_offset=include_last_offset)
    actual = F.embedding_bag(indices.to("ipu"), weight.to("ipu"), offsets.to("ipu"), mode=mode,
                             include_last_offset=include_last_offset)
    assert_same(expected, actual)


def test_embedding_bag_gradients_match_the_cpu():
    grads = {}
    for device in ("cpu", "ipu"):
        weight = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)).to(device)
        weight.requires_grad_()
        F.embedding_bag(torch.tensor([0, 1, 1, 4], device=device), weight,
                        torch.tensor([0, 2, 4], device=device), mode="mean",
                        include_last_offset=True).sum().backward()
        grads[device] = weight.grad
    assert_same(grads["cpu"], grads["ipu"])


def test_a_result_the_kernel_leaves_conjugated_has_the_cpu_values():
    """linalg_lu_solve(left=False) leaves its complex result lazily conjugated."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex64, generator=g) + 3 * torch.eye(3)
    b = torch.randn(4, 3, dtype=torch.complex64, generator=g)
    lu, pivots = torch.linalg.lu_factor(a)
    expected = torch.linalg.lu_solve(lu, pivots, b, left=False, adjoint=True)
    actual = torch.linalg.lu_solve(lu.to("ipu"), pivots.to("ipu"), b.to("ipu"), left=False,
                                   adjoint=True)
    assert_same(expected, actual)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunked_linear_cross_entropy_accumulates_as_on_the_cpu(dtype):
    """PyTorch picks the accumulation dtype by device type; the ipu takes the CPU's (float32)."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g).to(dtype), torch.randn(32, 16, generator=g).to(dtype)
    target = torch.randint(0, 32, (8,), generator=g)
    options = LinearCrossEntropyOptions(batch_chunk_size=2)
    expected = F.linear_cross_entropy(x, w, target, reduction="none", options=options)
    actual = F.linear_cross_entropy(x.to("ipu"), w.to("ipu"), target.to("ipu"), reduction="none",
                                    options=options)
    assert_same(expected, actual, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_mode_into_out_tensors_matches_the_cpu(dtype):
    """mode's generic out= kernel refused devices other than CPU, CUDA and XPU."""
    x = torch.tensor([[1, 2, 2, 3], [4, 4, 1, 1], [5, 6, 7, 7]], dtype=dtype)
    out = {d: (torch.empty(0, dtype=dtype, device=d), torch.empty(0, dtype=torch.long, device=d))
           for d in ("cpu", "ipu")}
    # Views as out= tensors: the results land in their bases.
    views = {d: torch.zeros(3, 2, dtype=dtype, device=d) for d in ("cpu", "ipu")}
    for d in ("cpu", "ipu"):
        torch.mode(x.to(d), 1, out=out[d])
        torch.mode(x.to(d), 1, out=(views[d][:, 1], torch.empty(3, dtype=torch.long, device=d)))
    assert_same(out["cpu"], out["ipu"])
    assert_same(views["cpu"], views["ipu"])
    assert_same(torch.mode(x, 0, keepdim=True), torch.mode(x.to("ipu"), 0, keepdim=True))


def test_mode_gradients_match_the_cpu():
    x = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 0.5]])
    grads = {}
    for d in ("cpu", "ipu"):
        leaf = x.to(d).detach().requires_grad_()
        (torch.mode(leaf, 1).values * torch.tensor([2.0, 3.0], device=d)).sum().backward()
        grads[d] = leaf.grad
    assert_same(grads["cpu"], grads["ipu"])



@pytest.mark.parametrize("default", [torch.bfloat16, torch.float16])
def test_integer_inputs_promote_to_the_default_dtype_of_each_call(default):
    """True division and sqrt of integer tensors give the default dtype: a change of it
    between two calls of one signature gives the new dtype, as on the CPU."""
    a, b = torch.tensor([7, -9, 1001]), torch.tensor([2, 4, 3])
    results = {}
    for d in ("cpu", "ipu"):
        # Each result is read under the default dtype of its call: the run still computes in
        # the default dtype of the time it runs (docs/pytorch_tests.md, "What float64 hid").
        first = (a.to(d) / b.to(d)).cpu()  # float32: a signature seen before
        torch.set_default_dtype(default)
        try:
            results[d] = [first, (a.to(d) / b.to(d)).cpu(), torch.sqrt(a.abs().to(d)).cpu()]
        finally:
            torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(results["ipu"], results["cpu"])


@pytest.mark.parametrize("stat_shape", [(3,), (5,), (0,)])
@pytest.mark.parametrize("training", [False, True])
def test_native_batch_norm_out_leaves_or_resizes_the_saved_statistics_as_the_cpu(
        training, stat_shape):
    """Out of training the CPU leaves save_mean/save_invstd as they are; training resizes them."""
    results = {}
    for d in ("cpu", "ipu"):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4, 3, 5, generator=g).to(d)
        w, b = torch.rand(3, generator=g).to(d), torch.rand(3, generator=g).to(d)
        running_mean, running_var = torch.zeros(3, device=d), torch.ones(3, device=d)
        outs = (torch.empty(4, 3, 5, device=d), torch.full(stat_shape, 7.0, device=d),
                torch.full(stat_shape, 7.0, device=d))
        returned = torch.native_batch_norm(x, w, b, running_mean, running_var, training, 0.1,
                                           1e-5, out=outs)
        results[d] = [*outs, *returned, running_mean, running_var]
    for cpu, ipu in zip(results["cpu"], results["ipu"]):
        assert (ipu.shape, ipu.stride()) == (cpu.shape, cpu.stride())
        assert_same(cpu, ipu)


@pytest.mark.parametrize("args", [(0,), (1,), (7,), (7, False), (7, True, 3.5), (2048, False, 30.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kaiser_window_is_the_cpus(args, dtype):
    """Its generic kernel fills the window through a per-device-type kernel the ipu has none of:
    it raised 'DispatchStub: unsupported device type' (PyTorch's test_kaiser_window)."""
    window = torch.kaiser_window(*args, dtype=dtype, device="ipu:1")
    assert window.device == torch.device("ipu:1")
    assert_same(torch.kaiser_window(*args, dtype=dtype), window, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32, torch.int32])
def test_conj_physical_in_place_is_the_cpus(dtype):
    """Its generic kernel calls the CPU's out= kernel directly, which picks a per-device-type
    kernel the ipu has none of: complex tensors raised 'DispatchStub: unsupported device type'
    (PyTorch's test_variant_consistency_eager)."""
    x = (torch.randn(2, 5, dtype=torch.complex64) * 4).to(dtype)
    on_cpu, on_ipu = x.clone(), x.to("ipu")
    view = on_ipu[:, 1:4]  # in place through a view writes the base's storage
    assert view.conj_physical_() is view
    on_cpu[:, 1:4].conj_physical_()
    assert_same(on_cpu, on_ipu, rtol=0, atol=0)


def test_grouped_mm_is_the_cpus_and_reads_no_offsets_on_the_host():
    """Its generic kernel (its only one) copies the group offsets to the host to multiply
    group by group: a wrapped mixture-of-experts model (Hugging Face's Mixtral) was captured
    again for every batch's routing. It captures whole, forward and backward."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(10, 8, generator=g)
    b = torch.randn(3, 8, 4, generator=g)
    upstream = torch.randn(10, 4, generator=g)
    offsets = [torch.tensor(o, dtype=torch.int32) for o in ([3, 3, 10], [0, 6, 10], [5, 9, 10])]
    results = {}
    for device in ("cpu", "ipu"):
        results[device] = []
        for offs in offsets:
            x = a.to(device, copy=True).requires_grad_()
            w = b.to(device, copy=True).requires_grad_()
            y = F.grouped_mm(x, w, offs=offs.to(device))
            (y * upstream.to(device)).sum().backward()
            results[device] += [y, x.grad, w.grad]
    for cpu, ipu in zip(results["cpu"], results["ipu"]):
        assert_same(cpu, ipu, rtol=1e-6, atol=1e-6)

    class Experts(torch.nn.Module):
        def forward(self, x, w, offs):
            return F.grouped_mm(x, w, offs=offs)

    model = poptorch.inferenceModel(Experts())
    for step, offs in enumerate(offsets):
        torch.testing.assert_close(model(a, b, offs), F.grouped_mm(a, b, offs=offs),
                                   rtol=1e-6, atol=1e-6)
        if step == 0:
            compiled = poptorch.metrics()["graphs_compiled"]
    assert poptorch.metrics()["graphs_compiled"] == compiled, "specialised on the offsets"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_grouped_mm_of_the_cpus_dtypes_captures_in_lazy_mode(dtype):
    """PyTorch's Meta kernel for _grouped_mm takes bfloat16 only (CUDA's rule): a float32 or
    float16 one ran on the host, a graph break. The CPU's result (its dtype, the inputs') and
    the CPU's errors at the call (strides not 16-byte aligned, out_dtype another dtype)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(10, 8, generator=g), torch.randn(3, 8, 8, generator=g)
    upstream = torch.randn(10, 8, generator=g)  # not expanded: the CPU refuses zero strides
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)
    poptorch.reset_metrics()
    results = {}
    for device in ("cpu", "ipu"):
        x = a.to(device=device, dtype=dtype, copy=True).requires_grad_()
        w = b.to(device=device, dtype=dtype, copy=True).requires_grad_()
        y = F.grouped_mm(x, w, offs=offs.to(device))
        (y.float() * upstream.to(device)).sum().backward()
        results[device] = [y, x.grad, w.grad]
    for cpu, ipu in zip(results["cpu"], results["ipu"]):
        assert_same(cpu, ipu, rtol=0, atol=0)
    assert poptorch.metrics()["fallback_ops"] == {}, poptorch.metrics()["fallback_ops"]
    bad_calls = {
        "strides should be multiple of 16 bytes": lambda d: (
            a[:, :6].contiguous().to(d, dtype), b[:, :6].contiguous().to(d, dtype), {}),
        "output dtype must match": lambda d: (a.to(d, dtype), b.to(d, dtype), {
            "out_dtype": torch.float16 if dtype != torch.float16 else torch.float32}),
    }
    for message, arguments in bad_calls.items():
        for device in ("cpu", "ipu"):
            x, w, kwargs = arguments(device)
            with pytest.raises(RuntimeError, match=message):
                torch._grouped_mm(x, w, offs.to(device), **kwargs)


@pytest.mark.parametrize("op", [
    lambda x: torch.linalg.pinv(x),
    lambda x: torch.linalg.pinv(x, atol=0.5),
    lambda x: torch.linalg.pinv(x, rtol=0.3),
    lambda x: torch.linalg.pinv(x @ x.mT, hermitian=True),
    lambda x: torch.pinverse(x, rcond=0.2),
    lambda x: torch.linalg.matrix_rank(x),
    lambda x: torch.linalg.matrix_rank(x, atol=1.0, rtol=0.1),
    lambda x: torch.linalg.matrix_rank(x @ x.mT, hermitian=True),
    lambda x: torch.linalg.matrix_rank(x, tol=0.5),
], ids=["pinv", "pinv_atol", "pinv_rtol", "pinv_hermitian", "pinverse", "matrix_rank",
        "matrix_rank_tolerances", "matrix_rank_hermitian", "matrix_rank_tol"])
@pytest.mark.parametrize("mode", ["grad", "inference_mode"])
def test_tolerances_of_pinv_and_matrix_rank_work_in_float32(op, mode):
    """The CPU computes their default tolerances as float64 tensors (also in float32), which
    the ipu refused; they are the ops' own, and the results are the CPU's."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 5, 4, generator=g)
    a[0, :, 3] = a[0, :, 0] + 1e-7  # a rank the tolerance decides
    results = {}
    for device in ("cpu", "ipu"):
        x = a.to(device, copy=True)
        if mode == "grad":
            x.requires_grad_()
            result = op(x)
            if result.is_floating_point():
                result.sum().backward()
                results[device] = [result, x.grad]
                continue
            results[device] = [result]
        else:
            with torch.inference_mode():
                results[device] = [op(x)]
    for cpu, ipu in zip(results["cpu"], results["ipu"]):
        assert_same(cpu, ipu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("variant", ["functional", "out", "inplace"])
def test_ldexp_of_integer_exponents_is_the_cpus(dtype, variant):
    """ldexp's generic kernel calls std::ldexp for the CPU and CUDA only; on other devices it
    multiplies by 2 ** exponent computed in the input's dtype, so a float16 2 ** -25 was 0 and
    2 ** 20 inf where the CPU gives -2 ** -24 and 1024 (PyTorch's test_ldexp)."""
    results = {}
    for device in ("cpu", "ipu"):
        mantissas = torch.tensor([-2.0, 2.0**-10, 0.75, 3.0], dtype=dtype, device=device)
        exponents = torch.tensor([-25, 20, -130, 127], device=device)
        if variant == "functional":
            results[device] = torch.ldexp(mantissas, exponents)
        elif variant == "out":
            results[device] = torch.ldexp(mantissas, exponents, out=torch.empty_like(mantissas))
        else:
            results[device] = mantissas.ldexp_(exponents)
    assert_same(results["cpu"], results["ipu"], rtol=0, atol=0)


@pytest.mark.parametrize("exponent_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mantissa_dtype", [torch.bool, torch.uint8, torch.int32, torch.int64])
@pytest.mark.parametrize("mantissa_shape", [(4,), ()])
def test_ldexp_of_an_integer_tensor_by_a_0_dim_exponent_has_the_cpus_dtype(
        mantissa_dtype, exponent_dtype, mantissa_shape):
    """The CPU raises the Python scalar 2.0 to a 0-dim exponent, which keeps a float16 or
    bfloat16 exponent's dtype: ldexp(int32 tensor, 0-dim float16) is float16. Its Meta kernel
    (a Python decomposition) raises a float32 2, and the ipu's result was float32."""
    results = {}
    for device in ("cpu", "ipu"):
        mantissas = torch.tensor([1, 0, 3, 1], device=device).to(mantissa_dtype)
        mantissas = mantissas.reshape(mantissa_shape) if mantissa_shape else mantissas[0]
        exponent = torch.tensor(1.5, dtype=exponent_dtype, device=device)
        results[device] = torch.ldexp(mantissas, exponent)
    assert_same(results["cpu"], results["ipu"], rtol=0, atol=0)


@pytest.mark.parametrize(
    "op",
    [
        lambda a: torch.linalg.cholesky_ex(a, check_errors=True),
        lambda a: torch.linalg.inv_ex(a, check_errors=True),
        lambda a: torch.linalg.solve_ex(a, torch.ones(3, device=a.device), check_errors=True),
    ],
)
def test_check_errors_raises_at_the_call_as_on_the_cpu(op):
    """The CPU raises the error the data gives at the call (CUDA synchronises for it); the ipu
    raised it at the first read of a result (PyTorch's test_linalg test_cholesky_ex_non_pd)."""
    errors = {}
    for device in ("cpu", "ipu"):
        singular = torch.eye(3, device=device)
        singular[-1, -1] = 0
        with pytest.raises(torch.linalg.LinAlgError) as error:
            op(singular)  # no read of a result
        errors[device] = str(error.value)
    # The CPU's message, then where the ipu ran it.
    assert errors["ipu"].startswith(errors["cpu"])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", [(10,), (1, 10), (5, 10)])
def test_a_result_the_meta_kernel_sizes_otherwise_has_the_cpus_size(shape, reduction):
    """PyTorch's Meta kernel of multilabel_margin_loss (a decomposition) gives the unreduced
    loss of a 1-D input the shape [1], the CPU kernel []: the ipu raised "the host kernel
    returned a result of shape [] where its Meta kernel predicted [1]" at the first read
    (PyTorch's test_modules test_cpu_gpu_parity). Its gradient is compared too."""
    torch.manual_seed(0)
    inputs = torch.randn(shape)
    target = torch.randint(-1, shape[-1], shape)
    results, grads = {}, {}
    for device in ("cpu", "ipu"):
        x = inputs.to(device).detach().requires_grad_()
        loss = F.multilabel_margin_loss(x, target.to(device), reduction=reduction)
        assert loss.shape == F.multilabel_margin_loss(inputs, target, reduction=reduction).shape
        loss.backward(torch.full_like(loss, 0.5))
        results[device], grads[device] = loss, x.grad
    assert_same(results["cpu"], results["ipu"], rtol=0, atol=0)
    assert_same(grads["cpu"], grads["ipu"], rtol=0, atol=0)
