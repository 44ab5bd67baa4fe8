"""llmk.ops on CUDA tensors (bf16, fp16) against float64 references on the same values.

Skipped without a GPU or without a CUDA build of llmk._C. A tolerance here is relative to what
torch itself gets wrong in the same dtype: llmk's error against the float64 reference must stay
within twice the error of the same math in torch at the input dtype (flash-attn's criterion), plus
the input dtype's unit roundoff times the reference's scale."""

import math

import pytest

torch = pytest.importorskip("torch")

import llmk.ops as L  # noqa: E402
from llmk._C import ops as _C  # noqa: E402
from test_ops import (ACT_REFS, attention_transfer_ref, cosine_diversity_ref,  # noqa: E402
                      distill_ref, rope_ref)  # (the CPU suite's)

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and _C.cuda),
                                reason="needs a GPU and a CUDA build of llmk")

DT = [torch.bfloat16, torch.float16]
EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def rand(*shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(tuple(shape), generator=g, device="cuda", dtype=torch.float32).to(dtype)


def attention_math(q, k, v, causal, left, right, softcap, scale, upcast):
    """Batched [B, S, H, D] attention with flash-attn's masks; upcast: in float64, else in the
    inputs' dtype (torch's own low-precision error, the yardstick)."""
    dt = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq, device=q.device).unsqueeze(1) + Sk - Sq
    j = torch.arange(Sk, device=q.device).unsqueeze(0)
    ok = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    r = 0 if causal else right
    if left >= 0:
        ok &= j >= i - left
    if r >= 0:
        ok &= j <= i + r
    s = s.masked_fill(~ok, -math.inf)
    p = torch.softmax(s.float() if not upcast else s, -1).nan_to_num(0.0).to(dt)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def check(got, want, base, dtype, what, floor=0.0):
    """|got - want| <= 2 |base - want| + eps(dtype) * max(max|want|, floor), in max norm. floor:
    the size of the terms a result sums, where it can cancel to near zero (the gradient of q over
    one key is exactly 0, formed from O(1) terms that round)."""
    got, want, base = got.double(), want.double(), base.double()
    err = (got - want).abs().max().item()
    ref = (base - want).abs().max().item()
    if not math.isfinite(ref):  # torch's own result at dtype overflowed: judged on eps alone
        ref = 0.0
    scale = max(want.abs().max().item(), floor)
    assert torch.isfinite(got).all(), f"{what}: non-finite"
    assert err <= 2 * ref + EPS[dtype] * scale, \
        f"{what}: error {err:.3e}, torch {dtype} error {ref:.3e}, scale {scale:.3e}"


CASES = [
    # B, Sq, Sk, Hq, Hkv, D, causal, window, softcap
    (2, 129, 129, 8, 2, 64, True, None, None),
    (1, 300, 300, 7, 1, 96, True, None, None),
    (1, 77, 200, 4, 4, 128, True, 33, None),
    (2, 64, 64, 4, 1, 80, False, None, 30.0),
    (1, 200, 70, 2, 1, 112, True, None, None),  # fewer keys than queries
    (1, 1, 1, 1, 1, 64, True, None, None),
    (1, 1000, 1000, 8, 2, 128, True, None, 50.0),  # several query tiles per key tile, GQA 4
    (2, 190, 190, 4, 4, 96, False, None, None),
    (2, 300, 300, 4, 2, 128, False, None, None),
    (1, 190, 450, 7, 1, 128, True, None, None),  # GQA 7, more keys than queries
]


