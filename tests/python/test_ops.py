"""llmk.ops against float64 torch references: forward and backward on awkward shapes,
gradcheck in float64, torch.compile(fullgraph=True), errors and stats. CPU tensors (the CUDA
suite runs the same checks on the GPU machine)."""

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import llmk  # noqa: E402
import llmk.ops as L  # noqa: E402

DEV = "cpu"


def rand(*shape, dtype=torch.float32, seed=None, scale=1.0):
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % (2**31))
    return (torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale).to(dtype)


def assert_close(got, want, tol, what=""):
    """Max abs error relative to the reference's largest magnitude, or to 1e-3 where that is
    smaller (inputs here are of order 1: a gradient that cancels to near zero, as RMSNorm's of a
    single element, is then compared at the scale of its terms)."""
    got, want = got.double(), want.double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    ref = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= tol * max(ref, 1e-3), \
        f"{what}: max error {err:.3e} vs reference max {ref:.3e} (tol {tol:.1e})"


def grads_of(fn, inputs, seed=7):
    """Gradients of sum(fn(*inputs) * G) w.r.t. the inputs that require grad, G fixed random."""
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = 0
    for i, o in enumerate(outs):
        g = rand(*o.shape, dtype=o.dtype, seed=seed + i)
        loss = loss + (o * g).sum()
    ins = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return outs, torch.autograd.grad(loss, ins)


def compare(llmk_fn, ref_fn, inputs, fwd_tol=2e-6, bwd_tol=2e-5):
    """llmk in float32 against the reference in float64 on the same values, forward and
    backward; and llmk in float64 against the reference at float64 precision."""
    for dtype, ft, bt in ((torch.float32, fwd_tol, bwd_tol), (torch.float64, 1e-12, 1e-11)):
        a = [t.to(dtype).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) and
             t.is_floating_point() else t for t in inputs]
        r = [t.double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) and
             t.is_floating_point() else t for t in inputs]
        got, ggot = grads_of(llmk_fn, a)
        want, gwant = grads_of(ref_fn, r)
        for i, (x, y) in enumerate(zip(got, want)):
            assert x.dtype == dtype
            assert_close(x, y, ft, f"{dtype} output {i}")
        for i, (x, y) in enumerate(zip(ggot, gwant)):
            assert_close(x, y, bt, f"{dtype} gradient {i}")


# ---------------------------------------------------------------------------------------------
# RMSNorm


