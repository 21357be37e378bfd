"""The backward pass: every parameter's and every activation's gradient, checked two ways.

1. Central finite differences, float64, on random tiny models (every activation function, with
   and without b_U, tied and untied embeddings) against ⟨∂L/∂θ, u⟩: element by element on one
   model; along a random direction u per parameter and per hook point (through a hook that adds
   h·u) on hypothesis-drawn ones. Tolerance 1e-7 relative (the issue's bound). The difference
   quotient D(h) = (L(θ + h·u) − L(θ − h·u)) / 2h is itself off by h²/6·|L‴| (truncation) and
   ~ε·|L|/h (rounding). Truncation is not always small: a LayerNorm of width 1 normalises
   c/√(c² + ε), curved on the scale √ε ≈ 3e-3, so D(1e-5) is off by ~1e-5 there. So the tests
   use Richardson's extrapolation (4·D(h/2) − D(h))/3, whose truncation is O(h⁴): ≤ 1e-10 even
   there, with rounding ~1e-10 at h = 1e-5. Measured ≤ 3e-9.
   On hypothesis-drawn models that O(h⁴) is not always small either: a LayerNorm of width 2
   normalises ±δ/√(δ² + 4ε), δ = x₁ − x₂, which is curved on the scale √ε wherever |δ| ≲ √ε —
   and with one degree of freedom a random δ lands there often (d_model = 2, silu, ε = 1e-5:
   σ = 3.4e-3 ≈ √ε, extrapolation error 2.6e-7). So the random-direction test also measures the
   extrapolation's own error: with R(h) = c·h⁴ + O(h⁶), R(h) − R(h/2) = (15/16)·c·h⁴, so
   |R(h) − R(h/2)| bounds R(h/2)'s error by a factor ~15 to spare; the test compares against
   R(h/2) and allows FD_TOL plus that bound (≤ 1e-10 on well-conditioned models, so the bound is
   as strict as before there; 2.5e-7 with R(h/2) off by 1.4e-8 in the example above).
2. torch autograd on HF's GPT2LMHeadModel holding the same weights, float64: every parameter's
   gradient, and the gradient of each block's input (HF's hidden_states), ≤ 1e-10 relative. The
   two are different float64 programs for the same function, so they differ by rounding only
   (measured ≤ 2e-14).

The equations the backward pass implements are in docs/backward.md; the op-level tests at the end
check them one by one.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from random_models import configs, hf_tensors, random_params, rel_err
from refgpt import Config, Model, RefGPTError
from refgpt.gpt2.activations import ACTIVATIONS, BACKWARDS
from refgpt.gpt2.attention import attention, attention_backward
from refgpt.backward import loss_and_grads
from refgpt.gpt2.layernorm import layer_norm, layer_norm_backward
from refgpt.gpt2.loss import IGNORE_INDEX, next_token_targets, softmax_cross_entropy

FD_TOL = 1e-7  # the bound; measured ≤ 3e-9 (see the module docstring)
TORCH_TOL = 1e-10  # the bound; measured ≤ 2e-14
H = 1e-5


def build(cfg: Config, seed: int, scale: float = 0.5, b_U: bool = False) -> Model:
    """A random model; tied configs get W_U as a view of W_Eᵀ (as HF checkpoints load)."""
    params = random_params(cfg, seed, scale)
    if cfg.tie_word_embeddings:
        params["unembed.W_U"] = params["embed.W_E"].T
    if b_U:
        params["unembed.b_U"] = scale * np.random.default_rng(seed + 1).standard_normal(cfg.d_vocab)
    return Model(cfg, params)


def loss_of(model: Model, tokens, targets, fwd_hooks=()) -> float:
    return softmax_cross_entropy(model.run_with_hooks(tokens, fwd_hooks=fwd_hooks), targets)[0]


def richardson(f) -> float:
    """f′(0) from central differences at h and h/2, extrapolated: (4·D(h/2) − D(h))/3."""
    d = [(f(h) - f(-h)) / (2 * h) for h in (H, H / 2)]
    return (4 * d[1] - d[0]) / 3


def richardson_with_error(f) -> tuple[float, float]:
    """(R(h/2), |R(h) − R(h/2)|): the extrapolation at h/2 and a bound on its truncation error
    (see the module docstring)."""
    d = [(f(h) - f(-h)) / (2 * h) for h in (H, H / 2, H / 4)]
    coarse, fine = (4 * d[1] - d[0]) / 3, (4 * d[2] - d[1]) / 3
    return fine, abs(coarse - fine)


def fd_param(model, name, direction, tokens, targets, untie=True, extrapolate=richardson) -> float:
    """Derivative of the loss along ``direction`` in params[name], by differences. ``untie``:
    perturb W_E alone (its embedding use), as grads.params["embed.W_E"] is defined."""
    def at(t):
        params = dict(model.params)
        params[name] = params[name] + t * direction
        if not untie and name == "embed.W_E" and model.cfg.tie_word_embeddings:
            params["unembed.W_U"] = params["embed.W_E"].T
        return loss_of(Model(model.cfg, params), tokens, targets)
    return extrapolate(at)


def fd_activation(model, name, direction, tokens, targets, extrapolate=richardson) -> float:
    """Derivative of the loss along ``direction`` added at hook point ``name``, by differences."""
    return extrapolate(lambda t: loss_of(model, tokens, targets, [(name, lambda a, _: a + t * direction)]))


def directional_error(exact, numeric) -> float:
    return abs(exact - numeric) / max(1.0, abs(numeric))


# ---- 1. finite differences ----------------------------------------------------------------------


def test_every_gradient_entry_matches_central_differences():
    """Element by element, every parameter and every activation of one tiny tied model with b_U."""
    cfg = Config(d_model=4, n_layers=2, n_heads=2, d_mlp=6, d_vocab=5, n_ctx=4, eps=1e-3,
                 scale_attn_by_inverse_layer_idx=True)
    model = build(cfg, seed=3, b_U=True)
    tokens = np.array([[1, 4, 0, 4], [2, 2, 3, 1]])  # [batch, pos]
    targets = next_token_targets(tokens)
    grads = loss_and_grads(model, tokens)
    assert grads.tied
    for name, value in model.params.items():
        numeric = np.zeros(value.shape)
        for idx in np.ndindex(value.shape):
            e = np.zeros(value.shape)
            e[idx] = 1.0
            numeric[idx] = fd_param(model, name, e, tokens, targets)
        assert rel_err(grads.params[name], numeric) <= FD_TOL, name
    _, cache = model.run_with_cache(tokens)
    for name in model.hook_names:
        shape = cache[name].shape
        numeric = np.zeros(shape)
        for idx in np.ndindex(shape):
            e = np.zeros(shape)
            e[idx] = 1.0
            numeric[idx] = fd_activation(model, name, e, tokens, targets)
        assert rel_err(grads.activations[name], numeric) <= FD_TOL, name


# 27 examples: each takes 6 losses per direction instead of 4 (the error bound), so the time 40 took before
@settings(max_examples=27, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(max_layers=2, max_width=12), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([0.1, 0.5, 1.0]), b_U=st.booleans(), data=st.data())
def test_gradients_match_central_differences_along_random_directions(cfg, seed, scale, b_U, data):
    """For every parameter and every hook point: ⟨gradient, u⟩ = the loss's central difference
    along a random u, on random tiny models of every activation function, tied or not, with or
    without b_U, with next-token or explicit (partly ignored) targets."""
    model = build(cfg, seed, scale, b_U)
    rng = np.random.default_rng(seed)
    pos = data.draw(st.integers(2, max(2, cfg.n_ctx)), label="pos") if cfg.n_ctx >= 2 else 1
    tokens = rng.integers(0, cfg.d_vocab, size=(data.draw(st.integers(1, 2), label="batch"), pos))
    if pos >= 2 and data.draw(st.booleans(), label="next-token targets"):
        targets = None
    else:
        targets = rng.integers(0, cfg.d_vocab, size=tokens.shape)
        targets[rng.random(tokens.shape) < 0.3] = IGNORE_INDEX
        targets.flat[0] = 0  # at least one target
    grads = loss_and_grads(model, tokens, targets)
    used = grads.targets
    worst = {}

    def excess(exact, numeric_and_error):  # > 0: off by more than FD_TOL + the differences' own error
        numeric, error = numeric_and_error
        return directional_error(exact, numeric) - FD_TOL - error / max(1.0, abs(numeric))

    for name, value in model.params.items():
        u = rng.standard_normal(value.shape)
        worst[name] = excess(float((grads.params[name] * u).sum()),
                             fd_param(model, name, u, tokens, used, extrapolate=richardson_with_error))
    _, cache = model.run_with_cache(tokens)
    for name in model.hook_names:
        u = rng.standard_normal(cache[name].shape)
        worst[name] = excess(float((grads.activations[name] * u).sum()),
                             fd_activation(model, name, u, tokens, used, extrapolate=richardson_with_error))
    bad = {k: v for k, v in worst.items() if not v <= 0}
    assert not bad, f"{cfg}: {bad}"


def test_tied_gradient_is_the_sum_of_both_uses():
    """Perturbing the one shared matrix (W_E and W_U = W_Eᵀ together) moves the loss by
    ⟨tied_W_E, u⟩, and that differs from either use's gradient alone."""
    cfg = Config(d_model=6, n_layers=1, n_heads=2, d_mlp=8, d_vocab=7, n_ctx=5)
    model = build(cfg, seed=11)
    tokens = np.array([[1, 2, 3, 4, 5], [6, 0, 6, 1, 1]])
    grads = loss_and_grads(model, tokens)
    u = np.random.default_rng(0).standard_normal(model.W_E.shape)
    numeric = fd_param(model, "embed.W_E", u, tokens, grads.targets, untie=False)
    assert directional_error(float((grads.tied_W_E * u).sum()), numeric) <= FD_TOL
    assert directional_error(float((grads.params["embed.W_E"] * u).sum()), numeric) > 1e-3


