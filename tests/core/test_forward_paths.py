"""Every way of running the forward pass computes the same GPT-2, at lengths that cross every
block boundary of every fast path. (The peers check the numbers themselves: test_peers_boundaries.py.)

The fast paths and their blocks:
- attention.attend_in_blocks: 64 query rows at a time, each block seeing keys 0 … start + its last
  query; used when no hook looks at the scores or the pattern (the plain forward). ``attend``
  makes the full [query, key] scores and pattern for the hooks and the cache (run_with_cache),
  by the same blocks and the same calls, copying each block into the full arrays; so
  run_with_cache's logits and activations equal the plain forward's bit for bit. After a hook on
  the scores or the pattern it reads the full arrays back, a block at a time, and a block where
  the hook unmasked a key is computed over whole rows (the hook is honoured).
- activations.gelu_new: 64 rows of [batch·pos, d_mlp] at a time.
- kv_cache: the new queries start at ``start`` = positions already held.
So the lengths are 1, 63, 64, 65, 127, 128, 129 and n_ctx = 140, batched and not, and KV-cache
chunks that start inside a block and cross one or two boundaries.

Tolerance: the KV-cached and last_only paths make the same products and sums except for the
masked keys, whose terms are exactly 0 (exp(−∞)); BLAS and NumPy may group the sums differently
for a different number of keys, a few ulps per reduction. 1e-12 relative (float64) is the peers'
tolerance and ~10⁴ ulps; a mutant that drops or adds one key moves a logit by ~1e-3. The cached
path (``attend``) and the plain one (``attend_in_blocks``) are compared bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from random_models import random_model, rel_err
from refgpt import Config, RefGPTError
from refgpt.gpt2.activations import _gelu_new_into, gelu_new
from refgpt.gpt2.attention import attend, attend_in_blocks, causal_score_mask
from refgpt.gpt2.layernorm import centered_scale, layer_norm

N_CTX = 140
CFG = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=12, d_vocab=23, n_ctx=N_CTX)
LENGTHS = (1, 63, 64, 65, 127, 128, 129, N_CTX)
TOL = {"float64": 1e-12, "float32": 2e-5}
PATTERNS = [f"blocks.{L}.attn.hook_pattern" for L in range(CFG.n_layers)]


@pytest.fixture(scope="module", params=["float64", "float32"])
def model(request):
    # scale 1: attention far from uniform, so every key a block wrongly drops or adds shows
    return random_model(CFG, seed=13, dtype=request.param, scale=1.0)


def tokens_of(pos, batch):
    rng = np.random.default_rng(pos)
    return rng.integers(0, CFG.d_vocab, size=(pos,) if batch is None else (batch, pos))


@pytest.mark.parametrize("batch", [None, 2])
@pytest.mark.parametrize("pos", LENGTHS)
def test_blocked_attention_equals_full_attention(model, pos, batch):
    """model(tokens) (blocked attention) = run_with_cache of the pattern (full arrays), bit for bit."""
    tokens = tokens_of(pos, batch)
    plain = model(tokens)
    cached, cache = model.run_with_cache(tokens, names=PATTERNS)
    assert plain.shape == cached.shape == (*np.shape(tokens), CFG.d_vocab)
    assert plain.dtype == model.dtype
    assert np.array_equal(plain, cached)
    pattern = cache[PATTERNS[-1]]  # [batch, head, query, key]
    assert np.allclose(pattern.sum(-1), 1) and not np.triu(pattern[0, 0], 1).any()


@pytest.mark.parametrize("pos", [64, 65, 129, N_CTX])
def test_last_only_is_the_last_row_of_the_plain_forward(model, pos):
    tokens = tokens_of(pos, 2)
    assert rel_err(model(tokens, last_only=True), model(tokens)[:, -1:]) <= TOL[model.dtype.name]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [None, 2])
@pytest.mark.parametrize("chunks", [(1,) * N_CTX, (3, 130, 7), (64, 1, 64, 11), (63, 2, 75)])
def test_kv_cached_forward_equals_the_full_forward(model, chunks, batch):
    """Token by token and in chunks that start mid-block and cross 64 and 128, plain and cached."""
    tokens = tokens_of(N_CTX, batch)
    full = model(tokens)
    pieced = []
    for watched in (None, PATTERNS):  # the blocked path, then the full one, with start > 0
        past = model.kv_cache(1 if batch is None else batch)
        pieces, start = [], 0
        for n in chunks:
            piece = tokens[..., start:start + n]
            if watched is None:
                pieces.append(model(piece, past=past))
            else:
                logits, cache = model.run_with_cache(piece, names=watched, past=past)
                assert cache[watched[0]].shape[-2:] == (n, start + n)  # new queries against every key
                pieces.append(logits)
            start += n
        assert past.length == N_CTX
        pieced.append(np.concatenate(pieces, axis=-2))
        assert rel_err(pieced[-1], full) <= TOL[model.dtype.name]
    assert np.array_equal(*pieced)  # the cached path's numbers are the plain path's, chunk by chunk


def test_kv_cache_refuses_another_batch_and_more_than_n_ctx(model):
    past = model.kv_cache(2)
    with pytest.raises(RefGPTError, match="KVCache: made for batch 2, given tokens with batch 1"):
        model(tokens_of(3, 1), past=past)
    with pytest.raises(RefGPTError, match="KVCache: made for batch 2, given tokens with batch 1"):
        model(tokens_of(3, None), past=past)
    assert past.length == 0
    model(tokens_of(N_CTX - 1, 2), past=past)
    with pytest.raises(RefGPTError, match=f"tokens: 2 positions after {N_CTX - 1} cached, but the model has only"):
        model(tokens_of(2, 2), past=past)
    with pytest.raises(RefGPTError, match=f"KVCache: {N_CTX - 1} positions stored \\+ 2 new exceeds n_positions={N_CTX}"):
        past.check(2, 2)
    past.check(2, 1)  # exactly n_ctx is allowed
    assert past.length == N_CTX - 1


@pytest.mark.parametrize("rows", [1, 63, 64, 65, 127, 128, 129, 2 * N_CTX])
def test_gelu_row_blocks_change_no_bit(rows):
    """gelu_new a block of 64 rows at a time = the same steps over all rows at once, bit for bit,
    and = the textbook formula to rounding."""
    x = np.random.default_rng(rows).standard_normal((rows, 5)) * 3  # [rows, d_mlp]
    whole = np.empty_like(x)
    _gelu_new_into(x, whole)
    assert np.array_equal(gelu_new(x), whole)
    assert np.array_equal(gelu_new(x.reshape(1, rows, 5)), whole.reshape(1, rows, 5))  # [batch, pos, d_mlp]
    textbook = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    assert rel_err(whole, textbook) <= 1e-15


@pytest.mark.parametrize("start, pos", [(0, 1), (0, 65), (0, 129), (5, 60), (5, 64), (70, 70), (3, 130)])
def test_attention_blocks_equal_full_attention_after_a_cache(start, pos):
    """attend_in_blocks = attend (bit for bit) for queries start … start + pos − 1 against keys
    0 … start + pos − 1."""
    rng = np.random.default_rng(start * 1000 + pos)
    qh = rng.standard_normal((2, 3, pos, 4))  # [batch, head, query, d_head]
    kh, vh = rng.standard_normal((2, 2, 3, start + pos, 4))  # [batch, head, key, d_head]

    def point(name, a):
        return a

    point.watched = lambda name: True
    point.hooked = lambda name: False
    assert np.array_equal(attend_in_blocks(qh, kh, vh), attend(qh, kh, vh, point))
    bias = causal_score_mask(pos, start, np.float64)  # [query, key]
    assert bias.shape == (pos, start + pos) and not bias.flags.writeable
    assert np.all(bias[:, :start + 1] == 0) and np.isneginf(bias[0, start + 1:]).all()


ATTENTION = [f"blocks.{L}.attn.hook_{n}" for L in range(CFG.n_layers) for n in ("attn_scores", "pattern")]


def left_padding(tokens, pads=5):
    mask = np.ones_like(tokens)  # [batch, pos]: 1 real, 0 pad
    mask[0, :pads] = 0
    return mask


@pytest.mark.parametrize("pos", [65, N_CTX])
@pytest.mark.parametrize("padded", [False, True])
def test_run_with_cache_is_the_plain_forward_bit_for_bit(model, pos, padded):
    """Every activation in a full cache, and the logits, are the plain forward's bit for bit (the
    forward's are seen through a cache of every name but the scores and pattern, which keeps the
    plain path), also when a hook reads the scores and the pattern without changing them."""
    tokens = tokens_of(pos, 2)
    mask = left_padding(tokens) if padded else None
    plain = model(tokens, attention_mask=mask)
    others = [n for n in model.hook_names if n not in ATTENTION]
    _, reference = model.run_with_cache(tokens, names=others, attention_mask=mask)
    read = []
    readers = [(name, lambda a, hook: read.append(hook.name)) for name in ATTENTION]
    for hooks in ([], readers):
        logits, cache = model.run_with_cache(tokens, attention_mask=mask, fwd_hooks=hooks)
        assert np.array_equal(logits, plain)
        for name in others:
            assert np.array_equal(cache[name], reference[name], equal_nan=True), name
    assert read == ATTENTION


def textbook_attention(scores, v):
    """softmax over whole rows, and z = pattern·v, in float64: scores [batch, head, query, key],
    v [batch, key, head, d_head] → pattern, z [batch, query, head, d_head]."""
    e = np.exp(scores - scores.max(-1, keepdims=True))  # [batch, head, query, key]
    pattern = e / e.sum(-1, keepdims=True)  # [batch, head, query, key]
    return pattern, np.einsum("bhqk,bkhd->bqhd", pattern, v)


def z_tolerance(model, v, keys=N_CTX):
    """|Σ_k p·v − fl(Σ_k p·v)| ≤ keys·eps·Σ_k |p|·|v| ≤ 2·keys·eps·max|v| (rows of |p| sum to ≤ 2 here)."""
    return 2 * keys * np.finfo(model.dtype).eps * max(1.0, float(np.abs(v).max()))


def test_a_scores_hook_that_unmasks_future_keys_is_honoured(model):
    """TransformerLens's semantics: the pattern is the softmax of the hooked scores over whole rows,
    z = pattern·v. Query 3 is given key 100, beyond its block's keys (that block then takes whole
    rows); query 70 key 100, inside its block's keys; key 5 is masked in place (None returned) for
    the queries before 128. The last block (queries 128 …) keeps the plain forward's bits."""
    tokens = tokens_of(N_CTX, 2)
    name, L = "blocks.1.attn.hook_attn_scores", "blocks.1.attn."

    def edit(scores, hook):
        scores[:, 0, 3, 100] = scores[:, 0, 3, 3]
        scores[:, 1, 70, 100] = 0.5
        scores[:, :, :128, 5] = -np.inf

    _, clean = model.run_with_cache(tokens)
    logits, cache = model.run_with_cache(tokens, fwd_hooks=[(name, edit)])
    pattern, z = textbook_attention(cache[name].astype(np.float64), cache[L + "hook_v"])
    assert rel_err(cache[L + "hook_pattern"], pattern) <= 10 * np.finfo(model.dtype).eps
    assert (cache[L + "hook_pattern"][:, 0, 3, 100] > 0).all() and (cache[L + "hook_pattern"][:, 1, 70, 100] > 0).all()
    assert not cache[L + "hook_pattern"][:, :, 5:128, 5].any()
    assert rel_err(cache[L + "hook_z"], z) <= z_tolerance(model, cache[L + "hook_v"])
    assert not np.allclose(logits, clean.model(tokens))
    assert np.array_equal(cache[L + "hook_pattern"][:, :, 128:], clean[L + "hook_pattern"][:, :, 128:])
    assert np.array_equal(cache[L + "hook_z"][:, 128:], clean[L + "hook_z"][:, 128:])