@pytest.fixture(params=["auto", "wgmma", "mma-sync"])
def attn_kernel(request):
    """Each attention test runs on every build of the kernels: what "auto" runs on an H100 (the
    forward warp-specialised at head dims 96 and 128), the warpgroup-MMA forward without warp
    specialisation, and the portable mma.sync one."""
    _C.set_attention_kernel(request.param)
    yield request.param
    _C.set_attention_kernel("auto")


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,causal,window,softcap", CASES)
def test_flash_attn_cuda(dtype, B, Sq, Sk, Hq, Hkv, D, causal, window, softcap, attn_kernel):
    q = rand(B, Sq, Hq, D, dtype=dtype, seed=1).requires_grad_()
    k = rand(B, Sk, Hkv, D, dtype=dtype, seed=2).requires_grad_()
    v = rand(B, Sk, Hkv, D, dtype=dtype, seed=3).requires_grad_()
    dout = rand(B, Sq, Hq, D, dtype=dtype, seed=4)
    scale = 1 / math.sqrt(D)
    left, right = L._window(window, causal)

    def grads(fn, *xs):
        out = fn(*xs)
        return (out, *torch.autograd.grad(out, xs, dout.to(out.dtype)))

    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    leavesd = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    want = grads(lambda *x: attention_math(*x, causal, left, right, softcap, scale, True),
                 *leaves64)
    base = grads(lambda *x: attention_math(*x, causal, left, right, softcap, scale, False),
                 *leavesd)
    L.reset_stats()
    got = grads(lambda *x: L.flash_attn(*x, causal=causal, window=window, softcap=softcap),
                q, k, v)
    for name, g, w, b in zip(("out", "dq", "dk", "dv"), got, want, base):
        assert g.dtype == dtype
        check(g, w, b, dtype, f"{name} {dtype}", floor=1.0)  # inputs and dO are N(0, 1)
    ops = {s["op"]: s for s in L.stats()}
    assert ops["flash_attention_forward"]["kernel"] == "cuda prefill"
    assert ops["flash_attention_backward"]["kernel"] == "cuda"


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("D", [64, 128])
def test_flash_attn_cuda_varlen(dtype, D, attn_kernel):
    lens_q, lens_k = [5, 0, 130, 1, 64], [9, 3, 130, 1, 0]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32,
                        device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32,
                        device="cuda")
    Hq, Hkv = 6, 2
    q = rand(sum(lens_q), Hq, D, dtype=dtype, seed=5).requires_grad_()
    k = rand(sum(lens_k), Hkv, D, dtype=dtype, seed=6).requires_grad_()
    v = rand(sum(lens_k), Hkv, D, dtype=dtype, seed=7).requires_grad_()
    dout = rand(sum(lens_q), Hq, D, dtype=dtype, seed=8)
    out = L.flash_attn(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                       max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    got = (out, *torch.autograd.grad(out, (q, k, v), dout))
    # Per sequence through the batched path of the reference.
    parts = {n: [] for n in ("want", "base")}
    for b in range(len(lens_q)):
        sq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        sk = slice(int(cu_k[b]), int(cu_k[b + 1]))
        for kind, up in (("want", True), ("base", False)):
            xs = [t.detach()[s].unsqueeze(0).to(torch.float64 if up else dtype).requires_grad_()
                  for t, s in ((q, sq), (k, sk), (v, sk))]
            o = attention_math(*xs, True, -1, -1, None, 1 / math.sqrt(D), up)
            gs = torch.autograd.grad(o, xs, dout[sq].unsqueeze(0).to(o.dtype), allow_unused=True)
            gs = [torch.zeros_like(x) if g is None else g for g, x in zip(gs, xs)]
            parts[kind].append([o.squeeze(0)] + [g.squeeze(0) for g in gs])
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        w = torch.cat([p[i] for p in parts["want"]])
        bse = torch.cat([p[i] for p in parts["base"]])
        check(got[i], w, bse, dtype, f"varlen {name} {dtype}")


@pytest.mark.parametrize("D,window", [(128, None), (128, 100), (64, None), (96, (90, 0))])
def test_flash_attn_cuda_deterministic(D, window, attn_kernel):
    """deterministic=True: the same bits of dq on every run (dq's parts from many key blocks,
    GQA 4, a varlen batch), and the same gradients as the float64 reference."""
    lens = [300, 1, 0, 257]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    Hq, Hkv = 8, 2
    q = rand(sum(lens), Hq, D, dtype=torch.bfloat16, seed=21).requires_grad_()
    k = rand(sum(lens), Hkv, D, dtype=torch.bfloat16, seed=22).requires_grad_()
    v = rand(sum(lens), Hkv, D, dtype=torch.bfloat16, seed=23).requires_grad_()
    dout = rand(sum(lens), Hq, D, dtype=torch.bfloat16, seed=24)

    def grads(det):
        out = L.flash_attn(q, k, v, causal=True, window=window, cu_seqlens_q=cu, cu_seqlens_k=cu,
                           max_seqlen_q=max(lens), max_seqlen_k=max(lens), deterministic=det)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads(True)
    for _ in range(3):
        again = grads(True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)
    loose = grads(False)
    for a, b in zip(first, loose):  # the same sums in another order: within rounding
        assert (a.double() - b.double()).abs().max().item() <= 2.0**-6 * b.abs().max().item()


def test_flash_attn_cuda_lse_gradient_and_layout(attn_kernel):
    q = rand(2, 33, 4, 64, dtype=torch.bfloat16, seed=9).requires_grad_()
    k = rand(2, 40, 2, 64, dtype=torch.bfloat16, seed=10).requires_grad_()
    v = rand(2, 40, 2, 64, dtype=torch.bfloat16, seed=11).requires_grad_()
    out, lse = L.flash_attn(q, k, v, causal=True, return_lse=True)
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    g = torch.autograd.grad(lse.sum(), (q, k))
    x64 = [t.detach().double().requires_grad_() for t in (q, k)]
    s = torch.einsum("bqhd,bkhd->bhqk", x64[0], x64[1].repeat_interleave(2, dim=2)) / 8.0
    i = torch.arange(33, device="cuda").unsqueeze(1) + 7
    s = s.masked_fill(torch.arange(40, device="cuda").unsqueeze(0) > i, -math.inf)
    lse64 = torch.logsumexp(s, -1)
    assert (lse.double() - lse64).abs().max().item() < 1e-4 * lse64.abs().max().item() + 1e-4
    w = torch.autograd.grad(lse64.sum(), x64)
    for a, b_ in zip(g, w):
        assert (a.double() - b_).abs().max().item() <= 2.0**-7 * b_.abs().max().item()


def test_flash_attn_cuda_fallbacks_and_errors():
    q = rand(1, 20, 2, 40, dtype=torch.bfloat16, seed=12)
    L.reset_stats()
    out = L.flash_attn(q, q, q, causal=True)
    want = attention_math(q, q, q, True, -1, -1, None, 1 / math.sqrt(40), True)
    base = attention_math(q, q, q, True, -1, -1, None, 1 / math.sqrt(40), False)
    check(out, want, base, torch.bfloat16, "generic forward")
    (row,) = [s for s in L.stats() if s["op"] == "flash_attention_forward"]
    assert row["kernel"] == "cuda generic" and "head dim 40" in row["reason"]
    qg = q.clone().requires_grad_()
    with pytest.raises(Exception, match="head dim 40 has no CUDA backward"):
        L.flash_attn(qg, qg, qg, causal=True).sum().backward()
    with pytest.raises(Exception, match="window without the causal mask"):
        L.flash_attn(q, q, q, window=(3, 3))


def test_flash_attn_cuda_runs_on_torch_stream():
    """Work queued on a side stream is ordered with torch's work on that stream."""
    s = torch.cuda.Stream()
    q = rand(1, 2048, 8, 128, dtype=torch.bfloat16, seed=13)
    ref = L.flash_attn(q, q, q, causal=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x = q * 1  # queued on s
        out = L.flash_attn(x, x, x, causal=True)
        y = out.clone()
    s.synchronize()
    assert torch.equal(y, ref)


# ---------------------------------------------------------------------------------------------
# RMSNorm, gated activations, RoPE: forward and backward


def run_both(fn, ref, inputs, dtype, grad_seed):
    """Outputs and input gradients of fn (llmk, at dtype), of ref in float64 and of ref at dtype
    (torch's own error), with the same random output gradients."""
    def go(f, dt):
        xs = [t.detach().to(dt).requires_grad_() if t.is_floating_point() else t for t in inputs]
        outs = f(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        gs = [rand(*o.shape, dtype=torch.float32, seed=grad_seed + i).to(o.dtype)
              for i, o in enumerate(outs)]
        leaves = [x for x in xs if x.is_floating_point()]
        return list(outs) + list(torch.autograd.grad(outs, leaves, gs))
    return go(fn, dtype), go(ref, torch.float64), go(ref, dtype)


def check_all(results, dtype, what):
    got, want, base = results
    for i, (g, w, b) in enumerate(zip(got, want, base)):
        assert g.dtype == dtype, f"{what} {i}: {g.dtype}"
        check(g, w, b, dtype, f"{what} {i}")


DT3 = [torch.bfloat16, torch.float16, torch.float32]
# float32: the kernels' exp and tanh are the hardware approximations (relative error about 2^-22
# each, a few per element), where torch's are correctly rounded to about 2^-24.
EPS[torch.float32] = 2.0**-21


def rms_ref(x, w, eps):
    """As Hugging Face's Llama RMSNorm: float32 math for 16-bit x (float64 for float64)."""
    xf = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


@pytest.mark.parametrize("dtype", DT3)
@pytest.mark.parametrize("shape", [(1, 1), (7, 100), (3, 33, 4096), (8192 + 1, 96)])
def test_rms_norm_cuda(dtype, shape):
    x = rand(*shape, dtype=dtype, seed=21)
    w = 1 + 0.1 * rand(shape[-1], dtype=dtype, seed=22)
    L.reset_stats()
    check_all(run_both(lambda x, w: L.rms_norm(x, w, 1e-5), lambda x, w: rms_ref(x, w, 1e-5),
                       [x, w], dtype, 23), dtype, f"rms_norm {shape}")
    assert {s["op"]: s["kernel"] for s in L.stats()}["rms_norm_forward"] == "cuda"


@pytest.mark.parametrize("dtype", DT3)
def test_rms_norm_residual_cuda(dtype):
    x, r = rand(5, 7, 512, dtype=dtype, seed=24), rand(5, 7, 512, dtype=dtype, seed=25)
    w = rand(512, dtype=dtype, seed=26)

    def ref(x, r, w):
        s = x + r
        return rms_ref(s, w, 1e-6), s

    check_all(run_both(lambda x, r, w: L.rms_norm(x, w, 1e-6, residual=r), ref, [x, r, w],
                       dtype, 27), dtype, "rms_norm + residual")


@pytest.mark.parametrize("dtype", DT3)
@pytest.mark.parametrize("kind", ["swiglu", "geglu", "geglu_erf"])
@pytest.mark.parametrize("shape", [(1,), (3, 1001), (64, 14336)])
def test_gated_cuda(dtype, kind, shape):
    g, u = rand(*shape, dtype=dtype, seed=31) * 3, rand(*shape, dtype=dtype, seed=32)
    import torch.nn.functional as F
    fn, ref = {
        "swiglu": (L.swiglu, lambda g, u: F.silu(g) * u),
        "geglu": (L.geglu, lambda g, u: F.gelu(g, approximate="tanh") * u),
        "geglu_erf": (lambda g, u: L.geglu(g, u, approximate="none"), lambda g, u: F.gelu(g) * u),
    }[kind]
    check_all(run_both(fn, ref, [g, u], dtype, 33), dtype, f"{kind} {shape}")


@pytest.mark.parametrize("dtype", DT3)
@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("heads_first", [False, True])
def test_rope_cuda(dtype, style, heads_first):
    B, S, Hq, Hk, D, R = 2, 77, 8, 2, 128, 32  # rot_dim 64 < D
    shape = (lambda h: (B, h, S, D)) if heads_first else (lambda h: (B, S, h, D))
    q, k = rand(*shape(Hq), dtype=dtype, seed=41), rand(*shape(Hk), dtype=dtype, seed=42)
    ang = torch.arange(S, device="cuda", dtype=torch.float64).unsqueeze(-1) * \
        10000.0 ** (-torch.arange(R, device="cuda", dtype=torch.float64) / R)
    cos, sin = ang.cos(), ang.sin()
    half = style == "neox"

    def fn(q, k):
        return L.rope(q, k, (cos.to(q.dtype), sin.to(q.dtype)), style=style,
                      heads_first=heads_first)

    def ref(q, k):
        def one(t):
            t4 = t.transpose(1, 2) if heads_first else t
            o = rope_ref(t4, cos.unsqueeze(0).to(t.dtype), sin.unsqueeze(0).to(t.dtype), half)
            return o.transpose(1, 2) if heads_first else o
        return one(q), one(k)

    check_all(run_both(fn, ref, [q, k], dtype, 43), dtype, f"rope {style}")


# ---------------------------------------------------------------------------------------------
# Hugging Face models patched by llmk.hf, in bf16


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3", "gemma3"])
def test_hf_models_bf16(family):
    """Loss and gradients of a tiny model through llmk.hf.apply in bf16 against the float64
    model, within twice the error of transformers' own bf16 path (SDPA) plus bf16's roundoff."""
    transformers = pytest.importorskip("transformers")
    import copy

    import llmk.hf

    common = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    cfg = {"llama": lambda: transformers.LlamaConfig(**common),
           "qwen2": lambda: transformers.Qwen2Config(**common),
           "phi3": lambda: transformers.Phi3Config(**common, pad_token_id=0),
           "gemma3": lambda: transformers.Gemma3TextConfig(
               **common, head_dim=64, sliding_window=64,
               layer_types=["sliding_attention", "full_attention"])}[family]()
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).to("cuda", torch.float64)
    base = copy.deepcopy(ref).to(torch.bfloat16)
    ours = llmk.hf.apply(copy.deepcopy(ref).to(torch.bfloat16))
    ids = torch.randint(1, 1000, (2, 200), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))

    def run(m):
        m.zero_grad()
        loss = m(ids, labels=ids).loss
        loss.backward()
        return [loss.detach()] + [p.grad.detach() for p in m.parameters()]

    want, b, got = run(ref), run(base), run(ours)
    for i, (g, w, bb) in enumerate(zip(got, want, b)):
        check(g, w, bb, torch.bfloat16, f"{family} {'loss' if i == 0 else f'grad {i}'}")


# ---------------------------------------------------------------------------------------------
# linear_act (bf16 on cuBLASLt)


def linear_act_inputs(M, K, N, bias, seed):
    dt = torch.bfloat16
    x = rand(M, K, dtype=dt, seed=seed)
    w = rand(N, K, dtype=dt, seed=seed + 1) / math.sqrt(K)
    return x, w, rand(N, dtype=dt, seed=seed + 2) if bias else None


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "none"])
@pytest.mark.parametrize("M,K,N,bias", [(1, 64, 8, True), (77, 136, 200, False),
                                        (256, 1024, 4096, True)])
