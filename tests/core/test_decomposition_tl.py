"""refgpt's TransformerLens-named decomposition API against TransformerLens 3.9 itself, float64.

Each function (accumulated_resid, decompose_resid, stack_head_results, stack_neuron_results,
get_full_resid_decomposition, apply_ln_to_stack, logit_attrs) is called with the same arguments
on refgpt's cache and on TL's, over a grid of arguments, and must return the same labels and the
same values to ≤ 1e-12 relative (docs/decomposition.md §5). Two models per seed: the weights as
stored, and the weights processed as TL's ``from_pretrained`` does by default (fold_ln,
center_writing_weights, center_unembed, fold_value_biases) — refgpt via ``refgpt.load(…,
process=True)``, TL via its own ProcessWeights functions applied in float64 (TL 3.9's
load_and_process_state_dict would round them to float32), then loaded into the LNPre model.

The one documented difference: TL sums get_full_resid_decomposition's "bias" row in float32 even
in a float64 model. That row must equal refgpt's own computation with the bias summed in float32
the way TL does (acc32 += b, rounded after each add), to ≤ 1e-12; refgpt's row is the float64 sum.

Needs the 'peers' extra; skipped without it.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from peers import require_peers

torch, transformers, transformer_lens = require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import peers as P  # noqa: E402  (after the importorskip)
from transformer_lens.utilities import Slice  # noqa: E402
from transformer_lens.weight_processing import ProcessWeights  # noqa: E402

import refgpt  # noqa: E402
from refgpt.tl.decomposition import apply_ln_to_stack  # noqa: E402

TOL = 1e-12


def tl_processed_like_from_pretrained(hf):
    """TL model processed as from_pretrained's defaults do, with the processing done in float64."""
    tl = P.tl_model_from_hf(hf, "float64")
    raw = tl.fill_missing_keys({k: v.detach().clone() for k, v in tl.named_parameters()})
    sd = ProcessWeights.fold_layer_norm(dict(raw), tl.cfg, fold_biases=True, center_weights=True)
    sd = ProcessWeights.center_writing_weights(sd, tl.cfg)
    sd = ProcessWeights.center_unembed(sd, tl.cfg)
    sd = ProcessWeights.fold_value_biases(sd, tl.cfg)
    for L in range(tl.cfg.n_layers):  # what process_weights does after fold_value_biases
        sd[f"blocks.{L}.attn.b_O"] = sd[f"blocks.{L}.attn.b_O"] - sd[f"blocks.{L}.attn.b_O"].mean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl.load_and_process_state_dict(dict(raw), fold_ln=True, center_writing_weights=True,
                                       center_unembed=True, fold_value_biases=True)  # → LNPre, float32-rounded
    names = dict(tl.named_parameters())
    tl.load_state_dict({k: sd[k] for k in names}, strict=False)  # the float64 values
    for k, p in tl.named_parameters():
        assert p.dtype == torch.float64 and torch.equal(p, sd[k]), k
    assert tl.cfg.normalization_type == "LNPre"
    return tl, sd


SETUPS = [(seed, processed) for seed in (11, 12) for processed in (False, True)]