def rms_norm_ref(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("shape", [(1, 1), (7, 40), (2, 3, 96), (33, 4096)])
def test_rms_norm(shape):
    x = rand(*shape, seed=1).requires_grad_()
    w = (1 + rand(shape[-1], seed=2) * 0.1).requires_grad_()
    compare(lambda x, w: L.rms_norm(x, w, 1e-5), lambda x, w: rms_norm_ref(x, w, 1e-5), [x, w])


def test_rms_norm_with_residual():
    x = rand(5, 3, 96, seed=3).requires_grad_()
    r = rand(5, 3, 96, seed=4).requires_grad_()
    w = rand(96, seed=5).requires_grad_()

    def ref(x, r, w):
        s = x + r
        return rms_norm_ref(s, w, 1e-6), s

    compare(lambda x, r, w: L.rms_norm(x, w, 1e-6, residual=r), ref, [x, r, w])


def test_rms_norm_without_weight_grad():
    x = rand(4, 64, seed=6, dtype=torch.float64).requires_grad_()
    w = rand(64, seed=7, dtype=torch.float64)
    (gx,) = torch.autograd.grad(L.rms_norm(x, w).sum(), [x])
    (want,) = torch.autograd.grad(rms_norm_ref(x, w, 1e-6).sum(), [x])
    assert_close(gx, want, 1e-11)


# ---------------------------------------------------------------------------------------------
# Gated activations


@pytest.mark.parametrize("kind", ["swiglu", "geglu_tanh", "geglu_erf"])
@pytest.mark.parametrize("shape", [(1,), (3, 37), (2, 5, 256)])
def test_gated(kind, shape):
    g = (rand(*shape, seed=11) * 3).requires_grad_()
    u = rand(*shape, seed=12).requires_grad_()
    if kind == "swiglu":
        fn, ref = L.swiglu, lambda g, u: F.silu(g) * u
    elif kind == "geglu_tanh":
        fn, ref = L.geglu, lambda g, u: F.gelu(g, approximate="tanh") * u
    else:
        fn = lambda g, u: L.geglu(g, u, approximate="none")  # noqa: E731
        ref = lambda g, u: F.gelu(g) * u  # noqa: E731
    compare(fn, ref, [g, u])


# ---------------------------------------------------------------------------------------------
# RoPE


def rope_ref(x, cos, sin, half):
    """x [B, S, H, D]; cos/sin [B or 1, S, R] -> rotated, dims past 2R unchanged."""
    R = cos.shape[-1]
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    rot, rest = x[..., :2 * R], x[..., 2 * R:]
    if half:
        a, b = rot[..., :R], rot[..., R:]
        out = torch.cat([a * c - b * s, a * s + b * c], -1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
    return torch.cat([out, rest], -1)


def table_ref(pos, rot_dim, theta, freq_scale=1.0, factors=None):
    i = torch.arange(rot_dim // 2, dtype=torch.float64)
    inv = theta ** (-2 * i / rot_dim)
    if factors is not None:
        inv = inv / factors.double()
    ang = pos.double().unsqueeze(-1) * freq_scale * inv
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("B,S,Hq,Hk,D,rot", [(1, 1, 1, 1, 2, None), (2, 7, 4, 1, 96, None),
                                             (3, 33, 2, 2, 40, 16), (1, 5, 7, 1, 128, 64)])
def test_rope_positions(style, B, S, Hq, Hk, D, rot):
    q = rand(B, S, Hq, D, seed=21).requires_grad_()
    k = rand(B, S, Hk, D, seed=22).requires_grad_()
    pos = torch.randint(0, 5000, (B, S), generator=torch.Generator().manual_seed(3))
    rd = rot or D

    def fn(q, k):
        return L.rope(q, k, positions=pos, style=style, theta=500000.0, rot_dim=rot)

    def ref(q, k):
        c, s = table_ref(pos, rd, 500000.0)
        return rope_ref(q, c, s, style == "neox"), rope_ref(k, c, s, style == "neox")

    # float32 tables round the angle's cos/sin to float: about 1e-7 relative at any position.
    compare(fn, ref, [q, k], fwd_tol=1e-6, bwd_tol=1e-6)


def test_rope_heads_first_with_tables_and_scaling():
    """Hugging Face's layout ([batch, heads, seq, dim]) with tables from rope_cos_sin under
    llama3 scaling, shared by the batch."""
    B, H, S, D = 2, 3, 9, 64
    q = rand(B, H, S, D, seed=31).requires_grad_()
    k = rand(B, 1, S, D, seed=32).requires_grad_()
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    pos = torch.arange(100000, 100000 + S)
    cos, sin = L.rope_cos_sin(pos, D, 500000.0, scaling, torch.float64)
    # transformers' llama3 inv_freq, computed independently here
    inv = 500000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    wavelen = 2 * math.pi / inv
    smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
    scaled = torch.where(wavelen > 8192, inv / 8.0, inv)
    mid = (wavelen <= 8192) & (wavelen >= 8192 / 4.0)
    scaled = torch.where(mid, (1 - smooth) * inv / 8.0 + smooth * inv, scaled)
    ang = pos.double().unsqueeze(-1) * scaled
    assert_close(cos, ang.cos(), 1e-12, "cos")
    assert_close(sin, ang.sin(), 1e-12, "sin")

    def fn(q, k):
        return L.rope(q, k, (cos.to(q.dtype), sin.to(q.dtype)), heads_first=True)

    def ref(q, k):
        c, s = cos.unsqueeze(0), sin.unsqueeze(0)
        f = lambda t: rope_ref(t.transpose(1, 2), c.to(t.dtype), s.to(t.dtype), True)  # noqa
        return f(q).transpose(1, 2), f(k).transpose(1, 2)

    compare(fn, ref, [q, k], fwd_tol=1e-6, bwd_tol=1e-6)


# ---------------------------------------------------------------------------------------------
# Flash attention


def attention_ref(q, k, v, causal, left, right, softcap, scale):
    """One sequence: q [Sq, Hq, D], k/v [Sk, Hkv, D]; flash-attn's masks; returns out, lse
    ([Sq, Hq])."""
    Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[0], k.shape[1]
    g = Hq // Hkv
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq).unsqueeze(1) + Sk - Sq
    j = torch.arange(Sk).unsqueeze(0)
    r = 0 if causal else right
    ok = torch.ones(Sq, Sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i - left
    if r >= 0:
        ok &= j <= i + r
    s = s.masked_fill(~ok, -math.inf)
    lse = torch.logsumexp(s, -1)  # [H, Sq]
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", p, vv)
    return out, lse.t()


def flash_ref_varlen(q, k, v, cu_q, cu_k, causal, left, right, softcap, scale):
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        o, l_ = attention_ref(q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]],
                              v[cu_k[b]:cu_k[b + 1]], causal, left, right, softcap, scale)
        outs.append(o)
        lses.append(l_)
    return torch.cat(outs), torch.cat(lses)


def finite_lse(lse):
    return lse.masked_fill(torch.isinf(lse), 0.0)


CASES = [
    # B, Sq, Sk, Hq, Hkv, D, causal, window, softcap
    (1, 1, 1, 1, 1, 64, False, None, None),
    (2, 7, 7, 4, 1, 96, True, None, None),
    (1, 33, 33, 7, 1, 128, True, 5, None),
    (2, 5, 19, 4, 4, 64, True, None, 30.0),
    (1, 19, 5, 2, 1, 256, True, None, None),  # keys fewer than queries: top rows see nothing
    (1, 17, 23, 8, 2, 96, False, (3, 4), None),
    (1, 13, 13, 2, 2, 40, False, None, 5.0),
]


@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,causal,window,softcap", CASES)
def test_flash_attn(B, Sq, Sk, Hq, Hkv, D, causal, window, softcap):
    q = rand(B, Sq, Hq, D, seed=41).requires_grad_()
    k = rand(B, Sk, Hkv, D, seed=42).requires_grad_()
    v = rand(B, Sk, Hkv, D, seed=43).requires_grad_()
    scale = 1 / math.sqrt(D)
    left, right = L._window(window, causal)

    def fn(q, k, v):
        out, lse = L.flash_attn(q, k, v, causal=causal, window=window, softcap=softcap,
                                return_lse=True)
        return out, finite_lse(lse)

    def ref(q, k, v):
        outs, lses = [], []
        for b in range(B):
            o, l_ = attention_ref(q[b], k[b], v[b], causal, left, right, softcap, scale)
            outs.append(o)
            lses.append(l_.t())
        return torch.stack(outs), finite_lse(torch.stack(lses))

    compare(fn, ref, [q, k, v], fwd_tol=5e-6, bwd_tol=5e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_with_empty_and_one_token_sequences(causal):
    lens_q = [3, 0, 1, 17, 1]
    lens_k = [3, 4, 1, 20, 0]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    Hq, Hkv, D = 4, 2, 64
    q = rand(sum(lens_q), Hq, D, seed=51).requires_grad_()
    k = rand(sum(lens_k), Hkv, D, seed=52).requires_grad_()
    v = rand(sum(lens_k), Hkv, D, seed=53).requires_grad_()

    def fn(q, k, v):
        out, lse = L.flash_attn(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                max_seqlen_q=17, max_seqlen_k=20, return_lse=True)
        assert lse.shape == (Hq, q.shape[0])
        return out, finite_lse(lse)

    def ref(q, k, v):
        o, l_ = flash_ref_varlen(q, k, v, cu_q, cu_k, causal, -1, -1, None, 1 / math.sqrt(D))
        return o, finite_lse(l_.t())

    compare(fn, ref, [q, k, v], fwd_tol=5e-6, bwd_tol=5e-5)


def test_flash_attn_no_key_rows_are_zero():
    q = rand(1, 4, 1, 8, seed=61)
    k = rand(1, 2, 1, 8, seed=62)
    out, lse = L.flash_attn(q, k, k, causal=True, return_lse=True)
    assert (out[0, :2] == 0).all() and torch.isneginf(lse[0, 0, :2]).all()
    assert torch.isfinite(lse[0, 0, 2:]).all()


def test_gradcheck_float64():
    torch.manual_seed(0)
    q = torch.randn(1, 4, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: L.flash_attn(q, k, v, causal=True, softcap=2.0, window=4,
                                     return_lse=True), (q, k, v))
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, r, w: L.rms_norm(x, w, 1e-5, residual=r),
                                    (x, r, w))
    g = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda g, u: L.geglu(g, u), (g, x[:, :5].detach()
                                                                 .requires_grad_()))
    assert torch.autograd.gradcheck(L.swiglu, (g, torch.randn_like(g).requires_grad_()))
    pos = torch.arange(3)
    assert torch.autograd.gradcheck(
        lambda a, b: L.rope(a, b, positions=pos, style="interleaved"),
        (torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True),
         torch.randn(3, 1, 4, dtype=torch.float64, requires_grad=True)))
    wl = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    bl = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for act in ("gelu", "gelu_tanh", "silu", "none"):
        assert torch.autograd.gradcheck(lambda x, w, b: L.linear_act(x, w, b, act), (x, wl, bl))