def test_untied_model_is_not_reported_tied():
    cfg = Config(d_model=4, n_layers=1, n_heads=1, d_mlp=4, d_vocab=5, n_ctx=3, tie_word_embeddings=False)
    assert not loss_and_grads(build(cfg, 0), [[1, 2, 3]]).tied
    tied_cfg = Config(d_model=4, n_layers=1, n_heads=1, d_mlp=4, d_vocab=5, n_ctx=3)
    separate = Model(tied_cfg, random_params(tied_cfg, 0))  # says tied, but W_U is its own array
    assert not loss_and_grads(separate, [[1, 2, 3]]).tied


def test_loss_is_the_mean_over_targeted_positions_and_ignored_positions_get_no_gradient():
    cfg = Config(d_model=4, n_layers=1, n_heads=2, d_mlp=4, d_vocab=6, n_ctx=4)
    model = build(cfg, 2)
    tokens = np.array([[1, 2, 3, 4]])
    logits = model(tokens)  # [1, 4, 6]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    grads = loss_and_grads(model, tokens)
    assert grads.loss == pytest.approx(-np.mean([logp[0, i, tokens[0, i + 1]] for i in range(3)]), rel=1e-15)
    assert np.all(grads.logits[0, -1] == 0)  # HF's shift: the last position has no target
    targets = np.array([[IGNORE_INDEX, 5, IGNORE_INDEX, 0]])
    g = loss_and_grads(model, tokens, targets)
    assert g.loss == pytest.approx(-(logp[0, 1, 5] + logp[0, 3, 0]) / 2, rel=1e-15)
    assert np.all(g.logits[0, [0, 2]] == 0)