def test_linear_act_cuda(act, M, K, N, bias):
    import torch.nn.functional as F
    x, w, b = linear_act_inputs(M, K, N, bias, 51)
    inputs = [x, w] + ([b] if bias else [])
    L.reset_stats()
    check_all(run_both(lambda x, w, *b: L.linear_act(x, w, b[0] if b else None, act),
                       lambda x, w, *b: ACT_REFS[act](F.linear(x, w, b[0] if b else None)),
                       inputs, torch.bfloat16, 54), torch.bfloat16, f"linear_act {act} {M}x{K}x{N}")
    kernels = {s["op"]: s["kernel"] for s in L.stats()}
    assert kernels["linear_act_forward"] == "cuda" and kernels["linear_act_backward"] == "cuda"


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "none"])
@pytest.mark.parametrize("M,K,N,bias", [(1, 64, 8, True), (77, 136, 200, False),
                                        (128, 1024, 4096, True)])
def test_linear_act_cuda_without_grad(act, M, K, N, bias):
    # No gradient wanted: no pre-activation kept. On Hopper every activation runs in llmk's GEMM
    # epilogue; elsewhere gelu_tanh runs in cuBLASLt's and the others after the GEMM in place (a
    # fallback reason in the stats).
    import torch.nn.functional as F
    x, w, b = linear_act_inputs(M, K, N, bias, 61)
    lin = lambda dt: F.linear(x.to(dt), w.to(dt), None if b is None else b.to(dt))  # noqa: E731
    L.reset_stats()
    with torch.no_grad():
        got = L.linear_act(x, w, b, act)
    check(got, ACT_REFS[act](lin(torch.float64)), ACT_REFS[act](lin(torch.bfloat16)),
          torch.bfloat16, f"linear_act {act}")
    (row,) = [s for s in L.stats() if s["op"] == "linear_act_forward"]
    assert row["kernel"] == "cuda"
    fused = act in ("gelu_tanh", "none") or torch.cuda.get_device_capability() == (9, 0)
    assert (row["reason"] == "") == fused, row