# ---------------------------------------------------------------------------------------------
# Linear + activation


# torch's form of each linear_act activation (also the CUDA suite's reference).
ACT_REFS = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
            "silu": F.silu, "none": lambda t: t}


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "none"])
@pytest.mark.parametrize("M,K,N,bias", [(1, 1, 1, True), (7, 33, 17, False), (2 * 5, 64, 70, True)])
def test_linear_act(act, M, K, N, bias):
    x = rand(M, K, seed=71).requires_grad_()
    w = (rand(N, K, seed=72) / math.sqrt(K)).requires_grad_()
    b = rand(N, seed=73).requires_grad_() if bias else None
    inputs = [x, w] + ([b] if bias else [])
    compare(lambda x, w, *b: L.linear_act(x, w, b[0] if b else None, act),
            lambda x, w, *b: ACT_REFS[act](F.linear(x, w, b[0] if b else None)), inputs,
            fwd_tol=1e-5, bwd_tol=1e-5)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "none"])
def test_linear_act_without_grad_forms_the_output_in_place(act):
    # No gradient wanted: the pre-activation is not kept; y is formed and activated in place.
    x, w, b = rand(9, 24, seed=76), rand(40, 24, seed=77) / math.sqrt(24), rand(40, seed=78)
    want = ACT_REFS[act](F.linear(x.double(), w.double(), b.double()))
    with torch.no_grad():
        got = L.linear_act(x, w, b, act)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    got = L.linear_act(x, w, b, act)  # nothing requires grad: the same path with grad enabled
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_linear_act_batched_input():
    x = rand(2, 3, 16, seed=74).requires_grad_()
    w = rand(8, 16, seed=75).requires_grad_()
    compare(lambda x, w: L.linear_act(x, w, act="silu"), lambda x, w: F.silu(F.linear(x, w)),
            [x, w], fwd_tol=1e-5, bwd_tol=1e-5)


# ---------------------------------------------------------------------------------------------
# torch.compile, errors, stats


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    torch._dynamo.reset()

    def block(x, r, w, wg, wu, wd, q, k, v, pos):
        h, s = L.rms_norm(x, w, 1e-6, residual=r)
        a = L.linear_act(h, wg, act="silu")
        m = L.swiglu(L.linear_act(h, wu, act="none"), a)
        qr, kr = L.rope(q, k, positions=pos)
        o = L.flash_attn(qr, kr, v, causal=True)
        return (F.linear(m, wd) + s).sum() + o.sum()

    args = [rand(2, 5, 16, seed=81), rand(2, 5, 16, seed=82), rand(16, seed=83),
            rand(24, 16, seed=84), rand(24, 16, seed=85), rand(16, 24, seed=86),
            rand(2, 5, 4, 8, seed=87), rand(2, 5, 2, 8, seed=88), rand(2, 5, 2, 8, seed=89)]
    args = [a.requires_grad_() for a in args] + [torch.arange(5)]
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    want = block(*args)
    gwant = torch.autograd.grad(want, args[:-1])
    got = compiled(*args)
    ggot = torch.autograd.grad(got, args[:-1])
    assert_close(got, want, 1e-6, "compiled loss")
    for i, (a, b) in enumerate(zip(ggot, gwant)):
        assert_close(a, b, 1e-6, f"compiled gradient {i}")


@pytest.mark.parametrize("call,message", [
    (lambda: L.rms_norm(torch.ones(2, 4), torch.ones(3)), "weight is (3,)"),
    (lambda: L.rms_norm(torch.ones(2, 4, dtype=torch.float64), torch.ones(4)), "float32"),
    (lambda: L.flash_attn(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 2, 8),
                          torch.ones(1, 2, 2, 8)), "not a multiple"),
    (lambda: L.flash_attn(torch.ones(3, 2, 8), torch.ones(3, 2, 8), torch.ones(3, 2, 8),
                          cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32),
                          cu_seqlens_k=torch.tensor([0, 3], dtype=torch.int32)), "ends at 2"),
    (lambda: L.flash_attn(torch.ones(1, 2, 2, 8), torch.ones(1, 2, 2, 8),
                          torch.ones(1, 2, 2, 8), window=0), "window = 0"),
    (lambda: L.swiglu(torch.ones(2, 3), torch.ones(3, 2)), "gate is (2, 3)"),
    (lambda: L.geglu(torch.ones(2), torch.ones(2), approximate="fast"), "approximate"),
    (lambda: L.linear_act(torch.ones(2, 3), torch.ones(4, 5)), "weight must be [out, in]"),
    (lambda: L.linear_act(torch.ones(2, 3), torch.ones(4, 3), act="relu"), "act = 'relu'"),
    (lambda: L.rope(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8), positions=torch.arange(2),
                    style="gptj"), "style"),
    (lambda: L.rope(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8), positions=torch.arange(3)),
     "does not fit"),
    (lambda: L.rms_norm(torch.ones(2, 4, dtype=torch.float16), torch.ones(4, dtype=torch.float16)),
     "f32 or f64"),
])
def test_errors(call, message):
    with pytest.raises(llmk.Error, match=None) as e:
        call()
    assert message in str(e.value), str(e.value)