def test_float32_gradients_stay_float32_and_agree_with_float64():
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=11, n_ctx=6)
    params = random_params(cfg, 5)
    tokens = np.random.default_rng(0).integers(0, 11, size=(2, 6))
    g64 = loss_and_grads(Model(cfg, params), tokens)
    g32 = loss_and_grads(Model(cfg, params, dtype="float32"), tokens)
    for name in params:
        assert g32.params[name].dtype == np.float32, name
        assert rel_err(g32.params[name], g64.params[name]) <= 1e-5, name  # measured ≤ 1.1e-6 over 10 seeds
    assert all(a.dtype == np.float32 for a in g32.activations.values())


def test_gradients_repr_is_a_few_lines_not_every_number():
    """Issue 37: print(model.loss_and_grads(t)) printed every array (5,150 lines for the embedded
    model); it is a summary: the loss, how many gradients of what, the shapes, the dtype."""
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=11, n_ctx=6)
    g = loss_and_grads(build(cfg, 3), [[1, 2, 3, 4, 5, 6]])
    text = repr(g)
    assert len(text.splitlines()) <= 5 and len(text) < 600, text
    assert f"loss={g.loss:.9g}" in text and "dtype=float64" in text
    assert f"params: {len(g.params)} " in text and f"activations: {len(g.activations)} " in text
    assert "embed.W_E" in text and "logits: [1, 6, 11]" in text and "(5 used)" in text
    assert str(g) == text


