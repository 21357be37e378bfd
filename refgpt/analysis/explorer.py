"""The explorer: one offline web page that shows a forward pass — attention, the lenses, LayerNorm's
statistics, an exact attribution and a steering vector — linked by one selection of token, layer
and head.

    page = refgpt.analysis.explore(model, "The Eiffel Tower is in", target=" Paris")
    page                         # in Jupyter: renders itself (_repr_html_)
    page.save("page.html")       # the same page as a file; refgpt explore TEXT -o page.html

The page is one self-contained HTML file: its code (refgpt/analysis/explorer_page/), styles and
data are inline, it makes no network request and works from ``file://``, inside JupyterLab and VS
Code. Every number it shows sits in one JSON document in the page,
``<script type="application/json" id="refgpt-data">``, whose schema (``SCHEMA``) is documented in
docs/explorer.md. ``Explorer.data`` is that document as Python objects.

Rounding: attention weights are stored as whole thousandths (``pattern_unit`` = 0.001; a heat
map cannot show a finer difference, and the hover shows three decimals), each head's in one
string of one or two characters per weight (``pattern_string``, ``decode_pattern``: a weight
below 0.062 is one character, so the page stays small); every other number is
stored as the float64 value, shortest round-trip form, so the page's attribution sum is checked
against the model's logit to float64 rounding.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path

import numpy as np

from .. import threads
from ..errors import RefGPTError
from ..files.atomic_write import write_atomically
from ..files.default_model import is_default_model
from ..gpt2 import ln_views
from ..gpt2.activations import log_softmax
from ..tl.decomposition import token_id
from .attribution import attribute, naive_attribution, value_bias
from .interventions import add_vector, last_token_difference, steering_vector
from .measurements import norm, stream_labels, streams

SCHEMA = "refgpt-explorer/2"
PATTERN_UNIT = 1e-3  # attention weights are stored as whole multiples of this
PATTERN_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # v < 62: one character
PATTERN_PREFIXES = "!#$%&()*+,-./:;="  # v ≥ 62: PATTERN_PREFIXES[(v − 62) // 62] + PATTERN_DIGITS[(v − 62) % 62]
TOP_K = 5  # next tokens shown per position in the steering view
TOP10_DIGITS = 4  # significant digits of the lens hovers' top-10 probabilities and of the pushes (the page shows 4)
PUSH_TOP = 8  # tokens a part pushes up, and down, listed when its attribution bar is clicked
PUSH_BUDGET = 2e10  # multiply-adds (rows · d_model · d_vocab) spent on the pushes: the last positions that fit
PUSH_ROWS = 64  # parts read out at a time (GPT-2: a [64, d_vocab] block, 26 MB)


class Explorer:
    """A built explorer page: ``data`` (the JSON document), ``html`` (the page), ``save(path)``."""

    def __init__(self, data: dict):
        self.data = data

    @property
    def html(self) -> str:
        return render(self.data)

    def save(self, path) -> Path:
        """Write the page to ``path`` atomically (the old file stays until the new one is whole)."""
        page = self.html.encode("utf-8")
        return write_atomically(path, lambda tmp: Path(tmp).write_bytes(page))

    def _repr_html_(self) -> str:
        """Jupyter's hook: the page in an iframe (its scripts run in JupyterLab, Notebook and VS Code
        alike, and its styles cannot leak into the notebook's)."""
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="refgpt explorer" '
                'style="width: 100%; height: 900px; border: 1px solid #ddd;"></iframe>')

    def __repr__(self) -> str:
        d = self.data
        return f"Explorer({len(d['tokens'])} tokens, layers {d['layers']}, heads {d['heads']})"


