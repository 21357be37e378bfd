"""Every fast path of refgpt against the reference, refgpt/reference/gpt2.py: exactly, in
float64, op by op, to a bound derived from float64's rounding (refgpt/reference/bounds.py
derives them).

The paths: the cached forward (run_with_cache; ``model()`` is it bit for bit, test_forward_paths.py),
both blocked attention paths (attend_in_blocks, and attend with the scores or pattern watched or
edited by a hook), gelu_new's blocked in-place steps, the fused QKV view of an HF checkpoint,
KV-cached decoding, left and right padding, the streamed golden file, the blocked compare and the
analytic backward; GPT-2 with gelu_new and relu, scores scaled by 1/(layer + 1), an unembed.b_U,
lengths 1, 63, 64, 65, 129 across the 64-row blocks, batch 1 and 2, and hypothesis-drawn shapes.

The bounds, derived (§1–§11), and the walks that apply them op by op are the reference room's:
refgpt/reference/bounds.py.

Not vacuous: a planted bug of about 1e-9 — a key dropped past a block, the score scale off by
1e-9, one fused-QKV weight off by 1e-9 relative, LayerNorm's ε off by 1e-6 relative, √(2/π) off by
1e-12 in the in-place gelu, ∂q's scale off by 1e-9, a cached key off by 1e-9 — fails its op's
bound (test_*_fails_the_bound).

Measured (REFGPT_PLAIN_RATIOS=1 prints max |path − plain| / bound per op; the hypothesis shapes,
with few terms per sum, give the larger numbers). Where both sides read the same input the worst
case is used up to 0.7 at most: q, k, v 0.11 to 0.43, mlp pre 0.05, logits 0.06, log_probs 0.06,
loss 0.03, ∂logits 0.37 to 0.43, the in-place gelu_new 0.12 and its backward 0.41, LayerNorm's
backward 0.41 to 0.69 (0.69 at d_model = 2: few terms, all cancelling); line by line on the path's
inputs (a probe, not kept) scores 0.47, z 0.50, ∂v 0.33, ∂W_Q 0.25. LayerNorm's forward and relu
come out bit for bit. Ratios near 1 (pattern, z, the backward's chained lines) are lines that read
their own function's earlier value: the measured difference passes through almost unchanged
(query 0's z is 1·v, so Δz = Δv), which the propagation term states exactly.

Fresh seeds, not only CI's fixed draws: test_random_shapes_are_plain_op_by_op with
``--hypothesis-seed`` 1–8 and 100–140 (49 runs, 30 models each) passes every bound since
LayerNorm's backward bound took in the two formulas' difference on a computed x̂ (bounds.py §9;
seed 5 had failed it at 1.63×). The worst ratio over those runs: q, k, v 0.58, LayerNorm's backward
0.70, gelu_new 0.15 and its backward 0.44, ∂logits 0.38, loss 0.05; the chained lines up to 1.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import refgpt
from random_models import model_and_tokens, random_model, random_params, save_checkpoint
from refgpt import Config, Model
from refgpt.gpt2 import activations, attention
from refgpt.reference import bounds as pb, gpt2
from refgpt.gpt2.attention import attend, attend_in_blocks
from refgpt.oracle import comparison, golden
from whole_compare import whole_compare_tensor, whole_logits_summary
import reference_walks as walks

CFG = Config(d_model=24, n_layers=2, n_heads=4, d_mlp=40, d_vocab=50, n_ctx=160, eps=1e-3)  # d_head 6: s = 1/√6
CONFIGS = {
    "gelu_new": CFG,
    "relu, scores / (layer + 1)": dataclasses.replace(CFG, act_fn="relu", scale_attn_by_inverse_layer_idx=True),
    "unembed.b_U": CFG,
}
LENGTHS = (1, 63, 64, 65, 129)  # across the 64-row blocks of attention and gelu_new
MEASURED = pb.Ledger()  # every comparison of this module, for the report


@pytest.fixture(scope="module", autouse=True)
def report_ratios():
    yield
    if os.environ.get("REFGPT_PLAIN_RATIOS"):
        print("\nmax |path − plain| / bound, and max |path − plain|, per op:")
        for op in sorted(MEASURED.ratio):
            print(f"  {op:28s} {MEASURED.ratio[op]:8.3g} {MEASURED.largest[op]:10.3g}")


@functools.lru_cache(maxsize=None)
def model_of(name) -> Model:
    cfg = CONFIGS[name]
    params = random_params(cfg, seed=3, scale=0.8)
    if name == "unembed.b_U":
        params["unembed.b_U"] = np.random.default_rng(1).standard_normal(cfg.d_vocab)
    return Model(cfg, params)


def tokens_of(model, pos, batch, seed=0):
    return np.random.default_rng(seed + 1000 * pos).integers(0, model.cfg.d_vocab, (batch, pos))


def check_cached_pass(model, tokens, logits, cache, **kwargs):
    return MEASURED.merge_from(walks.check_cached_pass(model, tokens, logits, cache, **kwargs))


def check_gradients(model, tokens):
    return MEASURED.merge_from(walks.check_gradients(model, tokens))


# ---- the walk, the constants and the library it assumes ------------------------------------------


def test_plain_names_every_activation_as_the_cache_does():
    model = model_of("gelu_new")
    tokens = tokens_of(model, 70, 1)[0]
    _, acts = gpt2.forward(model.params, CFG, tokens)
    _, cache = model.run_with_cache(tokens)
    assert set(acts) == set(cache)
    assert all(cache[name].shape[1:] == a.shape for name, a in acts.items())


@pytest.mark.parametrize("name", CONFIGS)
def test_the_walk_handed_plains_own_values_finds_every_difference_exactly_zero(name):
    """The checks' wiring is gpt2.forward's and gpt2.backward's: on plain's own activations and
    gradients every op, fed what plain fed it, returns what plain returned, bit for bit."""
    model = model_of(name)
    tokens = tokens_of(model, 70, 1)[0]
    logits, acts = gpt2.forward(model.params, model.cfg, tokens)
    loss, grads = gpt2.backward(model.params, model.cfg, tokens, acts, logits)
    led = pb.Ledger()
    pb.check_forward(led, model.params, model.cfg, tokens, acts, logits)
    sums, walked_loss, _ = pb.check_backward(led, model.params, model.cfg, [(tokens, acts, logits, grads)])
    sums.check(led, pb.backward_op, grads)
    assert walked_loss == loss
    assert set(sums.value) == {n for n in grads if n in model.params}  # every parameter's gradient walked
    assert led.largest and not any(led.largest.values()), {op: d for op, d in led.largest.items() if d}


def test_libm_is_within_the_4_ulps_assumed():
    """LIBM (§1): np.exp, np.tanh, np.log and x**3 (np.power) against the same functions in long
    double (64-bit significand: its own error is ~2⁻¹¹ of a float64 ulp), on the ranges the model
    feeds them; the measured worst is ≤ 1.2 ulps, the bounds assume 4."""
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("no 80-bit long double to measure against")
    rng = np.random.default_rng(0)
    cases = {np.exp: np.concatenate([-rng.exponential(5, 20000), rng.uniform(-700, 0, 5000)]),
             np.tanh: np.concatenate([rng.standard_normal(20000) * 3, rng.uniform(-20, 20, 5000),
                                      rng.standard_normal(5000) * 1e-4]),
             np.log: np.concatenate([rng.uniform(1e-300, 1, 10000), rng.exponential(10, 10000)]),
             (lambda x: x ** 3): rng.standard_normal(20000) * 10}
    for f, x in cases.items():
        got, exact = f(x), f(x.astype(np.longdouble))
        ulps = np.abs(got - exact) / np.spacing(np.abs(exact.astype(np.float64)))
        assert ulps.max() <= 4, (f, float(ulps.max()))


def test_gelu_constants_and_lipschitz_constant():
    """§7: plain's √(2/π), activations.py's and the bounds' are one float; sup|gelu_new′| < 1.13
    (on a grid of step 1e-5, with |gelu_new″| ≤ 0.8 between the points; beyond ±12, f′ ∈ [0, 1])."""
    assert np.sqrt(2 / np.pi) == activations._SQRT_2_OVER_PI == pb.SQRT_2_OVER_PI
    x = np.linspace(-12, 12, 2_400_001)
    derivative = gpt2.gelu_new_backward(x, np.ones_like(x))
    assert np.abs(derivative).max() + 0.8 * 1e-5 < pb.GELU_LIPSCHITZ
    assert np.abs(np.diff(derivative) / np.diff(x)).max() < 0.8


# ---- the forward paths -------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("pos", LENGTHS)
@pytest.mark.parametrize("name", CONFIGS)
def test_the_cached_forward_and_the_backward_are_plain_op_by_op(name, pos, batch):
    """run_with_cache (model() is its logits bit for bit) and loss_and_grads, every row."""
    model = model_of(name)
    tokens = tokens_of(model, pos, batch)
    logits, cache = model.run_with_cache(tokens)
    check_cached_pass(model, tokens, logits, cache.cache_dict)
    if pos > 1:
        check_gradients(model, tokens)


class Watching:
    """attend's run_hooks: watches (records) the named points, hooks none."""

    def __init__(self, *names):
        self.names, self.seen = names, {}

    def __call__(self, name, a):
        self.seen[name] = a.copy()
        return a

    def watched(self, name):
        return name in self.names

    def hooked(self, name):
        return False