def test_bad_targets_name_the_fault():
    cfg = Config(d_model=4, n_layers=1, n_heads=1, d_mlp=4, d_vocab=5, n_ctx=3)
    model = build(cfg, 0)
    with pytest.raises(RefGPTError, match="at least 2 tokens"):
        loss_and_grads(model, [[1]])
    assert loss_and_grads(model, [[1, 2]]).targets.tolist() == [[2, IGNORE_INDEX]]  # 2 tokens are enough
    with pytest.raises(RefGPTError, match="outside the vocabulary"):
        loss_and_grads(model, [[1, 2]], [[5, 0]])
    with pytest.raises(RefGPTError, match="shape"):
        loss_and_grads(model, [[1, 2]], [[1, 2, 3]])
    with pytest.raises(RefGPTError, match="ignored"):
        loss_and_grads(model, [[1, 2]], [[IGNORE_INDEX, IGNORE_INDEX]])


# ---- the equations of docs/backward.md, op by op --------------------------------------------------


def _fd_op(f, x, u):
    return (f(x + H * u) - f(x - H * u)) / (2 * H)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_activation_derivatives_match_central_differences(act):
    """docs/backward.md §4: f′ of every activation, on a grid through its curved part."""
    x = np.linspace(-6.0, 6.0, 2401) + 1e-3  # [n], avoids relu's kink at 0 exactly
    one = np.ones_like(x)
    numeric = _fd_op(ACTIVATIONS[act], x, one)
    assert rel_err(BACKWARDS[act](x, one), numeric) <= FD_TOL
    assert set(BACKWARDS) == set(ACTIVATIONS)


def test_layer_norm_backward_is_the_textbook_formula_and_matches_differences():
    """docs/backward.md §2: ∂x = (ĝ − mean ĝ − x̂·mean(ĝ ⊙ x̂))/σ, and every returned gradient
    (x, w, b, and the mean, scale and normalized hook points) matches central differences."""
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 3, 7)), 1 + rng.standard_normal(7), rng.standard_normal(7)
    grad = rng.standard_normal((2, 3, 7))
    cache = {}

    def keep(name, a):
        cache[name] = a
        return a

    layer_norm(x, w, b, 1e-3, keep)
    g = layer_norm_backward(grad, cache["hook_normalized"], cache["hook_scale"], w)
    hat, sigma, gh = cache["hook_normalized"], cache["hook_scale"], grad * w
    textbook = (gh - gh.mean(-1, keepdims=True) - hat * (gh * hat).mean(-1, keepdims=True)) / sigma
    assert rel_err(g["x"], textbook) <= 1e-14
    assert np.allclose(g["x"].sum(-1), 0, atol=1e-14)  # ∂x ⊥ 1: LayerNorm ignores a constant shift
    cache0 = {}
    layer_norm(x, w, b, 0.0, lambda n, a: cache0.setdefault(n, a))
    g0 = layer_norm_backward(grad, cache0["hook_normalized"], cache0["hook_scale"], w)
    assert np.allclose((g0["x"] * cache0["hook_normalized"]).sum(-1), 0, atol=1e-14)  # ε = 0: ∂x ⊥ x̂
    loss = lambda **kw: float((layer_norm(kw.get("x", x), kw.get("w", w), kw.get("b", b), 1e-3) * grad).sum())
    for name, value in (("x", x), ("w", w), ("b", b)):
        u = rng.standard_normal(value.shape)
        numeric = (loss(**{name: value + H * u}) - loss(**{name: value - H * u})) / (2 * H)
        assert directional_error(float((g[name] * u).sum()), numeric) <= FD_TOL, name
    for hook in ("hook_mean", "hook_scale", "hook_normalized"):
        u = rng.standard_normal(cache[hook].shape)
        at = lambda s: float((layer_norm(x, w, b, 1e-3, lambda n, a: a + s * H * u if n == hook else a) * grad).sum())
        assert directional_error(float((g[hook] * u).sum()), (at(1) - at(-1)) / (2 * H)) <= FD_TOL, hook