# ---------------------------------------------------------------------------------------------
# distill_loss (one row per cluster of blocks, staged in shared memory where it fits)


def distill_case(dt, shape, loss, beta, temperature, alpha, reduction, seed):
    """llmk's loss and student gradient at dt, and the float64 reference's and torch's at dt
    (each from the same dt-rounded logits, the same random output gradient)."""
    s = rand(*shape, dtype=torch.float32, seed=seed) * 3
    t = rand(*shape, dtype=torch.float32, seed=seed + 1) * 3
    g = torch.Generator(device="cuda").manual_seed(seed + 2)
    labels = torch.randint(0, shape[-1], shape[:-1], generator=g, device="cuda")
    labels.view(-1)[::3] = -100
    kw = dict(loss=loss, beta=beta, temperature=temperature, alpha=alpha, reduction=reduction)
    res = []
    for fn, at in ((L.distill_loss, dt), (None, torch.float64), (None, dt)):
        x = s.to(dt).to(at).requires_grad_()
        y = t.to(dt).to(at)
        out = (fn(x, y, labels=labels, **kw) if fn else
               distill_ref(x, y, labels, loss, beta, temperature, alpha, -100, reduction))
        go = rand(*out.shape, dtype=torch.float32, seed=seed + 3).to(out.dtype)
        (gx,) = torch.autograd.grad(out, x, go)
        res.append((out, gx))
    return res


# Vocabularies off the vector width and on it ((300, 4104) and (160, 60000): many rows of
# 16-byte vectors; (2, 128256): clusters of 8 blocks).
@pytest.mark.parametrize("dt", DT3)
@pytest.mark.parametrize("shape", [(1, 7), (3, 1001), (4, 32003), (2, 128256), (300, 4104),
                                   (160, 60000)])
@pytest.mark.parametrize("loss,beta", [("kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.5)])
def test_distill_loss_cuda(dt, shape, loss, beta):
    (out, g), (want, gwant), (_, gbase) = distill_case(dt, shape, loss, beta, 2.0, 0.3,
                                                       "batchmean", 120)
    assert out.dtype == (torch.float64 if dt == torch.float64 else torch.float32)
    err = abs(out.item() - want.item())
    assert err <= 1e-4 * max(abs(want.item()), 1e-3), f"loss {out.item()} vs {want.item()}"
    assert g.dtype == dt
    check(g, gwant, gbase, dt, f"distill {loss} {shape} gradient")


# KL and reverse KL of 16-bit logits without a separate hard-label softmax (alpha 0, or T 1) run
# with each row in registers on sm_90: one block per row (8, 4104; 700 rows: more rows than
# clusters fit at once, so clusters walk rows), clusters of 2 to 16 blocks (8200, 60000, 128256)
# and 32 logits a thread (262144); every third row ignored. Past 262,144 logits the staging kernel.
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 8), (5, 4104), (700, 4104), (3, 8200), (7, 60000),
                                   (2, 128256), (2, 262144), (2, 262152)])
@pytest.mark.parametrize("loss", ["kl", "reverse_kl"])
@pytest.mark.parametrize("temperature,alpha", [(2.0, 0.0), (1.0, 0.3)])
def test_distill_loss_cuda_rows_in_registers(dt, shape, loss, temperature, alpha):
    L.reset_stats()
    (out, g), (want, gwant), (_, gbase) = distill_case(dt, shape, loss, 0.5, temperature, alpha,
                                                       "batchmean", 170)
    err = abs(out.item() - want.item())
    assert err <= 1e-4 * max(abs(want.item()), 1e-3), f"loss {out.item()} vs {want.item()}"
    check(g, gwant, gbase, dt, f"distill {loss} {shape} gradient")
    kernels = {r["kernel"] for r in L.stats() if r["op"] == "distill_forward"}
    if torch.cuda.get_device_capability()[0] >= 9:
        assert kernels == {"cuda" if shape[-1] > 262144 else "cuda-registers"}, kernels