def check_attention_core(model, tokens, start, rows, layer=1):
    """attend_in_blocks and attend on the path's q, k, v of queries start … (keys 0 …) against plain's
    attention of the whole prefix (§5, §6): the blocked z, and attend's scores and pattern."""
    cfg = model.cfg
    _, cache = model.run_with_cache(tokens)
    acts = pb.row(cache.cache_dict, 0)
    b, s = f"blocks.{layer}.", cfg.score_scale(layer)
    x = acts[b + "ln1.hook_normalized"] * model.params[b + "ln1.w"] + model.params[b + "ln1.b"]
    weights = [model.params[b + "attn." + n] for n in gpt2.ATTN_PARAMS]
    _, a = gpt2.attention(x, *weights, s)
    q, k, v = (acts[b + f"attn.hook_{n}"] for n in "qkv")
    dq, dk, dv = (np.abs(acts[b + f"attn.hook_{n}"] - a[f"hook_{n}"]) for n in "qkv")
    heads = (1, 0, 2)  # [pos, head, d_head] ↔ [head, pos, d_head]
    qh, kh, vh = ((q[start:] * s).transpose(heads)[None], k.transpose(heads)[None], v.transpose(heads)[None])
    led = pb.Ledger()
    finite = np.isfinite(a["hook_attn_scores"])
    d_scores = np.where(finite, pb.scores_bound(q, k, a["hook_q"], a["hook_k"], dq, dk, s), 0.0)  # [head, pos, pos]
    p = a["hook_pattern"]
    d_pattern = 2 * pb.softmax_error(p, a["hook_attn_scores"]) + pb.softmax_propagation(p, d_scores)
    z_bound = pb.z_bound(p + d_pattern, v, p, a["hook_v"], d_pattern, dv)[start:]
    z = attend_in_blocks(qh, kh, vh, rows=rows)[0].transpose(heads)  # [query, head, d_head]
    led.compare("z (attend_in_blocks)", b + "attn.hook_z", z, a["hook_z"][start:], z_bound)
    for names in (("hook_attn_scores", "hook_pattern"), ("hook_attn_scores",), ("hook_pattern",)):
        watching = Watching(*names)
        z = attend(qh, kh, vh, watching, rows=rows)[0].transpose(heads)
        led.compare("z (attend)", b + "attn.hook_z", z, a["hook_z"][start:], z_bound)
        if "hook_attn_scores" in names:
            led.compare("scores", b + "attn.hook_attn_scores", watching.seen["hook_attn_scores"][0],
                        a["hook_attn_scores"][:, start:], d_scores[:, start:])
        if "hook_pattern" in names:
            led.compare("pattern", b + "attn.hook_pattern", watching.seen["hook_pattern"][0], p[:, start:],
                        d_pattern[:, start:])
    MEASURED.merge(led)