def test_a_pattern_hook_is_honoured(model):
    """A replaced pattern with weight on a key beyond the block and a head zeroed: z = pattern·v."""
    tokens = tokens_of(N_CTX, 2)
    name, L = "blocks.0.attn.hook_pattern", "blocks.0.attn."

    def edit(pattern, hook):
        out = pattern.copy()  # [batch, head, query, key]
        out[:, 0, 3, 100] = 1.0
        out[:, 1] = 0.0
        return out

    logits, cache = model.run_with_cache(tokens, fwd_hooks=[(name, edit)])
    v, pattern = cache[L + "hook_v"], cache[name]  # the replacement is what flowed on
    assert (pattern[:, 0, 3, 100] == 1).all() and not pattern[:, 1].any()
    z = np.einsum("bhqk,bkhd->bqhd", pattern.astype(np.float64), v)  # [batch, query, head, d_head]
    assert rel_err(cache[L + "hook_z"], z) <= z_tolerance(model, v)
    assert not cache[L + "hook_z"][:, :, 1].any()
    assert not np.allclose(logits, model(tokens))


@pytest.mark.parametrize("point", ["hook_attn_scores", "hook_pattern"])
def test_a_hook_on_just_the_first_key_past_a_block_is_honoured(model, point):
    """The edge of ``attend``'s check for edited rows: block 0 (queries 0 … 63) computes keys
    0 … 63, and a hook gives query 3 key 64, the first key past them, and nothing else."""
    tokens = tokens_of(65, 2)
    L = "blocks.0.attn."

    def edit(a, hook):
        a = a.copy()  # [batch, head, query, key]
        a[:, 0, 3, 64] = a[:, 0, 3, 3] if point == "hook_attn_scores" else 0.5
        return a

    _, cache = model.run_with_cache(tokens, fwd_hooks=[(L + point, edit)])
    v = cache[L + "hook_v"]
    if point == "hook_attn_scores":
        pattern, _ = textbook_attention(cache[L + point].astype(np.float64), v)
        assert rel_err(cache[L + "hook_pattern"], pattern) <= 10 * np.finfo(model.dtype).eps
    pattern = cache[L + "hook_pattern"]
    assert (pattern[:, 0, 3, 64] > 0).all()
    z = np.einsum("bhqk,bkhd->bqhd", pattern.astype(np.float64), v)  # [batch, query, head, d_head]
    assert rel_err(cache[L + "hook_z"], z) <= z_tolerance(model, v, keys=65)