@pytest.mark.parametrize("loss", ["kl", "reverse_kl"])
def test_distill_loss_cuda_rows_in_registers_extreme_logits(loss):
    # bf16 rows of 32,000 (registers). KL: teacher logits of -inf (a top-k teacher's tail), a
    # row whose teacher keeps one logit (reverse KL is infinite there: the student gives mass
    # where the teacher gives none). Both: a student row of one logit far above the rest.
    s = rand(4, 32000, dtype=torch.float32, seed=185) * 3
    t = rand(4, 32000, dtype=torch.float32, seed=186) * 3
    if loss == "kl":
        t[0, ::2] = -math.inf
        t[1, 1:] = -math.inf
        t[3, :16000] = -math.inf
    s[2, 1:] = -3000.0
    x = s.to(torch.bfloat16).requires_grad_()
    out = L.distill_loss(x, t.to(torch.bfloat16), loss=loss, temperature=2.0)
    (gx,) = torch.autograd.grad(out, x)
    x64 = s.to(torch.bfloat16).double().requires_grad_()
    want = distill_ref(x64, t.to(torch.bfloat16).double(), None, loss, 0.5, 2.0)
    (gw,) = torch.autograd.grad(want, x64)
    assert torch.isfinite(out) and torch.isfinite(gx).all()
    assert abs(out.item() - want.item()) <= 1e-4 * max(abs(want.item()), 1.0)
    assert (gx.double() - gw).abs().max().item() <= EPS[torch.bfloat16] * gw.abs().max().item()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("temperature,alpha", [(1.0, 0.0), (4.0, 1.0)])
def test_distill_loss_cuda_reductions(reduction, temperature, alpha):
    dt = torch.bfloat16
    (out, g), (want, gwant), (_, gbase) = distill_case(dt, (5, 3, 4099), "jsd", 0.25,
                                                       temperature, alpha, reduction, 130)
    d = (out.double() - want).abs().max().item()
    assert d <= 1e-4 * max(want.abs().max().item(), 1e-3)
    check(g, gwant, gbase, dt, f"distill {reduction} gradient")


def test_distill_loss_cuda_label_outside_gives_nan():
    s = rand(2, 100, dtype=torch.bfloat16, seed=140)
    t = rand(2, 100, dtype=torch.bfloat16, seed=141)
    out = L.distill_loss(s, t, labels=torch.tensor([5, 100], device="cuda"), alpha=0.5,
                         reduction="none")
    assert torch.isfinite(out[0]) and torch.isnan(out[1])


@pytest.mark.parametrize("loss", ["kl", "jsd"])
@pytest.mark.parametrize("V", [5003, 5008])
@pytest.mark.parametrize("temperature,alpha", [(2.0, 0.3), (1.0, 0.3), (2.0, 0.0)])
def test_fused_linear_distill_loss_cuda(loss, V, temperature, alpha):
    # bf16 hidden states and lm_heads, a vocabulary off the vector width and on it (gradients
    # over the logits in place), chunks of 64 rows; KL at V 5008 with alpha 0 or T 1 runs the
    # register kernel in place.
    import torch.nn.functional as F
    BT, H = 300, 64
    dt = torch.bfloat16
    L.reset_stats()
    h, w = rand(BT, H, dtype=dt, seed=150), rand(V, H, dtype=dt, seed=151) / 4
    th, tw = rand(BT, H, dtype=dt, seed=152), rand(V, H, dtype=dt, seed=153) / 4
    g = torch.Generator(device="cuda").manual_seed(154)
    labels = torch.randint(0, V, (BT,), generator=g, device="cuda")
    labels[::7] = -100
    res = []
    for at in (dt, torch.float64, dt):
        x, wx = h.to(at).requires_grad_(), w.to(at).requires_grad_()
        if len(res) == 0:
            out = L.fused_linear_distill_loss(x, wx, teacher_hidden=th, teacher_weight=tw,
                                              loss=loss, temperature=temperature, labels=labels,
                                              alpha=alpha, chunk_rows=64)
        else:
            out = distill_ref(F.linear(x, wx), F.linear(th.to(at), tw.to(at)), labels, loss, 0.5,
                              temperature, alpha, -100, "batchmean")
        res.append((out,) + torch.autograd.grad(out, (x, wx)))
    (out, gh, gw), (want, wh, ww), (base, bh, bw) = res
    if torch.cuda.get_device_capability()[0] >= 9:
        kernels = {r["kernel"] for r in L.stats() if r["op"] == "distill_forward"}
        registers = loss == "kl" and V % 8 == 0 and (alpha == 0 or temperature == 1)
        assert kernels == {"cuda-registers" if registers else "cuda"}, kernels
    check(out, want, base, dt, f"fused {loss} loss")
    check(gh, wh, bh, dt, f"fused {loss} d hidden")
    check(gw, ww, bw, dt, f"fused {loss} d weight")