@pytest.mark.parametrize("start, pos, rows", [(0, 1, 64), (0, 129, 64), (0, 65, 7), (5, 60, 64), (70, 70, 64),
                                              (3, 130, 64), (64, 1, 64)])
def test_both_blocked_attention_paths_are_plain_attention(start, pos, rows):
    """attend_in_blocks (the forward when nobody watches) and attend (the cache, the hooks), by
    blocks of ``rows`` queries, after ``start`` keys held in a KV cache."""
    model = model_of("gelu_new")
    check_attention_core(model, tokens_of(model, start + pos, 1), start, rows)


def test_hooks_editing_the_scores_and_the_pattern_are_honoured_as_plain_would():
    """attend after a hook edited the scores (a future key unmasked, a key masked, a block read
    back over whole rows) or the pattern: plain's softmax of the hooked scores, plain's z of the
    hooked pattern, and everything after them, as plain computes it from those values."""
    model = model_of("gelu_new")
    tokens = tokens_of(model, 140, 2)

    def edit_scores(scores, hook):
        scores[:, 0, 3, 100] = scores[:, 0, 3, 3]  # query 3 sees key 100: its block takes whole rows
        scores[:, 1, 70, 100] = 0.5
        scores[:, :, :128, 5] = -np.inf

    def edit_pattern(pattern, hook):
        return pattern * np.linspace(0.5, 1.5, pattern.shape[-1])  # rows no longer sum to 1

    hooks = [("blocks.0.attn.hook_attn_scores", edit_scores), ("blocks.1.attn.hook_pattern", edit_pattern)]
    logits, cache = model.run_with_cache(tokens, fwd_hooks=hooks)
    check_cached_pass(model, tokens, logits, cache.cache_dict, edited={0: "scores", 1: "pattern"})
    with pytest.raises(AssertionError, match="scores"):  # unedited, the hooked scores are not plain's
        check_cached_pass(model, tokens, logits, cache.cache_dict)