def test_only_the_watched_full_arrays_are_made(model):
    """A cache of the pattern alone or of the scores alone holds the same bits as a full cache."""
    tokens = tokens_of(N_CTX, 2)
    _, full = model.run_with_cache(tokens, names=ATTENTION)
    for name in ATTENTION:
        logits, one = model.run_with_cache(tokens, names=[name])
        assert list(one) == [name] and np.array_equal(one[name], full[name])
        assert np.array_equal(logits, model(tokens))


def test_layernorm_overflow_guard_scales_each_row_by_its_own_power_of_two():
    """Rows of very different sizes in one array (batch, position): each row's σ is its own,
    none overflows and none underflows. The guard's max is per row (keepdims, last axis)."""
    rng = np.random.default_rng(0)
    n = 5
    sizes = np.array([[1e200, 1e-3, 1.0], [1e-150, 3e5, 1e250]])  # [batch, pos]
    d = rng.standard_normal((2, 3, n))  # [batch, pos, n]
    x = d * sizes[..., None]  # [batch, pos, n]
    w, b = 1 + 0.1 * rng.standard_normal(n), rng.standard_normal(n)
    stats = {}
    out = layer_norm(x, w, b, 1e-5, lambda name, a: stats.setdefault(name, a))
    assert stats["hook_scale"].shape == (2, 3, 1)
    for i, j in np.ndindex(2, 3):
        c = d[i, j] - d[i, j].mean()  # the direction; x's centered row is sizes[i, j]·c
        assert stats["hook_scale"][i, j, 0] == pytest.approx(reference_sigma(sizes[i, j] * c), rel=1e-14), (i, j)
        hat = sizes[i, j] * c / reference_sigma(sizes[i, j] * c)
        assert out[i, j] == pytest.approx(w * hat + b, rel=1e-13, abs=1e-13), (i, j)
    # square [n, n] input: a per-column max (axis 0) or a flattened one would broadcast silently
    sq = rng.standard_normal((n, n)) * np.logspace(-200, 200, n)[:, None]  # row i of size 10^(−200 + 100·i)
    got = centered_scale(sq - sq.mean(-1, keepdims=True), 1e-5)  # [n, 1]
    assert got.shape == (n, 1)
    for i in range(n):
        assert got[i, 0] == pytest.approx(reference_sigma(sq[i] - sq[i].mean()), rel=1e-14), i


