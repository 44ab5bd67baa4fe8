"""llmk.hf.apply on tiny random Llama, Qwen2, Phi-3 and Gemma 3 models, and llmk.nn: the same
logits, loss and gradients as transformers' own path (float64 on the CPU, where transformers'
float32 steps are made float64, so any difference beyond rounding is a bug), padded batches,
and the modules' own checks."""

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import llmk.hf  # noqa: E402
import llmk.nn  # noqa: E402
import llmk.ops as L  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def tiny(family):
    if family == "llama":
        cfg = transformers.LlamaConfig(**COMMON, rope_theta=5e5)
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**COMMON)
    elif family == "phi3":
        cfg = transformers.Phi3Config(**COMMON, pad_token_id=0)
    else:
        cfg = transformers.Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=5,
                                            layer_types=["sliding_attention", "full_attention"])
    # The reference: SDPA (float64 math on the CPU; eager's softmax runs in float32).
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float64)
    # Random, not the init's ones and zeros: norms and biases must matter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


def exact_norms(model, offset):
    """transformers' RMSNorm computes in float32 whatever the model's dtype: the reference's
    norms here compute in the model's float64 instead, so that only rounding separates it from
    llmk's."""
    import types

    def forward(self, x):
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + self.weight)

    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = types.MethodType(forward, m)
    return model


def loss_and_grads(model, ids, mask=None):
    model.zero_grad()
    out = model(ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3", "gemma3"])
def test_apply_matches_transformers(family):
    model = tiny(family)
    ours = llmk.hf.apply(copy.deepcopy(model))
    exact_norms(model, 1.0 if family == "gemma3" else 0.0)
    ids = torch.randint(1, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    L.reset_stats()
    want = loss_and_grads(model, ids)
    assert L.stats() == [], "the reference ran llmk's ops"  # the RoPE patch is per model
    got = loss_and_grads(ours, ids)
    ran = {s["op"] for s in L.stats()}
    assert {"flash_attention_forward", "flash_attention_backward", "rms_norm_forward",
            "rope_rotate", "gated_forward", "gated_backward"} <= ran, ran
    assert not [s for s in L.stats() if s["reason"]], L.stats()
    layers = ours.model.layers
    # Llama and Qwen2: residual adds in the norms and the down projection; q|k|v one node.
    assert all(getattr(m.forward, "llmk", False) for m in layers) == (family in ("llama", "qwen2"))
    assert all(getattr(m.self_attn, "_llmk_qkv", False) for m in layers) == (family != "phi3")
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-10)
    assert got[2].keys() == want[2].keys()
    for n in want[2]:
        torch.testing.assert_close(got[2][n], want[2][n], rtol=1e-9, atol=1e-10, msg=n)


def test_padded_batch_matches_transformers():
    model = tiny("llama")
    ours = llmk.hf.apply(copy.deepcopy(model))
    exact_norms(model, 0.0)
    ids = torch.randint(1, 97, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[2, 7:] = 0  # right padding
    logits_want = model(ids, attention_mask=mask).logits
    logits_got = ours(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(logits_got[keep], logits_want[keep], rtol=1e-10, atol=1e-10)


def test_register_gives_attn_implementation():
    llmk.hf.register()
    cfg = transformers.LlamaConfig(**COMMON)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="llmk")
    assert model.config._attn_implementation == "llmk"
    L.reset_stats()
    model(torch.randint(0, 97, (1, 5)))
    assert any(s["op"] == "flash_attention_forward" for s in L.stats())


def test_apply_rejects_other_models():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)
    with pytest.raises(ValueError, match="model type 'gpt2'"):
        llmk.hf.apply(transformers.AutoModelForCausalLM.from_config(cfg))


def test_nn_modules():
    torch.manual_seed(3)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    lin = torch.nn.Linear(32, 48).double()
    for mod, ref in ((llmk.nn.LinearSiLU(32, 48), torch.nn.functional.silu),
                     (llmk.nn.LinearGELU(32, 48), torch.nn.functional.gelu),
                     (llmk.nn.LinearGELU(32, 48, approximate="tanh"),
                      lambda t: torch.nn.functional.gelu(t, approximate="tanh"))):
        mod = mod.double()
        mod.load_state_dict(lin.state_dict())
        torch.testing.assert_close(mod(x), ref(lin(x)), rtol=1e-12, atol=1e-12)
    norm = llmk.nn.RMSNorm(32, eps=1e-5, dtype=torch.float64)
    torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    attn = llmk.nn.FlashAttention(causal=True, window=3)
    q = torch.randn(1, 6, 2, 8, dtype=torch.float64)
    torch.testing.assert_close(attn(q, q, q), L.flash_attn(q, q, q, causal=True, window=3))


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_linear(bits):
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(300, 40), torch.nn.ReLU(), torch.nn.Linear(40, 7))
    x = torch.randn(3, 300)
    want = model(x)
    q = llmk.nn.replace_linear_with_quantized(copy.deepcopy(model), bits=bits, group_size=128)
    assert isinstance(q[0], llmk.nn.QuantizedLinear) and q[0].scales.shape == (40, 3)
    w = model[0].weight
    # Symmetric rounding to the group's step: each weight within half a step of its original.
    step = q[0].scales.repeat_interleave(128, dim=1)[:, :300]
    assert ((q[0].dequantize() - w).abs() <= step / 2 + 1e-7).all()
    assert q[0].qweight.abs().max() <= 2 ** (bits - 1) - 1
    L.reset_stats()
    got = q(x)
    rel = (got - want).norm() / want.norm()
    assert rel < (0.01 if bits == 8 else 0.2), rel
    rows = [s for s in L.stats() if s["op"] == "QuantizedLinear"]
    # 300 and 40 inputs are not whole blocks of 32: the reference path, with the reason
    # (tests/python/test_quantized_linear.py has the block kernels).
    assert len(rows) == 2, rows
    for row in rows:
        assert row["kernel"] == "reference" and row["calls"] == 1, row
        assert "not both multiples of 32" in row["reason"], row
    with pytest.raises(ValueError, match="bits = 3"):
        llmk.nn.QuantizedLinear(8, 8, bits=3)