@pytest.mark.parametrize("rows", LENGTHS)
def test_the_in_place_blocked_gelu_new_and_its_backward_are_plains(rows):
    """gelu_new's nine in-place steps, 64 rows at a time, in C and transposed layouts and as
    [batch, pos, d_mlp]; its backward and relu's: plain's on the same input (§7, §8, §2)."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 37)) * 4  # [rows, d_mlp]
    x[:, :3] = [-30.0, 30.0, 1e-8]  # the tails, where 1 + tanh cancels, and near 0
    grad = rng.standard_normal(x.shape)
    led = pb.Ledger()
    expected = gpt2.gelu_new(x)
    for layout in (x, np.asfortranarray(x), x.reshape(1, rows, 37)):
        led.compare("gelu_new (in place)", "gelu_new", activations.gelu_new(layout).reshape(x.shape), expected,
                    2 * pb.gelu_new_error(x))
    led.compare("gelu_new backward", "gelu_new_backward", activations.gelu_new_backward(x, grad),
                gpt2.gelu_new_backward(x, grad), 2 * pb.gelu_new_backward_error(x, grad))
    led.exact("relu", "relu", activations.relu(x), gpt2.relu(x))
    led.exact("relu backward", "relu_backward", activations.relu_backward(x, grad), gpt2.relu_backward(x, grad))
    MEASURED.merge(led)


def test_the_fused_qkv_view_of_an_hf_checkpoint_is_plain_attention(tmp_path):
    """Loaded from HF's layout, q, k, v are one product with a strided view of c_attn
    (block_layout, joined_columns): plain's q, k, v from the TransformerLens W_Q, W_K, W_V."""
    model = refgpt.load(save_checkpoint(model_of("gelu_new"), tmp_path, dtype=np.float64))
    _, w, _ = model.block_weights(0)
    assert not w["W_QKV"].flags.owndata  # the view path, not a copy
    tokens = tokens_of(model, 65, 2)
    logits, cache = model.run_with_cache(tokens)
    check_cached_pass(model, tokens, logits, cache.cache_dict)
    check_gradients(model, tokens)