@pytest.mark.parametrize("loss", ["kl", "jsd"])
@pytest.mark.parametrize("V", [37, 32003, 32000])
def test_distill_loss_cuda_infinite_teacher_logits(loss, V):
    # Teacher logits of -inf (a top-k teacher's tail): probability 0, adding nothing to KL or JSD,
    # never NaN; a row whose teacher keeps a single logit.
    s = rand(4, V, dtype=torch.float32, seed=180) * 3
    t = rand(4, V, dtype=torch.float32, seed=181) * 3
    t[0, ::2] = -math.inf
    t[1, 1:] = -math.inf
    t[3, : V // 2] = -math.inf
    x = s.clone().requires_grad_()
    out = L.distill_loss(x, t, loss=loss, temperature=2.0)
    (gx,) = torch.autograd.grad(out, x)
    x64 = s.double().requires_grad_()
    want = distill_ref(x64, t.double(), None, loss, 0.5, 2.0)
    (gw,) = torch.autograd.grad(want, x64)
    assert torch.isfinite(out) and torch.isfinite(gx).all()
    assert abs(out.item() - want.item()) <= 1e-5 * max(abs(want.item()), 1.0)
    assert (gx.double() - gw).abs().max().item() <= 1e-6 * max(gw.abs().max().item(), 1.0)


@pytest.mark.parametrize("k", [1, 64, 5003])
def test_fused_linear_distill_loss_teacher_topk_cuda(k):
    # bf16 hidden states and lm_head; the teacher as its top k logits (k = V: all of them).
    import torch.nn.functional as F
    BT, H, V = 200, 64, 5003
    dt = torch.bfloat16
    h, w = rand(BT, H, dtype=dt, seed=185), rand(V, H, dtype=dt, seed=186) / 4
    vals, idx = torch.topk(rand(BT, V, dtype=torch.float32, seed=187) * 2, k, dim=1)
    dense = torch.full((BT, V), -math.inf, device="cuda", dtype=torch.float64)
    dense.scatter_(1, idx, vals.double())
    res = []
    for at in (dt, torch.float64, dt):
        x, wx = h.to(at).requires_grad_(), w.to(at).requires_grad_()
        if len(res) == 0:
            out = L.fused_linear_distill_loss(x, wx, teacher_topk=(vals, idx), loss="kl",
                                              temperature=2.0, chunk_rows=64)
        else:
            out = distill_ref(F.linear(x, wx), dense.to(at), None, "kl", 0.5, 2.0)
        res.append((out,) + torch.autograd.grad(out, (x, wx)))
    (out, gh, gw), (want, wh, ww), (base, bh, bw) = res
    assert torch.isfinite(out)
    check(out, want, base, dt, f"top-{k} loss")
    check(gh, wh, bh, dt, f"top-{k} d hidden")
    check(gw, ww, bw, dt, f"top-{k} d weight")


@pytest.mark.parametrize("dt", DT3)
def test_pairwise_cosine_distance_cuda(dt):
    x = rand(1000, 72, dtype=dt, seed=195)
    x[3] = 0.0
    xr = x.clone().requires_grad_()
    D = L.pairwise_cosine_distance(xr)
    assert D.dtype == dt and D.shape == (1000, 1000)
    x64 = x.double().requires_grad_()
    n = x64.norm(dim=1, keepdim=True)
    u = torch.where(n > 0, x64 / torch.where(n > 0, n, 1.0), 0.0)
    want = 1 - u @ u.T
    w = rand(1000, 1000, dtype=torch.float32, seed=196)
    (g,) = torch.autograd.grad((D.float() * w).sum(), xr)
    (gw,) = torch.autograd.grad((want * w.double()).sum(), x64)
    # u rounded to dt, the product of two of them summed in f32, the result rounded to dt.
    assert (D.double() - want).abs().max().item() <= 4 * EPS.get(dt, 2.0**-20)
    assert D[3].eq(1).all() and D[:, 3].eq(1).all()
    err = (g.double() - gw).abs().max().item()
    assert err <= 8 * EPS.get(dt, 2.0**-20) * gw.abs().max().item(), err


def test_flash_attn_cuda_under_autocast():
    # float32 inputs under autocast run in autocast's dtype (as SDPA), gradients reach them.
    q, k, v = (rand(2, 64, 4, 64, dtype=torch.float32, seed=197 + i).requires_grad_()
               for i in range(3))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = L.flash_attn(q, k, v, causal=True)
    want = L.flash_attn(*(t.detach().bfloat16() for t in (q, k, v)), causal=True)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in (q, k, v))


def test_cosine_topk_and_attention_transfer_cuda():
    # The torch-composed ops on CUDA tensors, float32 against float64.
    x = rand(3001, 33, dtype=torch.float32, seed=190)
    x[7] = 0.0
    dist, idx = L.cosine_topk(x, 4, chunk_rows=512)
    x64 = x.double()
    u = x64 / x64.norm(dim=1, keepdim=True).clamp(min=1e-300)
    full = 1 - u @ u.T
    full.fill_diagonal_(math.inf)
    wd, _ = torch.topk(full, 4, dim=1, largest=False)
    assert (dist.double() - wd).abs().max().item() <= 1e-5
    assert (full.gather(1, idx) - wd).abs().max().item() <= 1e-5  # the indices' own distances
    tq, tk = rand(2, 300, 8, 16, dtype=torch.float32, seed=191), rand(2, 300, 8, 16,
                                                                       dtype=torch.float32,
                                                                       seed=192)
    sq = rand(2, 300, 2, 24, dtype=torch.float32, seed=193).requires_grad_()
    sk = rand(2, 300, 2, 24, dtype=torch.float32, seed=194).requires_grad_()
    out = L.attention_transfer_loss(tq, tk, sq, sk, temperature=2.0, causal=True,
                                    relation_heads=2, block=64)
    g = torch.autograd.grad(out, (sq, sk))
    r = [t.detach().cpu().double().requires_grad_() for t in (sq, sk)]
    want = attention_transfer_ref(tq.cpu().double(), tk.cpu().double(), r[0], r[1], 2.0, True, 2)
    gw = torch.autograd.grad(want, r)
    assert abs(out.item() - want.item()) <= 1e-5 * max(abs(want.item()), 1.0)
    for a, b in zip(g, gw):
        assert (a.cpu().double() - b).abs().max().item() <= 1e-5 * max(b.abs().max().item(), 1.0)


# ---------------------------------------------------------------------------------------------
# attention_transfer_loss: the fused tensor-core kernel (bf16, fp16)


