"""llmk.nn.QuantizedLinear on llmk's block kernels (Q8_0 for 8 bits, Q4_0 for 4), against the
float64 product of its own integers and scales: on the CPU always, on CUDA where there is a GPU
and a CUDA build of llmk._C. Also the paths it falls back to and the errors it raises."""

import pytest

torch = pytest.importorskip("torch")

import llmk  # noqa: E402
import llmk.nn  # noqa: E402
import llmk.ops as L  # noqa: E402
from llmk._C import ops as _C  # noqa: E402

U32 = 2.0**-24  # float32's unit roundoff


def make(N, K, bits, group, bias, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=g))
    return llmk.nn.QuantizedLinear.from_float(lin, bits=bits, group_size=group).to(device)


def reference(q, x):
    """The float64 product over q's integers and scales (the bias as forward passes it, in x's
    dtype), and the sum of the terms' magnitudes (what the rounding of any summation order is
    bounded by)."""
    w = q.dequantize().double()
    xd = x.double().reshape(-1, q.in_features)
    out = xd @ w.t()
    if q.bias is not None:
        out += q.bias.to(x.dtype).double()
    mag = xd.abs() @ w.abs().t()
    return out, mag


def kernel_rows():
    return [s for s in L.stats() if s["op"] == "QuantizedLinear"]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("N,K,group,M", [(40, 96, 32, 1), (77, 256, 128, 5), (64, 384, 64, 17),
                                         (3, 32, 96, 2)])
def test_cpu_block_kernel_matches_its_integers(bits, N, K, group, M):
    q = make(N, K, bits, group, bias=M % 2 == 1, seed=N + K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M))
    L.reset_stats()
    with torch.no_grad():
        got = q(x)
    (row,) = kernel_rows()
    assert row == {"op": "QuantizedLinear", "kernel": f"q{bits}_0 blocks", "calls": 1,
                   "reason": ""}, row
    want, mag = reference(q, x)
    # Products of an f16 scale, an integer and an f32 input are exact in float64; the kernel's
    # float32 sums are within K u32 of the terms' magnitudes (plus the output's rounding).
    err = (got.double() - want).abs()
    bound = (K + 2) * U32 * (mag + want.abs())
    assert (err <= bound).all(), (err - bound).max()


def test_cpu_leading_dimensions_and_empty_batches():
    q = make(24, 64, 8, 32, bias=True, seed=1)
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        got = q(x)
        assert got.shape == (2, 3, 24)
        want, _ = reference(q, x)
        torch.testing.assert_close(got.double().reshape(-1, 24), want, rtol=1e-5, atol=1e-5)
        assert q(torch.randn(0, 64)).shape == (0, 24)


def test_the_blocks_follow_changes_to_the_weights():
    q = make(16, 64, 4, 64, bias=False, seed=2)
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = q(x)
        q.qweight[5, 7] = -q.qweight[5, 7] if q.qweight[5, 7] != 0 else 3
        after = q(x)
        want, _ = reference(q, x)
    torch.testing.assert_close(after.double(), want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(before[:, 5], after[:, 5])
    assert torch.equal(before[:, :5], after[:, :5])


def test_reference_paths_say_why():
    q = make(16, 64, 8, 32, bias=True, seed=3)
    L.reset_stats()
    x = torch.randn(2, 64, requires_grad=True)
    y = q(x)
    y.sum().backward()  # the reference path keeps autograd for x
    assert x.grad is not None and x.grad.shape == x.shape
    with torch.no_grad():
        q.scales.mul_(1.0 + 2.0**-20)  # no longer float16 values
        q(torch.randn(2, 64))
        q64 = make(16, 64, 8, 32, bias=False, seed=3).double()
        q64(torch.randn(2, 64, dtype=torch.float64))
    reasons = {r["reason"] for r in kernel_rows()}
    assert "x requires grad: the block kernels are forward only" in reasons
    assert "scales that are not float16 values (the blocks store float16)" in reasons
    assert any("torch.float64" in r for r in reasons), reasons


def test_out_of_range_integers_are_an_error():
    q = make(8, 32, 4, 32, bias=False, seed=5)
    with torch.no_grad():
        q.qweight[1, 3] = 9  # 4 bits hold -8 .. 7
        with pytest.raises(llmk.Error,
                           match=r"row 1: q4_0 holds integers in \[-8, 7\], but weight 3 is 9"):
            q(torch.randn(1, 32))


def test_pack_checks_its_arguments():
    q = torch.zeros(2, 64, dtype=torch.int8)
    s = torch.ones(2, 2)
    dst = torch.empty(2 * 2 * 34, dtype=torch.uint8)
    with pytest.raises(llmk.Error, match="unknown block type 'q3_0'"):
        _C.pack_symmetric(dst, q, s, "q3_0", False)
    with pytest.raises(llmk.Error, match=r"scales: .* where \[2, 2\] is needed"):
        _C.pack_symmetric(dst, q, torch.ones(2, 3), "q8_0", False)
    with pytest.raises(llmk.Error, match="bytes are needed"):
        _C.pack_symmetric(dst[:10], q, s, "q8_0", False)
    with pytest.raises(llmk.Error, match="not a float16 value"):
        _C.pack_symmetric(dst, q, s * (1 + 2.0**-20), "q8_0", False)


cuda = pytest.mark.skipif(not (torch.cuda.is_available() and _C.cuda),
                          reason="needs a GPU and a CUDA build of llmk")


@cuda
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("N,K,group,M", [(77, 256, 128, 1), (300, 1024, 128, 3),
                                         (4096, 4096, 128, 16), (129, 512, 64, 17),
                                         (1000, 2048, 128, 300)])
def test_cuda_block_kernels_match_their_integers(bits, N, K, group, M):
    q = make(N, K, bits, group, bias=M % 2 == 1, seed=N + K, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16)
    L.reset_stats()
    with torch.no_grad():
        got = q(x)
    (row,) = kernel_rows()
    assert row["kernel"] == f"q{bits}_0 blocks", row
    want, mag = reference(q, x)
    # Up to 16 rows the products are exact and summed in fp32; above, each weight is rounded to
    # bf16 before a bf16 GEMM (2^-9 of each term); the bf16 output's rounding on top.
    term = K * U32 if M <= 16 else 2.0**-8
    err = (got.double() - want).abs()
    bound = term * mag + 2.0**-8 * want.abs() + 1e-30
    assert (err <= bound).all(), ((err - bound).max(), M)