def assembled(steps, length):
    """The activations of KV-cached steps [batch, new, …] as one pass over all ``length``
    positions: per-position ones joined; scores and pattern [batch, head, new, keys so far] put in
    their rows of the [batch, head, pos, pos] square, the keys a step never saw −∞ and 0 (§2)."""
    out = {}
    for name in steps[0]:
        parts = [s[name] for s in steps]
        if name.endswith(("hook_attn_scores", "hook_pattern")):
            batch, heads = parts[0].shape[:2]
            full = np.full((batch, heads, length, length), -np.inf if name.endswith("scores") else 0.0)
            start = 0
            for part in parts:
                full[:, :, start:start + part.shape[2], :part.shape[3]] = part
                start += part.shape[2]
            out[name] = full
        else:
            out[name] = np.concatenate(parts, axis=1)
    return out


@pytest.mark.parametrize("chunks", [[1, 1, 1, 1, 1], [63, 1, 1, 64], [64, 65], [5, 60, 64, 1]])
def test_kv_cached_decoding_is_plain_on_the_whole_prefix(chunks):
    """Each step's q, k, v, scores against every key so far, pattern, z … are plain's on the whole
    prefix; the forward without a cache (attend_in_blocks after the cache) gives the cached pass's logits."""
    model = model_of("gelu_new")
    tokens = tokens_of(model, sum(chunks), 2)
    watched, plain_past = model.kv_cache(2), model.kv_cache(2)
    steps, logits, start = [], [], 0
    for n in chunks:
        step_logits, cache = model.run_with_cache(tokens[:, start:start + n], past=watched)
        assert np.array_equal(model(tokens[:, start:start + n], past=plain_past), step_logits)
        steps.append(cache.cache_dict)
        logits.append(step_logits)
        start += n
    check_cached_pass(model, tokens, np.concatenate(logits, axis=1), assembled(steps, start))


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batchs_real_positions_are_plain_on_each_row_alone(side):
    """Rows of 129, 65 and 3 real tokens padded to 129: each row's real positions are plain run on
    that row alone (positions from its first real token), and no real query looks at a pad (§2)."""
    model = model_of("unembed.b_U")
    lengths, width = (129, 65, 3), 129
    tokens = tokens_of(model, width, len(lengths))
    mask = np.zeros_like(tokens)
    real = [slice(width - n, width) if side == "left" else slice(0, n) for n in lengths]
    for i, r in enumerate(real):
        mask[i, r] = 1
    logits, cache = model.run_with_cache(tokens, attention_mask=mask)
    led = pb.Ledger()
    for i, r in enumerate(real):
        pb.check_forward(led, model.params, model.cfg, tokens[i, r], pb.row(cache.cache_dict, i, r), logits[i, r])
        pads = np.flatnonzero(mask[i] == 0)
        for L in range(model.cfg.n_layers):
            assert not cache[f"blocks.{L}.attn.hook_pattern"][i][:, r][..., pads].any()
    MEASURED.merge(led)


def plain_log_probs(logits):
    """log softmax of ``logits`` [pos, d_vocab], entry by entry from gpt2.cross_entropy: the loss of
    position i predicting token v is −log p_v."""
    pos, vocab = logits.shape
    out = np.empty_like(logits)
    for i in range(pos):
        two = logits[[i, i]]  # position 0 predicts position 1's token; the second row is never read
        for t in range(vocab):
            out[i, t] = -gpt2.cross_entropy(two, np.array([0, t]))[0]
    return out


def test_the_streamed_golden_holds_plains_activations(tmp_path):
    """``refgpt golden`` (write_streamed, a stage at a time) read back: every activation, every
    LayerNorm's output, the logits, log_probs and loss are plain's (§1–§6, §11)."""
    model = model_of("unembed.b_U")
    tokens = tokens_of(model, 65, 2)
    g = golden.read(golden.write_streamed(tmp_path / "g.safetensors", model, tokens)).tensors
    led = pb.Ledger()
    assert np.array_equal(g["tokens"], tokens) and np.array_equal(g["targets"], tokens[:, 1:])
    for i in range(len(tokens)):
        acts = pb.row(g, i)
        assert {n for n in acts if n.endswith(".out")} == {f"blocks.{L}.ln{k}.out" for L in range(2) for k in (1, 2)} | {"ln_final.out"}
        pb.check_forward(led, model.params, model.cfg, tokens[i], acts, g["logits"][i])
        nll, bound = pb.log_prob_bounds(g["logits"][i])
        led.compare("log_probs", "log_probs", g["log_probs"][i], plain_log_probs(g["logits"][i]), bound)
        targets = tokens[i, 1:]
        led.exact("loss", "loss", g["loss"][i], -g["log_probs"][i][np.arange(64), targets])
    MEASURED.merge(led)