def test_attention_backward_matches_differences_and_masked_scores_get_zero():
    """docs/backward.md §3: the softmax backward, the causal mask (zero gradient on masked
    scores) and the projections."""
    rng = np.random.default_rng(1)
    n_heads, d_head, d = 2, 3, 6
    x = rng.standard_normal((2, 4, d))
    w = {f"W_{k}": rng.standard_normal((d, n_heads * d_head)) for k in "QKV"}
    w.update({f"b_{k}": rng.standard_normal(n_heads * d_head) for k in "QKV"})
    w.update(W_O=rng.standard_normal((n_heads * d_head, d)), b_O=rng.standard_normal(d))
    grad = rng.standard_normal((2, 4, d))
    cache = {}

    class Point:
        def __call__(self, name, a):
            cache[name] = a
            return a

        def watched(self, name):
            return True

        def hooked(self, name):
            return False

    attention(x, w, n_heads, 0.5, Point())
    g = attention_backward(grad, x, w, cache["hook_q"], cache["hook_k"], cache["hook_v"],
                           cache["hook_pattern"], cache["hook_z"], 0.5)
    masked = np.triu(np.ones((4, 4), bool), k=1)
    assert np.all(g["hook_attn_scores"][..., masked] == 0)
    assert np.allclose(g["hook_attn_scores"].sum(-1), 0, atol=1e-14)  # softmax: rows of ∂s sum to 0
    assert np.all(g["hook_pattern"][..., masked] != 0)  # ∂p is not 0 there: a hook could move z

    class Silent:
        def __call__(self, name, a):
            return a

        def watched(self, name):
            return False

    def loss(xx=x, **kw):
        return float((attention(xx, {**w, **kw}, n_heads, 0.5, Silent()) * grad).sum())

    u = rng.standard_normal(x.shape)
    assert directional_error(float((g["x"] * u).sum()), (loss(x + H * u) - loss(x - H * u)) / (2 * H)) <= FD_TOL
    for name in w:
        u = rng.standard_normal(w[name].shape)
        numeric = (loss(**{name: w[name] + H * u}) - loss(**{name: w[name] - H * u})) / (2 * H)
        assert directional_error(float((g[name] * u).sum()), numeric) <= FD_TOL, name


def test_softmax_cross_entropy_gradient_is_softmax_minus_onehot_over_count():
    """docs/backward.md §5: ∂loss/∂logits = (softmax − onehot)/count, and the loss is stable for
    logits far beyond exp's range."""
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((2, 3, 5))
    targets = np.array([[0, 4, IGNORE_INDEX], [2, 2, 1]])
    loss, grad = softmax_cross_entropy(logits.copy(), targets)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = np.zeros_like(p)
    for b, t in zip(*np.nonzero(targets != IGNORE_INDEX)):
        expected[b, t] = p[b, t]
        expected[b, t, targets[b, t]] -= 1
    assert rel_err(grad, expected / 5) <= 1e-15
    u = rng.standard_normal(logits.shape)
    numeric = (softmax_cross_entropy(logits + H * u, targets)[0] - softmax_cross_entropy(logits - H * u, targets)[0]) / (2 * H)
    assert directional_error(float((grad * u).sum()), numeric) <= FD_TOL
    big, _ = softmax_cross_entropy(np.array([[[1000.0, 0.0]]]), np.array([[1]]))
    assert big == 1000.0 and math.isfinite(big)