@pytest.fixture(scope="module", params=SETUPS, ids=[f"seed{s}-{'processed' if p else 'raw'}" for s, p in SETUPS])
def pair(request, tmp_path_factory):
    """(refgpt cache, TL cache, tokens, refgpt model, TL model, TL's processed state dict or None)."""
    seed, processed = request.param
    cfg = P.random_hf_config(seed, act_fns=tuple(P.TL_ACT_FNS), n_layer=2 + seed % 2, n_positions=8)
    hf = P.random_hf_model(cfg, seed)
    directory = P.save_hf_layout(hf, tmp_path_factory.mktemp(f"tl{seed}"), dtype="F64")
    tl, sd = tl_processed_like_from_pretrained(hf) if processed else (P.tl_model_from_hf(hf, "float64"), None)
    model = refgpt.load(directory, process=True if processed else None)
    tokens = P.random_tokens(seed, cfg.vocab_size, cfg.n_positions, batch=2, pos=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            _, tl_cache = tl.run_with_cache(torch.as_tensor(tokens))
    _, cache = model.run_with_cache(tokens)
    return cache, tl_cache, tokens, model, tl, sd


def to_torch(kwargs):
    return {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}


def compare(cache, tl_cache, method, kwargs, skip_rows=()):
    """Call ``method`` on both caches with return_labels=True; same labels, values ≤ TOL."""
    with torch.no_grad():
        try:
            tl_stack, tl_labels = getattr(tl_cache, method)(**to_torch(kwargs), return_labels=True)
        except RuntimeError:
            return None  # TL itself fails on these arguments; the callers say which and why
    stack, labels = getattr(cache, method)(**kwargs, return_labels=True)
    assert labels == tl_labels, f"{method}({kwargs}): labels differ"
    tl_stack = P._np(tl_stack)
    assert stack.shape == tl_stack.shape, f"{method}({kwargs}): shape {stack.shape} != TL {tl_stack.shape}"
    keep = [i for i, label in enumerate(labels) if label not in skip_rows]
    if keep:
        err = P.rel_err(stack[keep], tl_stack[keep])
        assert err <= TOL, f"{method}({kwargs}): {err:.2e}"
        P.record_error("decomposition vs TL", err)
    return stack, tl_stack, labels


def pos_slices(pos):
    return [None, -1, (1, pos - 1), [0, 2, pos - 1]]


def test_weights_match_tl(pair):
    """§3: refgpt.load() holds TL's raw weights; refgpt.load(process=True) TL's float64-processed ones,
    with every LayerNorm left at w = 1, b = 0 (what TL's LayerNormPre computes)."""
    cache, tl_cache, tokens, model, tl, sd = pair
    processed = sd is not None
    if not processed:
        sd = {name: p.detach() for name, p in tl.named_parameters()}
        b_U = sd.pop("unembed.b_U", torch.zeros(1))  # GPT-2 has no b_U: TL holds zeros, refgpt nothing
        assert not b_U.any() and "unembed.b_U" not in model.params
    for name, value in sd.items():
        if not name.endswith(("IGNORE", "mask")):
            assert P.rel_err(model.params[name], value) <= TOL, name
    ln = [name for name in model.params if name.split(".")[-2] in ("ln1", "ln2", "ln_final")]
    assert all(np.all(model.params[n] == (1 if n.endswith(".w") else 0)) == processed for n in ln)


def test_accumulated_resid_matches_tl(pair):
    cache, tl_cache, tokens, model, *_ = pair
    n, pos = model.cfg.n_layers, tokens.shape[1]
    for layer, incl_mid, apply_ln, mlp_input, pos_slice in itertools.product(
            [None, 0, 1, n - 1, n], [False, True], [False, True], [False, True], pos_slices(pos)):
        compare(cache, tl_cache, "accumulated_resid", dict(layer=layer, incl_mid=incl_mid, apply_ln=apply_ln,
                                                           mlp_input=mlp_input, pos_slice=pos_slice))


def test_decompose_resid_matches_tl(pair):
    cache, tl_cache, tokens, model, *_ = pair
    n, pos = model.cfg.n_layers, tokens.shape[1]
    for layer, mlp_input, mode, apply_ln, incl_embeds, pos_slice in itertools.product(
            [None, 0, 1, n - 1], [False, True], ["all", "attn", "mlp"], [False, True], [True, False],
            pos_slices(pos)[:3]):
        if mlp_input and layer is None:
            continue
        kwargs = dict(layer=layer, mlp_input=mlp_input, mode=mode, apply_ln=apply_ln, incl_embeds=incl_embeds,
                      pos_slice=pos_slice)
        if compare(cache, tl_cache, "decompose_resid", kwargs) is None:  # TL cannot stack nothing
            assert cache.decompose_resid(**kwargs).shape[0] == 0


def test_stack_head_results_matches_tl(pair):
    cache, tl_cache, tokens, model, *_ = pair
    n, pos = model.cfg.n_layers, tokens.shape[1]
    for layer, incl_remainder, apply_ln, pos_slice in itertools.product(
            [-1, 0, 1, n], [False, True], [False, True], pos_slices(pos)):
        if layer == 0 and incl_remainder:
            continue  # TL's layer-0 remainder is the final stream (documented divergence)
        compare(cache, tl_cache, "stack_head_results", dict(layer=layer, incl_remainder=incl_remainder,
                                                            apply_ln=apply_ln, pos_slice=pos_slice))


def test_stack_neuron_results_matches_tl(pair):
    cache, tl_cache, tokens, model, *_ = pair
    n, d = model.cfg.n_layers, model.cfg.d_model
    rng = np.random.default_rng(0)
    projections = [None, rng.standard_normal(d), rng.standard_normal((d, 3))]
    for layer, neuron_slice, incl_remainder, apply_ln, project, pos_slice in itertools.product(
            [1, n], [None, (0, 3), [1, 2]], [False, True], [False, True], projections, [None, -1, [0, 2]]):
        compare(cache, tl_cache, "stack_neuron_results",
                dict(layer=layer, neuron_slice=neuron_slice, incl_remainder=incl_remainder, apply_ln=apply_ln,
                     project_output_onto=project, pos_slice=pos_slice))


def test_transformer_lens_slice_objects_are_read_as_their_slice(pair):
    """A TransformerLens ``Slice`` given as pos_slice/neuron_slice means what it wraps."""
    cache, tl_cache, tokens, model, *_ = pair
    for spec in (-1, (1, 5), [0, 2]):
        got = compare(cache, tl_cache, "stack_head_results", dict(pos_slice=Slice(spec)))[0]
        assert np.array_equal(got, cache.stack_head_results(pos_slice=spec))
    for spec in ((1, 5), [0, 2]):  # (an int neuron_slice is a departure: test_decomposition.py)
        got = compare(cache, tl_cache, "stack_neuron_results", dict(layer=1, neuron_slice=Slice(spec)))[0]
        assert np.array_equal(got, cache.stack_neuron_results(1, neuron_slice=spec))


def positions_index(pos_slice):
    return slice(None) if pos_slice is None else pos_slice


def tl_float32_bias(model, layer, mlp_input, include_mlp_biases):
    """TL's accumulated_bias in a float64 model: a float32 accumulator, rounded after each add."""
    p = model.params
    terms = [p[f"blocks.{i}.attn.b_O"] for i in range(layer)]
    if include_mlp_biases:
        terms = [t for i in range(layer) for t in (p[f"blocks.{i}.attn.b_O"], p[f"blocks.{i}.mlp.b_out"])]
    if mlp_input:
        terms.append(p[f"blocks.{layer}.attn.b_O"])
    acc = np.zeros(model.cfg.d_model, np.float32)  # [d_model]
    for term in terms:
        acc = (acc.astype(np.float64) + term).astype(np.float32)  # torch: add in float64, store float32
    return acc


def test_full_resid_decomposition_matches_tl_bias_row_in_float32(pair):
    """§5: every row ≤ 1e-12 of TL's; the "bias" row equals refgpt's with TL's float32 sum put in."""
    cache, tl_cache, tokens, model, *_ = pair
    n, d = model.cfg.n_layers, model.cfg.d_model
    rng = np.random.default_rng(1)
    worst = 0.0
    for layer, mlp_input, expand, apply_ln, project, pos_slice in itertools.product(
            [None, 0, 1, n - 1], [False, True], [True, False], [False, True],
            [None, rng.standard_normal(d), rng.standard_normal((d, 2))], [None, -1, [0, 3]]):
        if mlp_input and layer is None:
            continue
        if mlp_input and apply_ln and expand and project is not None:
            continue  # TL's fused neuron path uses ln1's scale here (test_decomposition.py covers refgpt's)
        kwargs = dict(layer=layer, mlp_input=mlp_input, expand_neurons=expand, apply_ln=apply_ln,
                      project_output_onto=project, pos_slice=pos_slice)
        compared = compare(cache, tl_cache, "get_full_resid_decomposition", kwargs, skip_rows=("bias",))
        if compared is None:  # TL 3.9 raises: its float32 bias @ a float64 projection
            assert project is not None and not apply_ln
            continue
        stack, tl_stack, labels = compared
        L = n if layer is None else layer
        positions = cache["scale"][:, positions_index(pos_slice)]  # [batch, pos, 1]
        tl_bias = np.broadcast_to(tl_float32_bias(model, L, mlp_input, expand), (1, *positions.shape[:-1], d))
        if apply_ln and project is not None:  # TL's fused path centres the float32 row in float32 (torch's mean)
            centred = torch.as_tensor(np.ascontiguousarray(tl_bias))
            centred = (centred - centred.mean(-1, keepdim=True)).numpy().astype(np.float64)
            ln = "ln_final" if L == n else f"blocks.{L}.ln{2 if mlp_input else 1}"
            tl_bias = centred / cache[ln + ".hook_scale"][:, positions_index(pos_slice)] @ project
        elif apply_ln:  # TL concatenates (→ float64), then applies LayerNorm
            tl_bias = apply_ln_to_stack(cache, tl_bias.astype(np.float64), L, mlp_input=mlp_input, pos_slice=pos_slice)
        row = labels.index("bias")
        assert P.rel_err(tl_bias[0], tl_stack[row]) <= TOL, kwargs
        worst = max(worst, P.rel_err(stack[row], tl_stack[row]))
    P.record_error("TL float32 bias row vs float64", worst)
    if model.cfg.n_layers > 1:
        assert worst > TOL  # the float32 sum is visible in float64


def test_apply_ln_to_stack_matches_tl(pair):
    cache, tl_cache, tokens, model, *_ = pair
    n = model.cfg.n_layers
    stack = cache.decompose_resid()
    for layer, mlp_input, recompute_ln, batch_slice, pos_slice in itertools.product(
            [None, 0, 1, n - 1], [False, True], [False, True], [None, 1], [None, -1, [1, 2]]):
        if mlp_input and layer is None:
            continue
        sliced = stack[:, :, pos_slice] if pos_slice is not None else stack
        kwargs = dict(layer=layer, mlp_input=mlp_input, pos_slice=pos_slice, batch_slice=batch_slice,
                      recompute_ln=recompute_ln)
        ours = cache.apply_ln_to_stack(sliced, **kwargs)
        with torch.no_grad():
            theirs = P._np(tl_cache.apply_ln_to_stack(torch.as_tensor(sliced), **kwargs))
        assert P.rel_err(ours, theirs) <= TOL, kwargs


def test_logit_attrs_matches_tl(pair):
    cache, tl_cache, tokens, model, *_ = pair
    stack = cache.get_full_resid_decomposition(expand_neurons=False)
    rng = np.random.default_rng(2)
    V = model.cfg.d_vocab
    per_pos = rng.integers(0, V, tokens.shape)
    cases = [dict(tokens=3), dict(tokens=3, incorrect_tokens=5), dict(tokens=per_pos),
             dict(tokens=per_pos, incorrect_tokens=rng.integers(0, V, tokens.shape)),
             dict(tokens=per_pos[:, -1], incorrect_tokens=per_pos[:, 0], pos_slice=-1),
             dict(tokens=4, batch_slice=[1])]
    for case in cases:
        sliced = stack[:, :, -1] if case.get("pos_slice") == -1 else stack
        ours = cache.logit_attrs(sliced, **case)
        with torch.no_grad():
            theirs = P._np(tl_cache.logit_attrs(torch.as_tensor(sliced), **to_torch(case)))
        assert P.rel_err(ours, theirs) <= TOL, case


def test_the_pages_transformerlens_numbers_come_from_the_script():
    """docs/decomposition.md's T rows are what docs/make_decomposition_numbers.py --tl measures."""
    from doc_pages import numbers_script

    script, page = numbers_script()
    assert script.check_page(script.tl_numbers(), page) == []