def plain_golden_values(model, tokens):
    """Every tensor of a golden file, as plain computes it from the tokens alone, [batch, …]."""
    cfg, p, rows = model.cfg, model.params, []
    for t in tokens:
        logits, acts = gpt2.forward(p, cfg, t)
        for prefix, x in [(f"blocks.{L}.ln{k}.", acts[f"blocks.{L}.hook_resid_{'pre' if k == 1 else 'mid'}"])
                          for L in range(cfg.n_layers) for k in (1, 2)] + [
                              ("ln_final.", acts[f"blocks.{cfg.n_layers - 1}.hook_resid_post"])]:
            acts[prefix + "out"] = gpt2.layer_norm(x, p[prefix + "w"], p[prefix + "b"], cfg.eps)[0]
        log_probs = plain_log_probs(logits)
        acts.update(logits=logits, log_probs=log_probs, loss=-log_probs[np.arange(len(t) - 1), t[1:]])
        rows.append(acts)
    values = {name: np.stack([r[name] for r in rows]) for name in rows[0]}
    return {**values, "tokens": tokens, "targets": tokens[:, 1:]}


@pytest.mark.parametrize("bug", [None, "blocks.1.mlp.b_in", "unembed.W_U"])
def test_compare_judges_a_golden_as_the_whole_tensor_judgement_of_plains_values_does(tmp_path, monkeypatch, bug):
    """``refgpt compare`` on a streamed golden, a block of rows at a time, and the whole-tensor
    judgement (tests/whole_compare.py) with plain's values as the reference, on a float32 pass
    (maybe with a bug): the same verdict for every tensor, and the largest errors they
    report differ by at most the golden's distance from plain (which test_the_streamed_golden…
    holds to its bound)."""
    cfg = Config(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=8)
    model = random_model(cfg, seed=5)
    tokens = np.random.default_rng(5).integers(0, cfg.d_vocab, (2, 8))
    path = golden.write_streamed(tmp_path / "g.safetensors", model, tokens, command=["t"])
    stored = golden.read(path)
    params = dict(model.params)
    if bug:
        params[bug] = params[bug] * (1 + 1e-3)  # far outside float32's tolerance, as the clean pass is far inside it
    candidate = golden.compute(Model(cfg, params, dtype="float32"), tokens)
    plain_values = plain_golden_values(model, tokens)
    assert set(plain_values) == set(stored.tensors)
    monkeypatch.setattr(comparison, "BLOCK_BYTES", 8 * 2)  # blocks of 2 rows
    blocked = comparison.compare(path, candidate)
    monkeypatch.setattr(comparison, "_compare_tensor", whole_compare_tensor)
    monkeypatch.setattr(comparison, "_logits_summary", whole_logits_summary)
    whole = comparison.compare(golden.Golden(plain_values, dict(stored.metadata)), candidate)
    assert [t.name for t in blocked.tensors] == [t.name for t in whole.tensors]
    assert blocked.ok == whole.ok and (bug is None) == whole.ok
    for b, w in zip(blocked.tensors, whole.tensors):
        assert b.status == w.status, b.name
        if stored.tensors[b.name].dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                distance = np.nanmax(np.where(np.isfinite(plain_values[b.name]),
                                              np.abs(stored.tensors[b.name] - plain_values[b.name]), 0.0))
            assert abs(b.max_abs - w.max_abs) <= distance * (1 + 1e-12), b.name


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_and_tokens(act_fns=["gelu_new", "relu"]))
def test_random_shapes_are_plain_op_by_op(model_tokens):
    """Hypothesis-drawn configs (heads, widths, ε, scaling, layers) and batches: the cached forward
    and, from two tokens on, the backward."""
    model, tokens = model_tokens
    logits, cache = model.run_with_cache(tokens)
    check_cached_pass(model, tokens, logits, cache.cache_dict)
    if tokens.shape[1] > 1:
        check_gradients(model, tokens)


# ---- the bounds are not vacuous: planted bugs fail them --------------------------------------------