# ---- 2. torch autograd on HF's GPT-2 ------------------------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(max_layers=3, max_width=16, act_fns=["gelu_new", "gelu", "gelu_fast", "quick_gelu", "relu", "silu"]),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_gradients_match_torch_autograd_on_hf_gpt2(cfg, seed, data):
    """Every parameter's gradient (HF layout; a tied wte's is grads.tied_W_E) and each block
    input's gradient (HF's hidden_states) against torch autograd on GPT2LMHeadModel, float64."""
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    transformers = pytest.importorskip("transformers", reason="peer test: needs transformers (the 'peers' extra)")
    torch.set_num_threads(1)
    if cfg.n_ctx < 2:
        cfg = Config(**{**cfg.__dict__, "n_ctx": 2})
    model = build(cfg, seed)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.d_vocab, size=(data.draw(st.integers(1, 3), label="batch"),
                                                data.draw(st.integers(2, cfg.n_ctx), label="pos")))
    explicit = data.draw(st.booleans(), label="explicit targets")
    targets = None
    if explicit:
        targets = rng.integers(0, cfg.d_vocab, size=tokens.shape)
        targets[rng.random(tokens.shape) < 0.3] = IGNORE_INDEX
        targets.flat[-1] = 1
    grads = loss_and_grads(model, tokens, targets)

    hf_cfg = transformers.GPT2Config(**cfg.to_hf(), bos_token_id=cfg.d_vocab - 1, eos_token_id=cfg.d_vocab - 1)
    hf_cfg._attn_implementation = "eager"
    hf = transformers.GPT2LMHeadModel(hf_cfg).double().eval()
    state = {k: torch.from_numpy(np.array(v, np.float64)) for k, v in hf_tensors(model).items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing)
    ids = torch.from_numpy(tokens)
    out = hf(ids, output_hidden_states=True)
    for h in out.hidden_states:
        h.retain_grad()
    used = torch.from_numpy(grads.targets)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, cfg.d_vocab), used.reshape(-1), ignore_index=IGNORE_INDEX)
    loss.backward()
    assert abs(grads.loss - loss.item()) <= TORCH_TOL * max(1.0, abs(loss.item()))

    mine = {k: v for k, v in hf_tensors(SimpleNamespace(cfg=cfg, params=grads.params)).items()}
    if cfg.tie_word_embeddings:
        mine["transformer.wte.weight"] = grads.tied_W_E
    errors = {name: rel_err(mine[name], p.grad.numpy()) for name, p in hf.named_parameters()
              if name != "lm_head.weight" or not cfg.tie_word_embeddings}
    for L in range(cfg.n_layers):
        errors[f"blocks.{L}.hook_resid_pre"] = rel_err(grads.activations[f"blocks.{L}.hook_resid_pre"],
                                                       out.hidden_states[L].grad.numpy())
    bad = {k: v for k, v in errors.items() if not v <= TORCH_TOL}
    assert not bad, f"{cfg}: {bad}"


# ---- llm.c's debug state carries the gradients -----------------------------------------------------