def transfer_ref64(tq, tk, sq, sk, T, causal, R, gscale):
    """The materialised S x S form in float64 on the GPU, on the inputs' own (rounded) values:
    per row kl, lse_t, lse_s [B, R, S], the size of each side's scores (scale |q_i| max_j |k_j|)
    and of the terms each row's values come from; the gradients of gscale * mean(kl) for sq and
    sk, the largest sum of |terms| an element of each gradient adds up (sum_j |dS_ij| |k_jc|,
    sum_i |dS_ij| |q_ic|, times g scale_s), and the largest column sum of p_s + p_t."""
    def rel(x):
        B, S, H, D = x.shape
        return x.double().reshape(B, S, R, H * D // R).transpose(1, 2)

    def back(x, like):  # [B, R, S, d] -> like's [B, S, H, D]
        return x.transpose(1, 2).reshape(like.shape)

    qt, kt, qs, ks = (rel(t) for t in (tq, tk, sq, sk))
    st, ss = 1 / (math.sqrt(qt.shape[-1]) * T), 1 / (math.sqrt(qs.shape[-1]) * T)
    a_t, a_s = (qt @ kt.transpose(-1, -2)) * st, (qs @ ks.transpose(-1, -2)) * ss
    if causal:
        S = a_t.shape[-1]
        above = torch.ones(S, S, dtype=torch.bool, device=a_t.device).triu(1)
        a_t, a_s = a_t.masked_fill(above, -math.inf), a_s.masked_fill(above, -math.inf)
    lse_t, lse_s = a_t.logsumexp(-1), a_s.logsumexp(-1)
    lp_t, lp_s = a_t - lse_t.unsqueeze(-1), a_s - lse_s.unsqueeze(-1)
    p_t, p_s = lp_t.exp(), lp_s.exp()
    kl = torch.where(p_t > 0, p_t * (lp_t - lp_s), torch.zeros_like(p_t)).sum(-1)
    # A row's values are formed from its scores and the two log-sum-exps.
    size_t = st * qt.norm(dim=-1) * kt.norm(dim=-1).amax(-1, keepdim=True)
    size_s = ss * qs.norm(dim=-1) * ks.norm(dim=-1).amax(-1, keepdim=True)
    terms = size_t + size_s + lse_t.abs() + lse_s.abs()
    gs = gscale / kl.numel() * ss
    ds = p_s - p_t
    return {"kl": kl, "lse_t": lse_t, "lse_s": lse_s, "terms": terms, "loss": kl.mean(),
            "size_t": size_t, "size_s": size_s, "colsum": (p_s + p_t).sum(-2).amax().item(),
            "dq": back(ds @ ks * gs, sq), "dk": back(ds.transpose(-1, -2) @ qs * gs, sk),
            "dq_terms": (ds.abs() @ ks.abs()).amax().item() * gs,
            "dk_terms": (ds.abs().transpose(-1, -2) @ qs.abs()).amax().item() * gs,
            "gs": gs}


TRANSFER_CASES = [
    # B, S, teacher (H, D), student (H, D), relation heads, causal, T: relation head dims in
    # the comments (teacher / student)
    (2, 1, (4, 64), (4, 64), 4, True, 1.0),      # 64 / 64, one row
    (1, 17, (2, 96), (3, 64), 2, False, 2.0),    # 96 / 96
    (2, 17, (4, 64), (2, 64), 2, True, 4.0),     # 128 / 64
    (1, 1000, (8, 64), (4, 64), 2, True, 2.0),   # 256 / 128
    (1, 1000, (4, 64), (4, 96), 4, False, 1.0),  # 64 / 96
    (2, 1000, (2, 128), (1, 128), 1, True, 2.0),  # 256 / 128, one relation head
    (1, 300, (2, 36), (1, 40), 1, True, 2.0),    # 72 / 40: padded to 80 / 48 with zeros
    (1, 130, (2, 128), (1, 256), 1, False, 2.0),  # 256 / 256, the largest
    (1, 1500, (4, 128), (4, 128), 4, False, 1.0),  # 128 / 128
    (2, 2048, (8, 128), (4, 64), 4, True, 2.0),  # 256 / 64, the benchmark's relation heads
]


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("B,S,teacher,student,R,causal,T", TRANSFER_CASES)
def test_attention_transfer_cuda(dt, B, S, teacher, student, R, causal, T):
    seed = 200 + S + R
    tq, tk = rand(B, S, *teacher, dtype=dt, seed=seed), rand(B, S, *teacher, dtype=dt,
                                                             seed=seed + 1)
    sq, sk = rand(B, S, *student, dtype=dt, seed=seed + 2), rand(B, S, *student, dtype=dt,
                                                                 seed=seed + 3)
    # The gradient of the loss times about B R S (a power of 2), as a loss scaler would use with
    # fp16: the gradients are then of order scale_s, inside fp16's normal range.
    gscale = float(2 ** round(math.log2(B * R * S)))
    ref = transfer_ref64(tq, tk, sq, sk, T, causal, R, gscale)
    stream = torch.cuda.current_stream().cuda_stream
    rows = [t.reshape(B, S, -1) for t in (tq, tk, sq, sk)]

    # Per row, outputs poisoned first. fp32 scores of exact products of the 16-bit inputs, sums
    # of S / 4 exponentials per lane (ex2.approx, relative error 2^-22): within 2^-16 of the size
    # of the row's terms.
    kl, lse_t, lse_s = (torch.full((B, R, S), math.nan, device="cuda") for _ in range(3))
    _C.attention_transfer_forward(kl, lse_t, lse_s, *rows, R, T, causal, stream)
    tol = 2.0**-16 * ref["terms"]
    errs = {}
    for name, got in (("kl", kl), ("lse_t", lse_t), ("lse_s", lse_s)):
        assert torch.isfinite(got).all(), f"{name}: non-finite"
        errs[name] = err = (got.double() - ref[name]).abs()
        assert (err <= tol).all(), f"{name}: error {err.max().item():.3e} (tolerance " \
            f"{tol[err > tol].min().item():.3e})"
    # The gradients: dS rounded to dt (unit roundoff EPS, relative to the terms it multiplies)
    # and the fp32 sums rounded to dt once (EPS of the result); for fp16 also its quantum near 0,
    # for dS (S terms of 2^-25 at most, each times |k| g scale_s) and for the result (2^-24).
    # Before the rounding, p_s and p_t carry fp32 errors (relative): their scores' (an mma per 16
    # of d, taken as 4 roundings of 2^-24 each, and 8 more, of the score's size), their
    # log-sum-exps' (as measured above) and ex2.approx's (2^-22 each), summed over the keys with
    # the weights p_s + p_t (2 a row for dq; the largest column sum for dk).
    u32 = 2.0**-24
    steps_t, steps_s = (-(-(H * D // R) // 16) for H, D in (teacher, student))
    p_err = (4 * (steps_t + 2) * u32 * ref["size_t"] + 4 * (steps_s + 2) * u32 * ref["size_s"]
             + errs["lse_t"] + errs["lse_s"] + 2.0**-21).max().item()
    dout = torch.full((1,), gscale, device="cuda")
    dq, dk = (torch.full(t.shape, math.nan, dtype=dt, device="cuda") for t in rows[2:])
    _C.attention_transfer_backward(dq, dk, dout, *rows, lse_t, lse_s, R, T, causal, stream)
    dq2, dk2 = (torch.full(t.shape, math.nan, dtype=dt, device="cuda") for t in rows[2:])
    _C.attention_transfer_backward(dq2, dk2, dout, *rows, lse_t, lse_s, R, T, causal, stream)
    assert torch.equal(dq, dq2) and torch.equal(dk, dk2), "not deterministic"

    def check_grad(got, name, other, weight):
        want, big = ref[name], other.abs().max().item()
        tol = EPS[dt] * (want.abs().max().item() + ref[name + "_terms"])
        tol += ref["gs"] * big * p_err * weight
        if dt == torch.float16:
            tol += 2.0**-25 * S * ref["gs"] * big + 2.0**-24
        assert torch.isfinite(got).all(), f"{name}: non-finite"
        err = (got.double().reshape(want.shape) - want).abs().max().item()
        assert err <= tol, f"{name}: error {err:.3e} (tolerance {tol:.3e})"

    check_grad(dq, "dq", sk, 2.0)
    check_grad(dk, "dk", sq, ref["colsum"])

    # Through llmk.ops and autograd: the kernel ran, and the same values came out.
    L.reset_stats()
    q, k = sq.clone().requires_grad_(), sk.clone().requires_grad_()
    out = L.attention_transfer_loss(tq, tk, q, k, temperature=T, causal=causal, relation_heads=R)
    assert out.dtype == torch.float32
    err = abs(out.item() - ref["loss"].item())
    assert err <= tol.max().item(), f"loss {out.item()} vs {ref['loss'].item()}"
    gq, gk = torch.autograd.grad(out, (q, k), torch.tensor(gscale, device="cuda"))
    assert torch.equal(gq, dq.view(gq.shape)) and torch.equal(gk, dk.view(gk.shape))
    kernels = sorted((s["op"], s["kernel"]) for s in L.stats())
    assert kernels == [("attention_transfer_backward", "cuda"),
                       ("attention_transfer_forward", "cuda")], kernels


def test_attention_transfer_cuda_falls_back():
    # Where the kernel does not apply, the torch path runs and stats() says why; the C++ op says
    # the same (llmk.ops decides from metadata, the C++ op from pointers).
    def case(teacher, student, R, dtype=torch.bfloat16, offset=0):
        tq = rand(2, 40, *teacher, dtype=dtype, seed=300)
        if offset:  # the same values one element into a buffer: 2 bytes off 16
            buf = torch.empty(tq.numel() + offset, dtype=dtype, device="cuda")
            tq = buf[offset:].view(tq.shape).copy_(tq)
        tk = rand(2, 40, *teacher, dtype=dtype, seed=301)
        sq = rand(2, 40, *student, dtype=dtype, seed=302).requires_grad_()
        sk = rand(2, 40, *student, dtype=dtype, seed=303)
        L.reset_stats()
        out = L.attention_transfer_loss(tq, tk, sq, sk, relation_heads=R)
        (g,) = torch.autograd.grad(out, sq)
        assert torch.isfinite(out) and torch.isfinite(g).all()
        reasons = [(s["kernel"], s["reason"]) for s in L.stats()
                   if s["op"] == "attention_transfer_loss"]
        assert len(reasons) == 1 and reasons[0][0] == "torch", L.stats()
        why = _C.attention_transfer_unsupported(*(t.detach().reshape(2, 40, -1)
                                                  for t in (tq, tk, sq, sk)), R)
        assert why, "the C++ op would take what llmk.ops did not"
        return reasons[0][1]

    assert "multiples of 8" in case((2, 6), (2, 8), 1)          # d_t 12
    assert "at most 256 and 256" in case((4, 64), (4, 96), 1)   # d_t 256, d_s 384
    assert "bf16 or fp16" in case((2, 64), (2, 64), 2, dtype=torch.float32)
    assert "teacher_q is not 16-byte aligned" in case((2, 64), (2, 64), 2, offset=1)


# ---------------------------------------------------------------------------------------------
# pairwise_cosine_diversity (O(N d), column sums in a fixed order)


@pytest.mark.parametrize("dt", DT3)
@pytest.mark.parametrize("n,d", [(1, 5), (2, 3), (3, 1), (17, 64), (2003, 33), (4099, 1000),
                                 (3001, 1024), (1000, 512)])
def test_pairwise_cosine_diversity_cuda(dt, n, d):
    # d 1024 and 512: the register fast path (d a multiple of 32 vectors); the others: general.
    x = rand(n, d, dtype=dt, seed=n + d)
    if n > 2:
        x[1] = 0.0  # a zero row: distance 1 to every row, a zero gradient
    x64 = x.double().cpu()
    norm = x64.norm(dim=1)
    S = (x64 / torch.where(norm > 0, norm, 1.0).unsqueeze(1)).sum(0)
    inv = torch.where(norm > 0, 1.0 / torch.where(norm > 0, norm, 1.0), 0.0)
    for reduction in ("mean", "rows"):
        out = L.pairwise_cosine_diversity(x, reduction)
        assert out.dtype == torch.float32
        want = cosine_diversity_ref(x64, reduction == "rows")
        # f32 sums of unit vectors, against values of order 1.
        assert (out.double().cpu() - want).abs().max().item() <= 1e-5, f"{reduction} {n}x{d}"
        if n < 2:
            continue
        w = rand(*out.shape, dtype=torch.float32, seed=9)
        xr = x.detach().clone().requires_grad_()
        (gx,) = torch.autograd.grad((L.pairwise_cosine_diversity(xr, reduction) * w).sum(), xr)
        x64r = x64.clone().requires_grad_()
        (gw,) = torch.autograd.grad((cosine_diversity_ref(x64r, reduction == "rows")
                                     * w.double().cpu()).sum(), x64r)
        gx = gx.double().cpu()
        # The size of the terms the gradient is formed from (du_k / |x_k|, before the projection
        # cancels them; a gradient can be exactly 0, as for d = 1), and f16's quantum near 0.
        wmax = w.abs().max().item()
        du = (2 * wmax * S.norm().item() / (n - 1) if reduction == "rows"
              else 2 * wmax * S.norm().item() / (n * (n - 1)))
        terms = du * inv.max().item()
        tol = max(4 * EPS[dt], 1e-5) * max(gw.abs().max().item(), terms)
        tol += 2.0**-24 if dt == torch.float16 else 0.0
        err = (gx - gw).abs().max().item()
        assert err <= tol, f"{reduction} {n}x{d} gradient {err:.3e} (tolerance {tol:.3e})"
        if n > 2:
            assert (gx[1] == 0).all()