def reference_sigma(c, eps=1e-5):
    """√(mean c² + ε) of a centered row, by the textbook where c² neither overflows nor matters
    (|c| < 1e100), else as s·√(mean (c/s)²) with s = max|c| (ε/s² < 1e-200 is below rounding)."""
    s = np.abs(c).max()
    return np.sqrt(np.mean(c * c) + eps) if s < 1e100 else s * np.sqrt(np.mean((c / s) ** 2))


def test_hooks_context_lets_errors_through_and_always_removes_its_hooks(model):
    tokens = tokens_of(65, 2)
    clean = model(tokens)
    with pytest.raises(ZeroDivisionError):
        with model.hooks([("blocks.0.hook_resid_pre", lambda a, n: a * 0)]):
            assert not np.allclose(model(tokens), clean)
            1 / 0
    assert np.array_equal(model(tokens), clean)
    with pytest.raises(RefGPTError, match="not a hook point"):
        model.hooks([("blocks.0.hook_nothing", lambda a, n: a)])


@pytest.mark.parametrize("names", [["scores"], ["pattern"], ["scores", "pattern"]])
def test_cached_scores_stay_scores_and_pattern_is_their_softmax(model, names):
    """softmax reuses the scores' buffer only when nobody holds the scores."""
    tokens = tokens_of(70, 2)
    wanted = [f"blocks.1.attn.hook_{n if n == 'pattern' else 'attn_scores'}" for n in names]
    logits, cache = model.run_with_cache(tokens, names=wanted)
    assert rel_err(logits, model(tokens)) <= TOL[model.dtype.name]
    _, full = model.run_with_cache(tokens, names=["blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern"])
    scores, pattern = full["blocks.1.attn.hook_attn_scores"], full["blocks.1.attn.hook_pattern"]
    assert np.isneginf(scores[0, 0, 0, 1:]).all() and (scores[0, 0, 5, :6] != pattern[0, 0, 5, :6]).all()
    e = np.exp(scores - scores.max(-1, keepdims=True))
    assert rel_err(pattern, e / e.sum(-1, keepdims=True)) <= 10 * np.finfo(model.dtype).eps
    for name in wanted:
        assert np.array_equal(cache[name], full[name]), name