def test_stats_count_kernels():
    L.reset_stats()
    L.swiglu(torch.ones(4), torch.ones(4))
    L.swiglu(torch.ones(4), torch.ones(4))
    rows = {(s["op"], s["kernel"]): s for s in L.stats()}
    assert rows[("gated_forward", "cpu")]["calls"] == 2
    assert rows[("gated_forward", "cpu")]["reason"] == ""
    L.reset_stats()
    assert L.stats() == []


# ---------------------------------------------------------------------------------------------
# Pairwise cosine diversity


def cosine_diversity_ref(x, rows, block=1024):
    """The float64 reference over the materialised cosines (in blocks of rows): a zero row has
    cosine 0 with every row."""
    x = x.double()
    n = x.shape[0]
    norm = x.norm(dim=1, keepdim=True)
    u = torch.where(norm > 0, x / torch.where(norm > 0, norm, 1.0), 0.0)
    per_row = torch.empty(n, dtype=torch.float64)
    for i0 in range(0, n, block):
        c = u[i0:i0 + block] @ u.T  # [b, n]
        c[torch.arange(c.shape[0]), torch.arange(i0, i0 + c.shape[0])] = 0.0  # drop i == j
        per_row[i0:i0 + block] = (n - 1) - c.sum(1)  # sum over j != i of 1 - cos
    if n < 2:
        return torch.zeros(n) if rows else torch.zeros(())
    return per_row / (n - 1) if rows else per_row.sum() / (n * (n - 1))