def cached_pass_fails(model, match):
    tokens = tokens_of(model, 65, 1)
    logits, cache = model.run_with_cache(tokens)
    with pytest.raises(AssertionError, match=match):
        check_cached_pass(model, tokens, logits, cache.cache_dict)


def test_a_key_dropped_past_a_block_fails_the_bound(monkeypatch):
    """The blocked scores of every block after the first lose key 0: attend_in_blocks' z is off."""
    blocked = attention.block_scores

    def drop_key_0(qh, kh, score_mask, i, rows, seen, space=None):
        scores = blocked(qh, kh, score_mask, i, rows, seen, space)
        if i >= rows:
            scores[..., 0] = -np.inf
        return scores

    monkeypatch.setattr(attention, "block_scores", drop_key_0)
    model = model_of("gelu_new")
    with pytest.raises(AssertionError, match="attend_in_blocks"):
        check_attention_core(model, tokens_of(model, 65, 1), 0, 64)


def test_the_score_scale_off_by_1e_9_fails_the_bound(monkeypatch):
    from refgpt import model as model_module

    fast = model_module.attention
    monkeypatch.setattr(model_module, "attention",
                        lambda x, w, n_heads, score_scale, *args, **kw: fast(x, w, n_heads, score_scale * (1 + 1e-9), *args, **kw))
    cached_pass_fails(model_of("gelu_new"), r"\(scores\)")


def test_a_fused_qkv_weight_off_by_1e_9_relative_fails_the_bound(tmp_path):
    model = refgpt.load(save_checkpoint(model_of("gelu_new"), tmp_path, dtype=np.float64))
    ln, w, mlp = model.block_weights(0)
    W = np.array(w["W_QKV"])
    W[np.argmax(np.abs(W[:, 0])), 0] *= 1 + 1e-9  # one weight of q's first column
    model._blocks[0] = (ln, {**w, "W_QKV": W}, mlp)
    cached_pass_fails(model, r"blocks\.0\.attn\.hook_q \(q, k, v\)")


def test_layernorms_eps_off_by_1e_6_relative_fails_the_bound(monkeypatch):
    from refgpt import model as model_module

    fast = model_module.layer_norm
    monkeypatch.setattr(model_module, "layer_norm", lambda x, w, b, eps, *args, **kw: fast(x, w, b, eps * (1 + 1e-6), *args, **kw))
    cached_pass_fails(model_of("gelu_new"), r"\(ln scale\)")


def test_gelus_constant_off_by_1e_12_fails_the_bound(monkeypatch):
    monkeypatch.setattr(activations, "_SQRT_2_OVER_PI", activations._SQRT_2_OVER_PI * (1 + 1e-12))
    with pytest.raises(AssertionError, match="gelu_new"):
        test_the_in_place_blocked_gelu_new_and_its_backward_are_plains(65)


def test_the_backwards_score_scale_off_by_1e_9_fails_the_bound(monkeypatch):
    from refgpt import backward

    fast = backward.attention_backward
    monkeypatch.setattr(backward, "attention_backward",
                        lambda grad, x, w, q, k, v, pattern, z, s, *args: fast(grad, x, w, q, k, v, pattern, z,
                                                                                s * (1 + 1e-9), *args))
    model = model_of("gelu_new")
    with pytest.raises(AssertionError, match=r"hook_q grad \(attn backward\)"):
        check_gradients(model, tokens_of(model, 65, 1))


def test_a_cached_key_off_by_1e_9_fails_the_bound():
    model = model_of("gelu_new")
    tokens = tokens_of(model, 66, 1)
    past = model.kv_cache(1)
    first_logits, first = model.run_with_cache(tokens[:, :65], past=past)
    past.keys[1, :, 3] *= 1 + 1e-9  # layer 1's key at position 3, as a wrong cache would hold it
    logits, second = model.run_with_cache(tokens[:, 65:], past=past)
    steps = [first.cache_dict, second.cache_dict]
    with pytest.raises(AssertionError, match=r"blocks\.1\.attn\.hook_attn_scores \(scores\)"):
        check_cached_pass(model, tokens, np.concatenate([first_logits, logits], axis=1), assembled(steps, 66))