def explore(model, text, *, target=None, prepend_bos=None, layers=None, heads=None, lens=None, tuned=None,
            steering=None, sae=None, check_unembed_hash: bool = True) -> Explorer:
    """Run ``model`` on ``text`` (a string, or token ids [pos]) and gather what the page shows.

    ``target``: the token whose logit is attributed and whose rank the lenses show (text that is one
    token, or an id); default the model's top next token at the last position. ``layers`` /
    ``heads``: which attention heads the page holds (default all; a long input or a big model may
    choose fewer, docs/explorer.md). ``lens``: the tuned lens of the tuned-lens view, as
    ``refgpt lens --kind tuned`` takes it — None: on the embedded model the lens shipped for it
    (weights/default_lens/), on any other model none; a TunedLens; a lens directory (config.json +
    params.pt, as the tuned-lens package writes it) or translator file; {layer: (W, b)}; False:
    none. ``tuned`` is its old name (translators or a file). A lens read at resid_mid is refused:
    the page's rows are the streams entering each block. ``check_unembed_hash=False`` uses a lens
    directory whose config.json names another unembedding. ``steering``: None, or a dict
    ``plus``, ``minus``, ``layer``, ``coeffs`` (a list, precomputed for the slider) and optionally
    ``prepend_bos`` and ``positions``: ActAdd as ``refgpt steer`` does it (with ``positions``, the
    prompts' last-token difference at those positions, as ``refgpt steer --positions``).
    ``sae``: None, or what builds the page's SAE view, ``(model, cache, target_id, logits) → dict``:
    ``refgpt.sae.explore(model, text, sae, …)`` passes it for an SAE (this room, below the sae room,
    knows no SAE: CONTRIBUTING's layers).
    """
    if sae is not None and not callable(sae):
        raise RefGPTError(f"explore: for an SAE's view call refgpt.sae.explore(model, text, sae, …), found sae= "
                          f"{type(sae).__name__}")
    tokens = _tokens(model, text, prepend_bos)  # [pos]
    cfg = model.cfg
    layers = _chosen(layers, cfg.n_layers, "layers")
    heads = _chosen(heads, cfg.n_heads, "heads")
    logits, cache = model.run_with_cache(tokens[None])  # [1, pos, d_vocab]
    logits = logits[0]  # [pos, d_vocab]
    target_id = int(np.argmax(logits[-1])) if target is None else token_id(model, target, "target")
    tuned_lens = _tuned_lens(model, lens, tuned, check_unembed_hash)
    data = {
        "schema": SCHEMA,
        "model": {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_model": cfg.d_model, "d_vocab": cfg.d_vocab,
                  "n_ctx": cfg.n_ctx, "dtype": model.dtype.name, "source": _source_name(model.source)},
        "text": text if isinstance(text, str) else None,
        "tokens": _token_strings(model, tokens),
        "token_ids": tokens.tolist(),
        "next_logprob": [None] + _floats(log_softmax(logits[:-1])[np.arange(len(tokens) - 1), tokens[1:]]),  # [pos]
        "target": {"id": target_id, "token": _token_strings(model, [target_id])[0]},
        "layers": layers,
        "heads": heads,
        "pattern_unit": PATTERN_UNIT,
        "pattern": [[pattern_string(cache[f"blocks.{L}.attn.hook_pattern"][0, h]) for h in heads] for L in layers],
        "ln_scale": _ln_stat(cache, cfg.n_layers, "hook_scale"),
        "ln_mean": _ln_stat(cache, cfg.n_layers, "hook_mean"),
        "resid_norm": _resid_norms(cache, cfg.n_layers),
        "lens": {"streams": stream_labels(cfg.n_layers),
                 "logit": _lens(model, streams(cache)[:, 0], logits, target_id),
                 "tuned": None if tuned_lens is None else
                 _lens(model, _translated(streams(cache)[:, 0], tuned_lens), logits, target_id),
                 "tuned_source": None if tuned_lens is None else _lens_source(tuned_lens)},
        "attribution": _attribution(cache, logits, target_id, tokens, model),
        "steering": None if steering is None else _steering(model, tokens, steering, target_id, tuned_lens, layers, heads),
        "sae": None if sae is None else sae(model, cache, target_id, logits),
    }
    return Explorer(data)


# ---- the pieces of the document --------------------------------------------------------------


def _tokens(model, text, prepend_bos):
    if isinstance(text, str):
        return model.to_tokens(text, prepend_bos=prepend_bos)[0]  # [pos]
    tokens, batched = model.check_tokens(text)
    if batched and len(tokens) != 1:
        raise RefGPTError(f"explore: one sequence at a time, found a batch of {len(tokens)}")
    return tokens[0]  # [pos]


def _chosen(chosen, n, what):
    if chosen is None:
        return list(range(n))
    picked = sorted({int(i) for i in chosen})
    if not picked or picked[0] < 0 or picked[-1] >= n:
        raise RefGPTError(f"explore: {what} must be a non-empty list in 0..{n - 1}, found {list(chosen)!r}")
    return picked


def _token_strings(model, ids):
    if model.tokenizer is None:
        return [f"#{int(i)}" for i in ids]
    return model.to_str_tokens(np.asarray(ids, dtype=np.int64), prepend_bos=False)