def test_llmc_debug_state_holds_every_gradient_in_llmc_order_and_layout(tmp_path):
    """After x, y, logits and loss: the 16 parameter gradients in llm.c's order, nn.Linear [out, in]
    layout, the tied wte's gradient (both uses) padded with zero rows to Vp, as float32."""
    from refgpt.oracle import llmc

    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=6)
    model = build(cfg, seed=4)
    tokens = np.random.default_rng(4).integers(0, 20, size=(2, 6))
    path = llmc.write_debug_state(tmp_path / "state.bin", model, tokens)
    state = llmc.read_debug_state(path, cfg.d_vocab, cfg)
    Vp = llmc.padded_vocab(cfg.d_vocab)
    shapes = llmc.parameter_shapes(cfg.n_ctx, Vp, cfg.n_layers, cfg.d_model)
    assert state.grads.size == sum(int(np.prod(s)) for s in shapes.values())
    flat, offset = {}, 0
    for name, shape in shapes.items():
        flat[name] = state.grads[offset: offset + int(np.prod(shape))].reshape(shape)
        offset += int(np.prod(shape))
    g = loss_and_grads(model, tokens[:, :-1], tokens[:, 1:])
    assert state.loss == np.float32(g.loss)
    C = cfg.d_model
    expected = {
        "wte": np.concatenate([g.tied_W_E, np.zeros((Vp - cfg.d_vocab, C))]),
        "wpe": g.params["pos_embed.W_pos"],
        "qkvw": np.stack([np.concatenate([g.params[f"blocks.{L}.attn.W_{x}"].transpose(1, 0, 2).reshape(C, C).T
                                          for x in "QKV"]) for L in range(cfg.n_layers)]),
        "attprojw": np.stack([g.params[f"blocks.{L}.attn.W_O"].reshape(C, C).T for L in range(cfg.n_layers)]),
        "fcw": np.stack([g.params[f"blocks.{L}.mlp.W_in"].T for L in range(cfg.n_layers)]),
        "fcprojb": np.stack([g.params[f"blocks.{L}.mlp.b_out"] for L in range(cfg.n_layers)]),
        "lnfw": g.params["ln_final.w"],
    }
    for name, value in expected.items():
        assert np.array_equal(flat[name], value.astype(np.float32)), name


# ---- 7. from any metric: backward_from ------------------------------------------------------------


def test_backward_from_any_metric_matches_central_differences():
    """metric = ⟨G, logits⟩ + ⟨A, resid_mid₁⟩ + ⟨S, ln2 scale₀⟩ (a metric of the logits and of two
    activations it reads directly): backward_from(G) with A and S arriving at their hook points is
    ∂metric/∂ every parameter, checked along random directions by central differences; with
    G = ∂loss/∂logits and nothing arriving it is loss_and_grads, bit for bit."""
    from refgpt.backward import backward_from
    from refgpt.tl.hooks import GradientRun

    cfg = Config(d_model=12, n_layers=2, n_heads=3, d_mlp=20, d_vocab=17, n_ctx=9)
    model = build(cfg, seed=4)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, cfg.d_vocab, (2, 7))
    G = rng.standard_normal((2, 7, cfg.d_vocab))
    A = rng.standard_normal((2, 7, cfg.d_model))
    S = rng.standard_normal((2, 7, 1))
    reads = ("blocks.1.hook_resid_mid", "blocks.0.ln2.hook_scale")

    def metric(m, fwd_hooks=()):
        logits, cache = m.run_with_cache(tokens, names=list(reads), fwd_hooks=fwd_hooks)
        return float((G * logits).sum() + (A * cache[reads[0]]).sum() + (S * cache[reads[1]]).sum())

    _, cache = model.run_with_cache(tokens)
    grads = backward_from(model, tokens, cache, G, GradientRun(model.hook_dict, {reads[0]: A, reads[1]: S}))
    assert grads.loss is None and grads.targets is None
    for name in ("blocks.0.attn.W_Q", "blocks.0.ln1.w", "blocks.1.mlp.W_in", "embed.W_E", "pos_embed.W_pos"):
        u = rng.standard_normal(model.params[name].shape)

        def at(t, name=name, u=u):
            params = dict(model.params)
            params[name] = params[name] + t * u
            if name == "embed.W_E":
                params["unembed.W_U"] = model.params["unembed.W_U"]  # the embedding's use alone
            return metric(Model(model.cfg, params))
        assert directional_error(float((grads.params[name] * u).sum()), richardson(at)) <= 1e-7, name
    u = rng.standard_normal((2, 7, cfg.d_model))
    numeric = richardson(lambda t: metric(model, [("blocks.0.hook_resid_pre", lambda a, _: a + t * u)]))
    assert directional_error(float((grads.activations["blocks.0.hook_resid_pre"] * u).sum()), numeric) <= 1e-7
    loss = loss_and_grads(model, tokens)
    again = backward_from(model, tokens, cache, loss.logits)
    assert all(np.array_equal(again.params[n], loss.params[n]) for n in loss.params)