@pytest.mark.parametrize("n,d", [(1, 5), (2, 3), (3, 1), (17, 64), (2003, 33), (10007, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pairwise_cosine_diversity_values(n, d, dtype):
    x = rand(n, d, dtype=dtype, seed=n)
    if n > 2:
        x[1] = 0.0  # a zero row: distance 1 to every row
    for reduction in ("mean", "rows"):
        got = L.pairwise_cosine_diversity(x, reduction)
        want = cosine_diversity_ref(x, reduction == "rows")
        assert got.shape == want.shape and got.dtype == dtype
        tol = 1e-12 if dtype == torch.float64 else 2e-6
        assert (got.double() - want).abs().max().item() <= tol * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("reduction", ["mean", "rows"])
def test_pairwise_cosine_diversity_gradients(reduction):
    x = rand(37, 11, dtype=torch.float64, seed=3).requires_grad_()
    weights = rand(37, dtype=torch.float64, seed=4)

    def loss(fn, x):
        out = fn(x)
        return (out * weights).sum() if reduction == "rows" else out

    g = torch.autograd.grad(loss(lambda t: L.pairwise_cosine_diversity(t, reduction), x), x)[0]
    x64 = x.detach().clone().requires_grad_()
    want = torch.autograd.grad(loss(lambda t: cosine_diversity_ref(t, reduction == "rows"), x64),
                               x64)[0]
    assert (g - want).abs().max().item() <= 1e-12 * max(1.0, want.abs().max().item())
    assert torch.autograd.gradcheck(lambda t: L.pairwise_cosine_diversity(t, reduction),
                                    (rand(6, 4, dtype=torch.float64, seed=5).requires_grad_(),))
    # A zero row: a zero gradient there, the others' as without it (it adds distance 1 only).
    z = x.detach().clone()
    z[3] = 0.0
    z.requires_grad_()
    gz = torch.autograd.grad(L.pairwise_cosine_diversity(z, reduction).sum(), z)[0]
    assert torch.isfinite(gz).all() and (gz[3] == 0).all()
    # One row: no pairs, a zero value and gradient.
    one = rand(1, 4, dtype=torch.float64, seed=6).requires_grad_()
    out = L.pairwise_cosine_diversity(one, reduction)
    assert (out == 0).all()
    assert (torch.autograd.grad(out.sum(), one)[0] == 0).all()


def test_pairwise_cosine_diversity_errors_and_compile():
    with pytest.raises(llmk.Error, match="'mean' or 'rows'"):
        L.pairwise_cosine_diversity(rand(3, 2), "sum")
    with pytest.raises(llmk.Error, match=r"\[N, d\] expected"):
        L.pairwise_cosine_diversity(rand(3, 2, 2))
    with pytest.raises(llmk.Error, match="f32 or f64"):
        L.pairwise_cosine_diversity(rand(3, 2).bfloat16())
    x = rand(9, 5, seed=7).requires_grad_()
    f = torch.compile(lambda t: L.pairwise_cosine_diversity(t, "rows").square().sum(),
                      fullgraph=True, backend="aot_eager")
    (g,) = torch.autograd.grad(f(x), x)
    (want,) = torch.autograd.grad(L.pairwise_cosine_diversity(x, "rows").square().sum(), x)
    assert torch.allclose(g, want)


# ---------------------------------------------------------------------------------------------
# Distillation losses


def distill_ref(s, t, labels, loss="kl", beta=0.5, temperature=1.0, alpha=0.0, ignore_index=-100,
                reduction="batchmean"):
    """The losses of llmk.ops.distill_loss written out in torch (float64 in the tests)."""
    T = temperature
    lq, lp = F.log_softmax(s / T, -1), F.log_softmax(t / T, -1)
    q, p = lq.exp(), lp.exp()
    kind = loss if loss != "jsd" else {0.0: "kl", 1.0: "reverse_kl"}.get(beta, "jsd")

    def kl(a, la, lb):  # sum a (la - lb), 0 where a is 0
        return torch.where(a > 0, a * (la - lb), torch.zeros_like(a)).sum(-1)
    if kind == "kl":
        D = kl(p, lp, lq)
    elif kind == "reverse_kl":
        D = kl(q, lq, lp)
    else:
        m = beta * p + (1 - beta) * q
        D = beta * kl(p, lp, m.log()) + (1 - beta) * kl(q, lq, m.log())
    row = (1 - alpha) * T * T * D
    V = s.shape[-1]
    if labels is not None:
        keep = labels != ignore_index
        if alpha:
            ce = F.cross_entropy(s.reshape(-1, V), labels.reshape(-1), reduction="none",
                                 ignore_index=ignore_index).reshape(labels.shape)
            row = row + alpha * ce
        row = torch.where(keep, row, torch.zeros_like(row))
        n = int(keep.sum())
    else:
        n = row.numel()
    if reduction == "none":
        return row
    if reduction == "sum":
        return row.sum()
    return row.sum() / max(n * (V if reduction == "mean" else 1), 1)


@pytest.mark.parametrize("loss,beta", [("kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.5),
                                       ("jsd", 0.0), ("jsd", 1.0), ("jsd", 0.25)])
@pytest.mark.parametrize("temperature", [1.0, 4.0])
@pytest.mark.parametrize("shape", [(1, 7), (2, 3, 130), (5, 1000)])
def test_distill_loss(loss, beta, temperature, shape):
    s = rand(*shape, seed=91, scale=3.0).requires_grad_()
    t = rand(*shape, seed=92, scale=3.0)
    compare(lambda s, t: L.distill_loss(s, t, loss=loss, beta=beta, temperature=temperature),
            lambda s, t: distill_ref(s, t, None, loss, beta, temperature), [s, t],
            fwd_tol=1e-5, bwd_tol=1e-5)


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_distill_loss_labels_and_reductions(reduction, alpha):
    # ignore_index rows (one of them the first) add nothing; the hard label's cross-entropy mixed
    # in with alpha; a vocabulary that is no multiple of any vector width.
    s = rand(4, 3, 1001, seed=93, scale=2.0).requires_grad_()
    t = rand(4, 3, 1001, seed=94, scale=2.0)
    labels = torch.randint(0, 1001, (4, 3), generator=torch.Generator().manual_seed(95))
    labels[0, 0] = labels[2, 1] = -100
    for loss in ("kl", "jsd"):
        compare(lambda s, t: L.distill_loss(s, t, loss=loss, temperature=2.0, labels=labels,
                                            alpha=alpha, reduction=reduction),
                lambda s, t: distill_ref(s, t, labels, loss, 0.5, 2.0, alpha, -100, reduction),
                [s, t], fwd_tol=1e-5, bwd_tol=1e-5)


def test_distill_loss_edges():
    # Every row ignored: loss 0 and gradient 0 (batchmean divides by at least 1).
    s = rand(3, 50, seed=96).requires_grad_()
    t = rand(3, 50, seed=97)
    out = L.distill_loss(s, t, labels=torch.full((3,), -100), alpha=0.5)
    out.backward()
    assert out.item() == 0.0 and s.grad.abs().max().item() == 0.0
    # A large vocabulary (32,003) over one row, KL at T = 4.
    s = rand(1, 32003, seed=98, scale=4.0).requires_grad_()
    t = rand(1, 32003, seed=99, scale=4.0)
    compare(lambda s, t: L.distill_loss(s, t, temperature=4.0),
            lambda s, t: distill_ref(s, t, None, "kl", 0.5, 4.0), [s, t], fwd_tol=1e-5,
            bwd_tol=1e-5)
    # A logit of -inf in the teacher (a masked token) adds 0, not NaN.
    s = rand(2, 9, seed=100).requires_grad_()
    t = rand(2, 9, seed=101)
    t[:, 3] = -math.inf
    for loss in ("kl", "reverse_kl", "jsd"):
        got = L.distill_loss(s.double(), t.double(), loss=loss)
        want = distill_ref(s.double(), t.double(), None, loss)
        assert torch.isfinite(got) == torch.isfinite(want), loss
        if torch.isfinite(want):
            assert_close(got, want, 1e-12, loss)


def test_distill_loss_gradcheck():
    s = rand(2, 5, dtype=torch.float64, seed=102).requires_grad_()
    t = rand(2, 5, dtype=torch.float64, seed=103)
    labels = torch.tensor([1, -100])
    for loss in ("kl", "reverse_kl", "jsd"):
        assert torch.autograd.gradcheck(
            lambda s: L.distill_loss(s, t, loss=loss, temperature=1.5, labels=labels, alpha=0.4,
                                     reduction="sum"), (s,))


def test_distill_loss_errors():
    s, t = rand(2, 5, seed=104), rand(2, 5, seed=105)
    with pytest.raises(llmk.Error, match="loss = 'mse'"):
        L.distill_loss(s, t, loss="mse")
    with pytest.raises(llmk.Error, match="temperature"):
        L.distill_loss(s, t, temperature=0.0)
    with pytest.raises(llmk.Error, match="pass labels"):
        L.distill_loss(s, t, alpha=0.5)
    with pytest.raises(llmk.Error, match="detach"):
        L.distill_loss(s, t.clone().requires_grad_())
    with pytest.raises(llmk.Error, match="one shape"):
        L.distill_loss(s, rand(2, 6, seed=106))
    with pytest.raises(llmk.Error, match="outside"):
        L.distill_loss(s, t, labels=torch.tensor([1, 5]), alpha=0.5)


def test_distill_loss_backward_twice():
    # The first backward scales the gradient formed in the forward in place; a second one
    # through the same forward (retain_graph) forms it again.
    s, t = rand(3, 20, seed=107).requires_grad_(), rand(3, 20, seed=108)
    out = L.distill_loss(s, t, loss="jsd", reduction="none")
    g = rand(3, seed=109)
    (g1,) = torch.autograd.grad(out, s, g, retain_graph=True)
    (g2,) = torch.autograd.grad(out, s, 2 * g)
    assert_close(g2, 2 * g1, 1e-6, "second backward")


def test_distill_loss_compiles():
    torch._dynamo.reset()
    labels = torch.tensor([[3, -100, 7]])

    def f(s, t):
        return L.distill_loss(s, t, loss="jsd", beta=0.3, temperature=2.0, labels=labels,
                              alpha=0.2)

    s, t = rand(1, 3, 40, seed=110).requires_grad_(), rand(1, 3, 40, seed=111)
    want = f(s, t)
    (gwant,) = torch.autograd.grad(want, s)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(s, t)
    (ggot,) = torch.autograd.grad(got, s)
    assert_close(got, want, 1e-6, "compiled loss")
    assert_close(ggot, gwant, 1e-6, "compiled gradient")


# ---------------------------------------------------------------------------------------------
# Fused linear losses (chunked: the logits of a few rows at a time)


@pytest.mark.parametrize("teacher", ["logits", "hidden", "hidden_bias"])
@pytest.mark.parametrize("loss,beta", [("kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.3)])
@pytest.mark.parametrize("chunk_rows", [1, 4, None])
def test_fused_linear_distill_loss(teacher, loss, beta, chunk_rows):
    BT, H, Ht, V = 7, 12, 10, 37
    h = rand(BT, H, seed=120).requires_grad_()
    w = (rand(V, H, seed=121) / 2).requires_grad_()
    b = rand(V, seed=122).requires_grad_()
    th, tw, tb = rand(BT, Ht, seed=123), rand(V, Ht, seed=124) / 2, rand(V, seed=125)
    tl = rand(BT, V, seed=126, scale=2.0)
    labels = torch.randint(0, V, (BT,), generator=torch.Generator().manual_seed(127))
    labels[3] = -100
    kw = dict(loss=loss, beta=beta, temperature=2.0, labels=labels, alpha=0.25,
              reduction="batchmean")

    def ours(h, w, b):
        t = ({"teacher_logits": tl.to(h.dtype)} if teacher == "logits" else
             {"teacher_hidden": th.to(h.dtype), "teacher_weight": tw.to(h.dtype),
              "teacher_bias": tb.to(h.dtype) if teacher == "hidden_bias" else None})
        return L.fused_linear_distill_loss(h, w, b, **t, chunk_rows=chunk_rows, **kw)

    def ref(h, w, b):
        t = (tl if teacher == "logits" else
             F.linear(th.double(), tw.double(), tb.double() if teacher == "hidden_bias" else None))
        return distill_ref(F.linear(h, w, b), t.to(h.dtype), labels, loss, beta, 2.0, 0.25, -100,
                           "batchmean")
    compare(ours, ref, [h, w, b], fwd_tol=1e-5, bwd_tol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_linear_cross_entropy(reduction):
    h = rand(2, 5, 16, seed=130).requires_grad_()
    w = (rand(50, 16, seed=131) / 3).requires_grad_()
    labels = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(132))
    labels[0, 1] = labels[1, 4] = -100
    compare(lambda h, w: L.fused_linear_cross_entropy(h, w, labels, reduction=reduction,
                                                      chunk_rows=3),
            lambda h, w: F.cross_entropy(F.linear(h, w).reshape(-1, 50), labels.reshape(-1),
                                         reduction=reduction),
            [h, w], fwd_tol=1e-5, bwd_tol=1e-5)


def test_fused_linear_losses_without_grad_and_errors():
    h, w = rand(3, 8, seed=133), rand(20, 8, seed=134)
    labels = torch.tensor([1, 2, 3])
    with torch.no_grad():
        got = L.fused_linear_cross_entropy(h.requires_grad_(), w, labels)
    assert_close(got, F.cross_entropy(F.linear(h.detach(), w), labels), 1e-6, "no grad")
    tl = rand(3, 20, seed=135)
    with pytest.raises(llmk.Error, match="teacher_topk values must be a floating-point tensor"):
        L.fused_linear_distill_loss(h, w, teacher_topk=(None, None))
    with pytest.raises(llmk.Error, match="reduction"):
        L.fused_linear_distill_loss(h, w, teacher_logits=tl, reduction="none")
    with pytest.raises(llmk.Error, match="teacher is missing"):
        L.fused_linear_distill_loss(h, w)
    with pytest.raises(llmk.Error, match="detach"):
        L.fused_linear_distill_loss(h, w, teacher_logits=tl.clone().requires_grad_())
    with pytest.raises(llmk.Error, match="expected"):
        L.fused_linear_distill_loss(h, w, teacher_logits=rand(3, 21, seed=136))


def test_fused_linear_cross_entropy_under_compile_runs_eagerly():
    torch._dynamo.reset()
    h, w = rand(4, 8, seed=137).requires_grad_(), rand(12, 8, seed=138).requires_grad_()
    labels = torch.tensor([1, 2, -100, 11])

    def f(h, w):
        return L.fused_linear_cross_entropy(h * 2, w, labels) + h.sum() * 0

    want = f(h, w)
    got = torch.compile(f, backend="aot_eager")(h, w)
    assert_close(got, want, 1e-6, "compiled")
    assert_close(torch.autograd.grad(got, w)[0], torch.autograd.grad(want, w)[0], 1e-6, "grad")


def test_nn_loss_modules_match_the_ops():
    import llmk.nn
    s, t = rand(2, 3, 30, seed=140).requires_grad_(), rand(2, 3, 30, seed=141)
    labels = torch.tensor([[1, 2, -100], [4, 5, 6]])
    m = llmk.nn.DistillLoss(loss="jsd", beta=0.2, temperature=3.0, alpha=0.5)
    assert_close(m(s, t, labels), L.distill_loss(s, t, loss="jsd", beta=0.2, temperature=3.0,
                                                 alpha=0.5, labels=labels), 1e-12, "DistillLoss")
    h, w = rand(6, 8, seed=142).requires_grad_(), rand(30, 8, seed=143).requires_grad_()
    th, tw = rand(6, 8, seed=144), rand(30, 8, seed=145)
    fm = llmk.nn.FusedLinearDistillLoss(loss="reverse_kl", temperature=2.0, chunk_rows=4)
    assert_close(fm(h, w, th, tw), distill_ref(F.linear(h, w), F.linear(th, tw), None,
                                                "reverse_kl", 0.5, 2.0), 1e-5, "fused module")
    ce = llmk.nn.FusedLinearCrossEntropyLoss(chunk_rows=5)
    lab = labels.reshape(-1)
    assert_close(ce(h, w, lab), F.cross_entropy(F.linear(h, w), lab), 1e-5, "CE module")


def test_pairwise_cosine_distance_and_topk():
    x = rand(50, 7, dtype=torch.float64, seed=150)
    x[4] = 0.0
    D = L.pairwise_cosine_distance(x)
    u = x / x.norm(dim=1, keepdim=True).clamp(min=1e-300)
    u[4] = 0.0
    want = 1 - u @ u.T
    assert_close(D, want, 1e-12, "distance matrix")
    assert D[4].eq(1).all() and D[:, 4].eq(1).all()
    # Row means of the matrix without its diagonal are pairwise_cosine_diversity's rows.
    off = (D.sum(1) - D.diagonal()) / 49
    assert_close(off, L.pairwise_cosine_diversity(x, "rows"), 1e-12, "against diversity rows")
    for chunk in (1, 7, None):
        dist, idx = L.cosine_topk(x, 5, chunk_rows=chunk)
        masked = want.clone()
        masked.fill_diagonal_(math.inf)
        wd, wi = torch.topk(masked, 5, dim=1, largest=False)
        assert_close(dist, wd, 1e-12, f"topk distances, chunk {chunk}")
        assert (idx != torch.arange(50).unsqueeze(1)).all()
        # Indices agree except among ties (the zero row's neighbours are all at distance 1).
        same = (idx == wi) | (wd == 1.0)
        assert same.all()
    # (Rows 5-13: no zero row, where a perturbation turns u from 0 into a unit vector.)
    assert torch.autograd.gradcheck(lambda t: L.cosine_topk(t, 3)[0],
                                    (x[5:14].clone().requires_grad_(),))
    assert torch.autograd.gradcheck(L.pairwise_cosine_distance, (x[5:14].clone().requires_grad_(),))
    with pytest.raises(llmk.Error, match="k = 50"):
        L.cosine_topk(x, 50)
    with pytest.raises(llmk.Error, match=r"\[N, d\] expected"):
        L.pairwise_cosine_distance(x[0])


# ---------------------------------------------------------------------------------------------
# Attention transfer


def attention_transfer_ref(tq, tk, sq, sk, temperature, causal, R):
    """The materialised S x S form (float64 in the tests)."""
    def rel(x):
        B, S, H, D = x.shape
        return x.reshape(B, S, R, H * D // R).transpose(1, 2)

    def logp(q, k):
        d = q.shape[2] * q.shape[3] // R
        a = rel(q) @ rel(k).transpose(-1, -2) / (math.sqrt(d) * temperature)
        if causal:
            S = a.shape[-1]
            a = a.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), -math.inf)
        return F.log_softmax(a, -1)
    lt, ls = logp(tq, tk), logp(sq, sk)
    pt = lt.exp()
    kl = torch.where(pt > 0, pt * (lt - ls), torch.zeros_like(pt)).sum(-1)
    return kl.mean()


SAME_HEADS, FEWER_HEADS = (4, 16, 4, 16, None), (8, 8, 2, 12, 4)


@pytest.mark.parametrize("S,causal,heads", [
    (1, True, SAME_HEADS), (1, False, FEWER_HEADS), (17, True, FEWER_HEADS),
    (17, False, SAME_HEADS), (300, False, FEWER_HEADS), (1000, True, SAME_HEADS)])
def test_attention_transfer_loss(S, causal, heads):
    # (teacher heads, dim, student heads, dim, relation heads): equal shapes, and a student with
    # fewer, wider heads compared through 4 relation heads.
    Ht, Dt, Hs, Ds, R = heads
    tq, tk = rand(2, S, Ht, Dt, seed=160), rand(2, S, Ht, Dt, seed=161)
    sq = rand(2, S, Hs, Ds, seed=162).requires_grad_()
    sk = rand(2, S, Hs, Ds, seed=163).requires_grad_()
    rr = R if R is not None else min(Ht, Hs)
    compare(lambda sq, sk: L.attention_transfer_loss(tq.to(sq.dtype), tk.to(sq.dtype), sq, sk,
                                                     temperature=2.0, causal=causal,
                                                     relation_heads=R, block=64),
            lambda sq, sk: attention_transfer_ref(tq.double(), tk.double(), sq, sk, 2.0, causal,
                                                  rr),
            [sq, sk], fwd_tol=1e-5, bwd_tol=1e-5)


@pytest.mark.parametrize("S,causal,heads,T", [
    (1, True, (2, 8, 2, 8, 1), 1.0),        # one row, one relation head
    (1, False, (3, 8, 2, 12, 3), 4.0),      # d_t 8, d_s 8
    (17, True, (4, 12, 2, 20, 2), 4.0),     # d_t 24 != d_s 20
    (17, False, (3, 16, 6, 4, 3), 1.0),     # d_t 16, d_s 8
    (1000, False, (2, 8, 1, 24, 2), 4.0),   # d_t 8, d_s 12
    (1000, True, (4, 16, 4, 16, 1), 1.0)])  # d_t = d_s 64
def test_attention_transfer_loss_shapes(S, causal, heads, T):
    # The CPU kernel (float32 and float64) against the float64 reference: awkward S, relation
    # head dims that differ between the sides, one or several relation heads, T 1 and 4.
    Ht, Dt, Hs, Ds, R = heads
    tq, tk = rand(2, S, Ht, Dt, seed=S + 1), rand(2, S, Ht, Dt, seed=S + 2)
    sq = rand(2, S, Hs, Ds, seed=S + 3).requires_grad_()
    sk = rand(2, S, Hs, Ds, seed=S + 4).requires_grad_()
    L.reset_stats()
    compare(lambda sq, sk: L.attention_transfer_loss(tq.to(sq.dtype), tk.to(sq.dtype), sq, sk,
                                                     temperature=T, causal=causal,
                                                     relation_heads=R),
            lambda sq, sk: attention_transfer_ref(tq.double(), tk.double(), sq, sk, T, causal, R),
            [sq, sk], fwd_tol=1e-5, bwd_tol=1e-5)
    calls = {(s["op"], s["kernel"]): s["calls"] for s in L.stats()}
    assert calls == {("attention_transfer_forward", "cpu"): 2,
                     ("attention_transfer_backward", "cpu"): 2}, calls


def test_attention_transfer_loss_paths():
    # One gradient wanted (the other is not formed), the torch path where the CPU kernel does not
    # apply (bf16, counted with its reason), and the torch path itself in float64 (llmk's
    # fallback on CUDA), all against the reference.
    f64 = torch.float64
    tq, tk = rand(2, 23, 4, 6, dtype=f64, seed=170), rand(2, 23, 4, 6, dtype=f64, seed=171)
    sq, sk = rand(2, 23, 2, 8, dtype=f64, seed=172), rand(2, 23, 2, 8, dtype=f64, seed=173)
    r = [t.clone().requires_grad_() for t in (sq, sk)]
    want = attention_transfer_ref(tq, tk, r[0], r[1], 2.0, True, 2)
    gwant = torch.autograd.grad(want, r)
    q = sq.clone().requires_grad_()
    (gq,) = torch.autograd.grad(L.attention_transfer_loss(tq, tk, q, sk, 2.0, relation_heads=2),
                                [q])
    assert_close(gq, gwant[0], 1e-11, "dq alone")
    L.reset_stats()
    h = [t.to(torch.bfloat16) for t in (tq, tk, sq, sk)]
    out = L.attention_transfer_loss(*h, 2.0, relation_heads=2)
    assert out.dtype == torch.float32
    want16 = attention_transfer_ref(*(t.double() for t in h), 2.0, True, 2)
    assert abs(out.item() - want16.item()) <= 0.05 * abs(want16.item())  # bf16 scores in torch
    assert [(s["kernel"], s["reason"]) for s in L.stats()] == [
        ("torch", "the CPU kernel takes float32 or float64, not torch.bfloat16")]
    sr, kr = (t.clone().requires_grad_() for t in (sq, sk))
    st, ss = 1.0 / (math.sqrt(12) * 2.0), 1.0 / (math.sqrt(8) * 2.0)  # d_t 12, d_s 8
    rel = [L._relations(t, 2) for t in (tq, tk, sr, kr)]
    got = L._AttentionTransfer.apply(*rel, st, ss, True, 5)
    assert_close(got, want, 1e-12, "torch path")
    for a, b in zip(torch.autograd.grad(got, (sr, kr)), gwant):
        assert_close(a, b, 1e-11, "torch path gradient")


def test_attention_transfer_op_errors():
    # The C++ ops' own checks, one message each (llmk.ops checks the public arguments first).
    t, s = torch.ones(1, 4, 8), torch.ones(1, 4, 6)
    kl, lt, ls = (torch.empty(1, 2, 4) for _ in range(3))
    fwd = L._C.attention_transfer_forward
    for call, message in [
            (lambda: fwd(kl, lt, ls, t, t, s, s, 4, 1.0, True, 0), "relation_heads 4 must divide"),
            (lambda: fwd(kl, lt, ls, t, t, s, s, 2, 0.0, True, 0), "temperature 0"),
            (lambda: fwd(torch.empty(1, 4, 2), lt, ls, t, t, s, s, 2, 1.0, True, 0), "kl"),
            (lambda: fwd(kl, kl, ls, t, t, s, s, 2, 1.0, True, 0), "overlaps"),
            (lambda: fwd(kl, lt, ls, t, t, s.double(), s, 2, 1.0, True, 0), "sq"),
            (lambda: fwd(kl, lt, ls, t, t, *[torch.ones(1, 5, 6)] * 2, 2, 1.0, True, 0),
             "share B and S"),
            (lambda: L._C.attention_transfer_backward(None, None, torch.ones(2), t, t, s, s, lt,
                                                      ls, 2, 1.0, True, 0), "dout must be one")]:
        with pytest.raises(llmk.Error) as e:
            call()
        assert message in str(e.value), str(e.value)


def test_attention_transfer_loss_compiles():
    torch._dynamo.reset()
    tq, tk = rand(1, 9, 2, 8, seed=174), rand(1, 9, 2, 8, seed=175)
    sq, sk = rand(1, 9, 4, 4, seed=176).requires_grad_(), rand(1, 9, 4, 4, seed=177)

    def f(q, k):
        return L.attention_transfer_loss(tq, tk, q, k, temperature=2.0, relation_heads=2)

    want = f(sq, sk)
    (gwant,) = torch.autograd.grad(want, sq)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(sq, sk)
    (ggot,) = torch.autograd.grad(got, sq)
    assert_close(got, want, 1e-6, "compiled loss")
    assert_close(ggot, gwant, 1e-6, "compiled gradient")


def test_attention_transfer_loss_gradcheck_and_errors():
    tq, tk = rand(1, 9, 2, 4, dtype=torch.float64, seed=164), rand(1, 9, 2, 4,
                                                                  dtype=torch.float64, seed=165)
    sq = rand(1, 9, 2, 4, dtype=torch.float64, seed=166).requires_grad_()
    sk = rand(1, 9, 2, 4, dtype=torch.float64, seed=167).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k: L.attention_transfer_loss(tq, tk, q, k, block=4), (sq, sk))
    with pytest.raises(llmk.Error, match="relation_heads"):
        L.attention_transfer_loss(tq, tk, sq, sk, relation_heads=3)
    with pytest.raises(llmk.Error, match="detach"):
        L.attention_transfer_loss(tq.clone().requires_grad_(), tk, sq, sk)
    with pytest.raises(llmk.Error, match="share B and S"):
        L.attention_transfer_loss(tq, tk, sq[:, :5], sk[:, :5])


@pytest.mark.parametrize("loss", ["kl", "jsd"])
@pytest.mark.parametrize("k", [1, 5, 37])
def test_fused_linear_distill_loss_teacher_topk(loss, k):
    # The teacher as its top k logits: its softmax over those k, the tail at probability 0 (k = V:
    # the whole distribution).
    BT, H, V = 6, 10, 37
    h = rand(BT, H, seed=170).requires_grad_()
    w = (rand(V, H, seed=171) / 2).requires_grad_()
    full = rand(BT, V, seed=172, scale=2.0)
    vals, idx = torch.topk(full, k, dim=1)
    dense = torch.full_like(full, -math.inf).scatter(1, idx, vals)
    compare(lambda h, w: L.fused_linear_distill_loss(h, w, teacher_topk=(vals.to(h.dtype), idx),
                                                     loss=loss, temperature=2.0, chunk_rows=4),
            lambda h, w: distill_ref(F.linear(h, w), dense.double(), None, loss, 0.5, 2.0),
            [h, w], fwd_tol=1e-5, bwd_tol=1e-5)


def test_fused_linear_distill_loss_teacher_topk_errors():
    h, w = rand(3, 8, seed=173), rand(20, 8, seed=174)
    vals, idx = torch.topk(rand(3, 20, seed=175), 4, dim=1)
    with pytest.raises(llmk.Error, match="infinite"):
        L.fused_linear_distill_loss(h, w, teacher_topk=(vals, idx), loss="reverse_kl")
    with pytest.raises(llmk.Error, match=r"in \[0, 20\)"):
        L.fused_linear_distill_loss(h, w, teacher_topk=(vals, idx + 17))
    with pytest.raises(llmk.Error, match="int64 indices"):
        L.fused_linear_distill_loss(h, w, teacher_topk=(vals, idx.int()))
    with pytest.raises(llmk.Error, match="values must be a floating-point tensor"):
        L.fused_linear_distill_loss(h, w, teacher_topk=(idx, idx))
    with pytest.raises(llmk.Error, match="one way"):
        L.fused_linear_distill_loss(h, w, teacher_topk=(vals, idx), teacher_logits=vals)