def _token_table(model, ids) -> dict:
    """{id: its text as _token_strings writes it} for the distinct ids among ``ids``."""
    distinct = np.unique(np.asarray(ids, dtype=np.int64))
    return dict(zip(distinct.tolist(), _token_strings(model, distinct), strict=True))


def pattern_string(pattern) -> str:
    """One head's pattern [query, key] as the page stores it: its weights in whole thousandths, keys 0 …
    query of each query in turn (later keys are masked), each written with PATTERN_DIGITS (below 62)
    or a PATTERN_PREFIXES character and a digit (62 … 1000): one character for most weights of a
    long row, where attention is spread thin. ``decode_pattern`` reads it back."""
    scaled = np.rint(np.asarray(pattern, dtype=np.float64) / PATTERN_UNIT).astype(np.int64)  # [query, key]
    values = scaled[np.tril_indices(len(scaled))]  # [query·(query+1)/2] row by row: keys 0 … query
    if values.size and (values.min() < 0 or values.max() > round(1 / PATTERN_UNIT)):
        raise RefGPTError(f"explore: attention weights must lie in [0, 1], found {values.min()}…{values.max()} thousandths")
    two = values >= len(PATTERN_DIGITS)  # [n] written with two characters
    ends = np.cumsum(1 + two)  # [n] one past each weight's last character
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint8)  # [characters]
    digits = np.frombuffer(PATTERN_DIGITS.encode("ascii"), np.uint8)
    prefixes = np.frombuffer(PATTERN_PREFIXES.encode("ascii"), np.uint8)
    high = np.maximum(values - len(PATTERN_DIGITS), 0)  # [n]
    out[ends - 1] = np.where(two, digits[high % len(PATTERN_DIGITS)], digits[np.minimum(values, len(digits) - 1)])
    out[ends[two] - 2] = prefixes[high[two] // len(PATTERN_DIGITS)]
    return out.tobytes().decode("ascii")


def decode_pattern(text: str, n_pos: int) -> list[list[int]]:
    """``pattern_string``'s rows back: [query][key] whole thousandths, keys 0 … query."""
    digit, prefix = {c: i for i, c in enumerate(PATTERN_DIGITS)}, {c: i for i, c in enumerate(PATTERN_PREFIXES)}
    values, i = [], 0
    while i < len(text):
        if text[i] in prefix:
            values.append(len(PATTERN_DIGITS) * (1 + prefix[text[i]]) + digit[text[i + 1]])
            i += 2
        else:
            values.append(digit[text[i]])
            i += 1
    if len(values) != n_pos * (n_pos + 1) // 2:
        raise RefGPTError(f"a pattern of {n_pos} positions holds {n_pos * (n_pos + 1) // 2} weights, found {len(values)}")
    return [values[q * (q + 1) // 2:(q + 1) * (q + 2) // 2] for q in range(n_pos)]


def _ln_stat(cache, n_layers, hook):
    names = [f"blocks.{L}.{ln}" for L in range(n_layers) for ln in ("ln1", "ln2")] + ["ln_final"]
    return {name: _floats(cache[f"{name}.{hook}"][0, :, 0]) for name in names}  # [pos] each


def _resid_norms(cache, n_layers):
    names = [(f"{L}_{kind}", f"blocks.{L}.hook_resid_{kind}") for L in range(n_layers) for kind in ("pre", "mid")]
    names.append(("final_post", f"blocks.{n_layers - 1}.hook_resid_post"))
    return {"streams": [label for label, _ in names], "values": [_floats(norm(cache[n][0])) for _, n in names]}


def _read_out(model, x):
    """Logits of streams x [..., d_model] read as if final: LN_final recomputed, then W_U (+ b_U)."""
    p = model.params
    logits = ln_views.recomputed(x, p["ln_final.w"], p["ln_final.b"], model.cfg.eps) @ p["unembed.W_U"]  # [..., d_vocab]
    return logits + p["unembed.b_U"] if "unembed.b_U" in p else logits


LENS_BLOCK = 16  # positions read out at a time, every stream at once: [stream·block, d_vocab] (GPT-2: 77 MB)
LENS_TOP = 10  # tokens in a lens cell's hover
LENS_STAT_ROWS = 8  # rows per block of the statistics on the threads (a GPT-2 row is 400 kB: not one at a time)


def _lens(model, x, logits, target_id):
    """Per stream (rows of x [stream, pos, d_model]; the last is the final stream, whose read-out is
    the model's own ``logits`` [pos, d_vocab]) and position: the lens's top token and its
    probability, its LENS_TOP most likely tokens and their probabilities, its entropy, KL(final ‖
    lens) in nats, and the target's rank (1 = top) and probability. Read out LENS_BLOCK positions
    at a time with every stream in one product (a taller product runs nearer the BLAS's peak), the
    statistics a block of rows at a time on the threads, so the memory does not grow with
    d_vocab × positions."""
    S, P = x.shape[:2]
    K = min(LENS_TOP, logits.shape[-1])
    top_id, target_rank = np.zeros((S, P), np.int64), np.zeros((S, P), np.int64)
    top_prob, entropy, kl, target_prob = (np.zeros((S, P)) for _ in range(4))
    top_ids, top_probs = np.zeros((S, P, K), np.int64), np.zeros((S, P, K))
    for start in range(0, P, LENS_BLOCK):
        stop = min(P, start + LENS_BLOCK)
        b = stop - start
        final = log_softmax(logits[start:stop])  # [block, d_vocab]
        p_final = np.exp(final)  # [block, d_vocab]
        read = _read_out(model, x[:-1, start:stop].reshape(-1, x.shape[-1]))  # [(stream − 1)·block, d_vocab]
        log_p = np.concatenate([log_softmax(read), final])  # [stream·block, d_vocab]: the final stream's is the model's
        del read

        def stats(a, z):  # rows a … z of log_p: row r is stream r // b at position start + r % b
            lp, i = log_p[a:z], np.arange(a, z)  # [rows, d_vocab], [rows]
            M, j = i // b, start + i % b  # [rows] stream, position
            p = np.exp(lp)  # [rows, d_vocab]
            best, value = _top_k(lp, K)  # [rows, K] each: the first is argmax's (ties to the lower index)
            target = lp[:, target_id]  # [rows]
            top_ids[M, j], top_probs[M, j] = best, np.exp(value)
            top_id[M, j], top_prob[M, j] = best[:, 0], np.exp(value[:, 0])
            entropy[M, j] = -(p * lp).sum(-1)
            kl[M, j] = np.maximum((p_final[i % b] * (final[i % b] - lp)).sum(-1), 0.0)
            target_rank[M, j] = 1 + np.count_nonzero(lp > target[:, None], axis=-1)
            target_prob[M, j] = np.exp(target)

        row_bytes = log_p.shape[1] * log_p.itemsize
        blocks = threads.row_blocks(len(log_p), row_bytes, LENS_STAT_ROWS * row_bytes)
        threads.map_blocks(stats, blocks, len(log_p) * row_bytes)
    text = _token_table(model, np.concatenate([top_id.ravel(), top_ids.ravel()]))  # id → its text, each id once
    return {"top_id": top_id.tolist(), "top_token": [[text[i] for i in row] for row in top_id.tolist()],
            "top_prob": _floats(top_prob), "entropy": _floats(entropy), "kl": _floats(kl),
            "target_rank": target_rank.tolist(), "target_prob": _floats(target_prob),
            "top10_token": [[[text[i] for i in cell] for cell in row] for row in top_ids.tolist()],
            "top10_prob": _rounded(top_probs, TOP10_DIGITS)}


def _top_k(x, k):
    """(ids, values) of the k largest entries of each row of x [rows, n], largest first, ties to the
    lower index: [rows, k] each. Only the entries at least as large as the k-th largest of every s-th
    entry are sorted: a sample's k-th largest is at most the row's, so none of the k is missed, and
    about s·k entries per row pass it (one comparison per entry instead of a selection over all n). A
    row with NaNs is sorted in full."""
    rows, n = x.shape
    sample = x[:, ::max(1, min(8, n // (4 * k)))]  # [rows, ≥ 4k unless n < 4k]
    bound = np.partition(sample, sample.shape[1] - k, axis=-1)[:, sample.shape[1] - k]  # [rows] ≤ the row's k-th largest
    r, c = np.nonzero(x >= bound[:, None])  # the candidates, row by row
    v = x[r, c]
    if np.bincount(r, minlength=rows).min(initial=k) < k:  # NaN: a bound nothing reaches
        ids = np.argsort(-x, axis=-1, kind="stable")[:, :k]  # [rows, k]
        return ids, np.take_along_axis(x, ids, -1)
    order = np.lexsort((c, -v, r))  # by row, largest first, ties to the lower index
    first = np.searchsorted(r[order], np.arange(rows))[:, None] + np.arange(k)  # [rows, k]
    return c[order][first], v[order][first]


def _kl_map(model, x, reference):
    """KL(lens of x ‖ lens of reference) per stream and position, both [stream, pos, d_model] read
    out as the logit lens reads a stream, LENS_BLOCK positions at a time: [stream][pos] in nats."""
    out = [[] for _ in range(len(x))]
    for start in range(0, x.shape[1], LENS_BLOCK):
        for M in range(len(x)):
            log_p = log_softmax(_read_out(model, x[M, start:start + LENS_BLOCK]))  # [block, d_vocab]
            log_q = log_softmax(_read_out(model, reference[M, start:start + LENS_BLOCK]))  # [block, d_vocab]
            out[M] += _floats(np.maximum((np.exp(log_p) * (log_p - log_q)).sum(-1), 0.0))
    return out


def _tuned_lens(model, lens, tuned, check_unembed_hash):
    """The TunedLens the page shows, or None (see ``explore``)."""
    from .lens import TunedLens

    if tuned is not None:
        if lens is not None:
            raise RefGPTError("explore: give the tuned lens as lens= (tuned= is its old name), not both")
        lens = tuned
    if lens is False:
        return None
    if lens is None:
        if not is_default_model(model.source):
            return None  # no lens is shipped for this model: the page has the logit lens only
        lens = TunedLens.load(model)
    elif isinstance(lens, (str, Path)):
        lens = TunedLens.load(model, lens, check_unembed_hash=check_unembed_hash)
    elif isinstance(lens, dict):
        lens = TunedLens(model, lens)
    elif not isinstance(lens, TunedLens):
        raise RefGPTError(f"explore: lens must be a TunedLens, a lens directory or file, {{layer: (W, b)}}, None "
                          f"or False, found {type(lens).__name__}")
    if lens.model is not model and lens.model.cfg != model.cfg:
        raise RefGPTError(f"explore: the tuned lens was made for another model ({lens.model.cfg}, not {model.cfg})")
    if lens.stream != "resid_pre":
        raise RefGPTError(f"explore: the lens {lens.source or ''} reads {lens.stream}; the page's rows are the streams "
                          "entering each block (resid_pre): use refgpt lens --stream resid_mid for it")
    return lens


def _lens_source(lens) -> str:
    """Where the page's tuned lens came from: "shipped" (the embedded model's own), a path, or "arrays"."""
    from ..files.default_model import default_lens_path

    if lens.source is None:
        return "arrays"
    return "shipped" if Path(lens.source).resolve() == Path(default_lens_path()).resolve() else _source_name(lens.source)


def _source_name(source):
    """A checkpoint's or lens's name without the machine's path (a page is shared; a path says
    whose disk it was built on): "embedded" for the embedded model, a hub cache's repository
    name (models--gpt2 → "gpt2"), else the file's or directory's own name; None for none."""
    if source is None:
        return None
    if is_default_model(source):
        return "embedded"
    path = Path(source)
    hub = [part for part in path.parts if part.startswith("models--")]
    return hub[-1][len("models--"):].replace("--", "/") if hub else path.name


def _translated(x, lens):
    """Each stream but the last moved by its translator (TunedLens.translate: h + h·Wᵀ + b); [stream, pos, d_model]."""
    return np.stack([lens.translate(x[M], M) for M in range(len(x) - 1)] + [x[-1]])


def _attribution(cache, logits, target_id, tokens, model):
    """The target's logit at every position split by head and constant (refgpt.analysis.attribution);
    the actual next token's logit at each position but the last, split by layer; and what each part
    pushes up and down through ln_final's cached σ (``_pushes``)."""
    a = attribute(cache, target_id, granularity="head", logits=logits[None])
    pieces = [naive_attribution(cache, target_id, pos=j, logits=logits[None]) for j in range(len(logits))]
    own = np.array([piece.own_scale for piece in pieces]).T  # [piece, pos], NaN for a constant
    naive = {"labels": pieces[0].labels,  # docs/decomposition.md §1: each piece by its own σ(c), and by the cached σ
             "naive": [_floats(v) for v in np.array([piece.naive for piece in pieces]).T],  # [piece][pos]
             "exact": [_floats(v) for v in np.array([piece.exact for piece in pieces]).T],  # [piece][pos]
             "own_scale": [None if np.isnan(row[0]) else _floats(row) for row in own]}
    out = {"labels": a.labels, "values": [_floats(v[0]) for v in a.values], "logit": _floats(a.logit[0]),
           "naive": naive, "actual": None, "pushes": _pushes(model, cache)}
    if len(tokens) > 1:  # the logit of the token that comes next, at every position that has one
        ids = np.append(tokens[1:], tokens[-1])[None]  # [1, pos]: the last position's entry (no next token) is dropped
        nxt = attribute(cache, ids, granularity="layer", logits=logits[None])
        out["actual"] = {"ids": tokens[1:].tolist(), "labels": nxt.labels,
                         "values": [_floats(v[0, :-1]) for v in nxt.values], "logit": _floats(nxt.logit[0, :-1])}
    return out


def _pushes(model, cache):
    """What each part of the attribution writes, read through ln_final's cached σ as a whole row of
    logits, (w ⊙ (c − mean c)/σ)·W_U for a write c (ln_final.b: b·W_U; b_U: itself), at the last
    positions whose rows fit PUSH_BUDGET (at least the last): for every label of the attribution by
    layer and by head, the PUSH_TOP tokens it raises most and the PUSH_TOP it lowers most, with the
    amounts in logit units (to TOP10_DIGITS digits). The target's entry of a part's row is that
    part's attribution value."""
    p, cfg = model.params, model.cfg
    sigma = cache["ln_final.hook_scale"][0, :, 0]  # [pos]
    n_pos = len(sigma)
    per_pos = 2 + cfg.n_layers * (3 + 2 * cfg.n_heads + 2)  # rows at one position
    n = int(min(n_pos, max(1, PUSH_BUDGET // (per_pos * cfg.d_model * cfg.d_vocab))))
    positions = list(range(n_pos - n, n_pos))
    W_U, w = p["unembed.W_U"], p["ln_final.w"]
    K = min(PUSH_TOP, cfg.d_vocab)
    labels, up_ids, up, down_ids, down = None, [], [], [], []
    for j in positions:
        names, writes = ["embed", "pos_embed"], [cache["hook_embed"][0, j], cache["hook_pos_embed"][0, j]]
        for L in range(cfg.n_layers):
            blk = f"blocks.{L}."
            W_O, b_V = p[blk + "attn.W_O"], value_bias(p, L)  # [head, d_head, d_model], [head, d_head]
            heads = np.einsum("he,hed->hd", cache[blk + "attn.hook_z"][0, j] - b_V, W_O)  # [head, d_model]
            shares = np.einsum("he,hed->hd", b_V, W_O)  # [head, d_model]
            H = range(len(heads))
            names += [f"L{L}.attn", f"L{L}.b_V", f"L{L}.b_O"] + [f"L{L}H{h}" for h in H] + [f"L{L}H{h}.b_V" for h in H]
            writes += [heads.sum(0), shares.sum(0), p[blk + "attn.b_O"], *heads, *shares]
            names += [f"L{L}.mlp", f"L{L}.b_out"]
            writes += [cache[blk + "mlp.hook_post"][0, j] @ p[blk + "mlp.W_out"], p[blk + "mlp.b_out"]]
        c = np.array(writes)  # [part, d_model]
        u = w * (c - c.mean(-1, keepdims=True)) / sigma[j]  # [part, d_model]: each write through the cached σ
        constants = [("ln_final.b", p["ln_final.b"] @ W_U)] + ([("b_U", p["unembed.b_U"])] if "unembed.b_U" in p else [])
        labels = names + [name for name, _ in constants]
        found = [[] for _ in range(4)]  # up ids, up values, down ids, down values: [part, K] blocks
        for start in range(0, len(labels), PUSH_ROWS):  # PUSH_ROWS parts at a time: [rows, d_vocab], not [part, d_vocab]
            rows = u[start:start + PUSH_ROWS] @ W_U  # [rows, d_vocab]
            extra = [row for _, row in constants[max(0, start - len(u)):max(0, start + PUSH_ROWS - len(u))]]
            rows = np.concatenate([rows, np.array(extra).reshape(-1, rows.shape[1])]) if extra else rows
            for sign, (ids_out, values_out) in ((1, found[:2]), (-1, found[2:])):  # the K largest, then the K smallest
                ids, value = _top_k(sign * rows, K)  # [rows, K] each
                ids_out.append(ids), values_out.append(sign * value)
        for out, blocks in zip((up_ids, up, down_ids, down), found, strict=True):
            out.append(np.concatenate(blocks))  # [part, K]
    up_ids, down_ids = np.stack(up_ids, 1), np.stack(down_ids, 1)  # [part, position, K]
    return {"positions": positions, "labels": labels, "up_ids": up_ids.tolist(), "down_ids": down_ids.tolist(),
            "up": _rounded(np.stack(up, 1), TOP10_DIGITS), "down": _rounded(np.stack(down, 1), TOP10_DIGITS),
            "token_strings": {str(k): v for k, v in _token_table(model, np.concatenate([up_ids.ravel(),
                                                                                          down_ids.ravel()])).items()}}


def _steering(model, tokens, steering, target_id, tuned_lens=None, layers=(), heads=()):
    try:
        plus, minus, layer = steering["plus"], steering["minus"], int(steering["layer"])
        coeffs = [float(c) for c in steering.get("coeffs", [1.0])]
    except (KeyError, TypeError, ValueError) as error:
        raise RefGPTError(f"explore: steering needs plus, minus, layer and coeffs ({error})") from None
    if not coeffs or not all(np.isfinite(coeffs)):
        raise RefGPTError(f"explore: steering coeffs must be finite numbers, found {coeffs!r}")
    bos = steering.get("prepend_bos", True)
    positions = steering.get("positions")
    if positions is None:  # ActAdd: its rows at the first positions
        unit = steering_vector(model, plus, minus, layer, 1.0, prepend_bos=bos)
        if len(unit.vector) > len(tokens):
            raise RefGPTError(f"explore: the steering vector has {len(unit.vector)} positions, the text only "
                              f"{len(tokens)}")
        rows, where = unit.vector, np.arange(len(unit.vector))  # [m, d_model], [m]
    else:  # the prompts' last-token difference at the given positions (refgpt steer --positions)
        difference, _, _ = last_token_difference(model, plus, minus, layer, prepend_bos=bos)  # [d_model]
        add_vector(model, tokens, difference, layer, positions=positions)  # checks the positions
        where = np.asarray(positions, dtype=np.int64) % len(tokens)  # [m]
        rows = np.broadcast_to(difference, (len(where), len(difference)))  # [m, d_model]
    layer = layer % model.cfg.n_layers
    moving = norm(rows) > 0  # [m] an ActAdd row of <|endoftext|> in both prompts is exactly zero
    attending = [L for L in layers if L >= layer]  # the page's layers whose attention the vector can move
    p = model.params

    def run(coeff):
        if coeff == 0:
            hooks = []
        elif positions is None:
            hooks = steering_vector(model, plus, minus, layer, coeff, prepend_bos=bos)
        else:
            hooks = add_vector(model, tokens, difference, layer, positions=positions, coeff=coeff)
        logits, cache = model.run_with_cache(tokens[None], fwd_hooks=hooks)
        logits = logits[0]  # [pos, d_vocab]
        x = streams(cache)[:, 0]  # [stream, pos, d_model]
        lens = _lens(model, x, logits, target_id)
        log_p = log_softmax(logits)  # [pos, d_vocab]
        top = np.argsort(-log_p, axis=-1, kind="stable")[:, :TOP_K]  # [pos, k]
        ln1 = f"blocks.{layer}.ln1"  # what block `layer`'s attention reads at the steered positions: γ ⊙ (x − mean)/σ + β
        out = {"coeff": coeff, "logits": logits,
               "ln1_out": cache[f"{ln1}.hook_normalized"][0, where[moving]] * p[f"{ln1}.w"] + p[f"{ln1}.b"],  # [steered, d_model]
               "resid_at_steered": cache[f"blocks.{layer}.hook_resid_pre"][0, where[moving]],  # [steered, d_model]
               "patterns": [cache[f"blocks.{L}.attn.hook_pattern"][0, heads] for L in attending],  # [layer][head, query, key]
               "resid_norm": _resid_norms(cache, model.cfg.n_layers)["values"],
               "lens_top_token": lens["top_token"], "lens_top_prob": lens["top_prob"],
               "next_token": [_token_strings(model, row) for row in top],
               "next_prob": [_floats(np.exp(log_p[i, row])) for i, row in enumerate(top)]}
        if tuned_lens is not None:
            tuned = _lens(model, _translated(x, tuned_lens), logits, target_id)
            out.update({"tuned_top_token": tuned["top_token"], "tuned_top_prob": tuned["top_prob"]})
        return out, cache, x

    clean, clean_cache, _ = run(0.0)
    for key in ("resid_at_steered", "patterns"):  # the clean patterns are the page's own
        clean.pop(key)
    clean["ln1_out"] = [_floats(v) for v in clean["ln1_out"]]
    stream_at_layer = norm(clean_cache[f"blocks.{layer}.hook_resid_pre"][0, where[moving]])  # [steered] unsteered
    runs, xs = [], []
    for c in coeffs:
        r, _, x = run(c)
        r["size_ratio"] = _floats(abs(c) * norm(rows[moving]) / stream_at_layer)  # c·‖Δ‖/‖stream‖, steered positions
        runs.append(r)
        xs.append(x)  # [stream, pos, d_model]: small beside the lens's [pos, d_vocab]
    largest = int(np.argmax(np.abs(coeffs)))
    _what_attention_reads(runs, largest)
    readers = [("logit", lambda x: x)] + ([("tuned", lambda x: _translated(x, tuned_lens))] if tuned_lens is not None else [])
    for kind, read in readers:  # how far each run's lens still is from the largest coefficient's: it fades as C grows
        reference = read(xs[largest])
        for r, x in zip(runs, xs, strict=True):
            r[f"{kind}_kl_to_largest"] = _kl_map(model, read(x), reference)
    final_clean = log_softmax(clean.pop("logits"))
    for r in runs:  # KL(steered ‖ clean) per position, as refgpt steer prints it
        steered = log_softmax(r.pop("logits"))
        r["kl"] = _floats(np.maximum((np.exp(steered) * (steered - final_clean)).sum(-1), 0.0))
    return {"plus": plus if isinstance(plus, str) else list(map(int, plus)),
            "minus": minus if isinstance(minus, str) else list(map(int, minus)),
            "layer": layer, "prepend_bos": bool(bos), "positions": where[moving].tolist(),
            "at_first_positions": positions is None, "pattern_layers": attending, "clean": clean, "runs": runs}


def _what_attention_reads(runs, largest):
    """Each run's ln1 output at the steered positions and its attention, against the largest |C|'s:
    ‖ln1 out(C) − ln1 out(largest)‖ / ‖ln1 out(largest)‖ beside the same for the stream itself, and
    per layer and head the largest total variation ½Σ_k |A_C[q, k] − A_largest[q, k]| over queries q
    (exact, from the unrounded patterns); then the patterns as the page stores them. Only the
    normalised x moves: LN(c·d + x) → LN(d) as c grows (docs/steering.md)."""
    ref = runs[largest]
    for r in runs:
        r["ln1_change"] = _floats(norm(r["ln1_out"] - ref["ln1_out"]) / norm(ref["ln1_out"]))  # [steered]
        r["resid_change"] = _floats(norm(r["resid_at_steered"] - ref["resid_at_steered"]) / norm(ref["resid_at_steered"]))
        r["pattern_tv"] = [_floats(0.5 * np.abs(a - b).sum(-1).max(-1)) for a, b in zip(r["patterns"], ref["patterns"],
                                                                                       strict=True)]  # [layer][head]
    for r in runs:
        r["ln1_out"] = [_floats(v) for v in r["ln1_out"]]  # [steered][d_model]
        r["pattern"] = [[pattern_string(a) for a in heads] for heads in r.pop("patterns")]  # [layer][head] str
        r.pop("resid_at_steered")


def _floats(array) -> list:
    """float64 values as a list (JSON writes each in its shortest round-trip form)."""
    return np.asarray(array, dtype=np.float64).tolist()


def _rounded(array, digits: int) -> list:
    """float64 values rounded to ``digits`` significant digits, as a (nested) list: for numbers the
    page only shows, to that many digits (a shorter document)."""
    flat = [float(f"{v:.{digits}g}") for v in np.asarray(array, dtype=np.float64).ravel().tolist()]
    return np.array(flat).reshape(np.shape(array)).tolist()


# ---- the page ------------------------------------------------------------------------------------


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("explorer_page", name).read_text(encoding="utf-8")


def render(data: dict) -> str:
    """The self-contained page for a data document: template, styles, script and data inline."""
    document = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    document = document.replace("<", "\\u003c")  # no "</script>" or "<!--" can end or bend the data block
    title = html.escape(data["text"] if data.get("text") else " ".join(data["tokens"][:12]))
    parts = {"title": title, "style": _asset("explorer.css"), "data": document, "script": _asset("explorer.js")}
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("page.html"))
