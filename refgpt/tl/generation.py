"""Generating text: one token at a time, each step a forward pass over the new token only.

    logits of the last position → penalise repeats → divide by temperature → keep the top k
    → keep the top p of the probability → softmax → sample (or the arg-max, greedy)

The prompt goes through the model once, filling a KVCache; every later step feeds only the token
just chosen, with the cache supplying the earlier keys and values (``use_past_kv_cache=False``
recomputes the whole sequence each step: the same tokens, a check of the cache). Greedy
(``do_sample=False``, or temperature 0) takes the arg-max, ties to the lowest id. Sampling uses
``numpy.random.default_rng(seed)``, so the same seed gives the same text — not the same text as
torch's sampler in TransformerLens, whose random numbers differ.

The keywords are TransformerLens's ``generate``: a list of texts is left-padded (padding.py), so
every row's next token follows its own last real token; with ``stop_at_eos`` a row that has
produced ``eos_token_id`` gets only that id after it (for a list of ids: the tokenizer's EOS, as
TransformerLens), and generation ends once every row has. ``return_type="input"`` returns what
came in: text for text, tokens for tokens.

Hooks active around ``generate`` (``with model.hooks(...)`` or ``with intervention:``) apply to
every step. A hook reads which absolute positions each step computes from ``hook.start``
(refgpt/tl/hooks.py), so an edit of the prompt's positions — an ActAdd steering vector — is made
once, in the prompt's pass, and every generated token sees it through the KV cache.
"""

from __future__ import annotations

import numpy as np

from . import inputs
from ..gpt2.activations import softmax
from ..errors import RefGPTError, real_number, whole_number
from ..gpt2.padding import attention_mask_from_tokens


def generate(model, input="", max_new_tokens: int = 10, stop_at_eos: bool = True, eos_token_id=None,
             do_sample: bool = True, top_k=None, top_p=None, temperature: float = 1.0, freq_penalty: float = 0.0,
             use_past_kv_cache: bool = True, prepend_bos=None, padding_side=None, return_type="input",
             verbose: bool = True, seed=None):
    """``input`` (text, a list of texts, or tokens [pos] / [batch, pos]) followed by up to
    ``max_new_tokens`` new tokens. ``verbose`` is accepted; refgpt shows no progress bar."""
    side = inputs.resolve_padding_side(model, padding_side)
    text_in = inputs.is_text(input)
    if text_in:
        if isinstance(input, (list, tuple)) and len(input) > 1:
            side = "left"  # as TransformerLens: a batch of texts is left-padded, whatever padding_side says
        input = model.to_tokens(input, prepend_bos=prepend_bos, padding_side=side)
    tokens, batched = model.check_tokens(input)
    if return_type not in ("input", "str", "tokens"):
        raise RefGPTError(f"generate: return_type must be 'input', 'str' or 'tokens', found {return_type!r}")
    max_new_tokens = whole_number(max_new_tokens, "generate: max_new_tokens", least=0)  # a Python int: no overflow
    if tokens.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise RefGPTError(f"generate: {tokens.shape[1]} prompt tokens + {max_new_tokens} new exceed "
                          f"n_positions={model.cfg.n_ctx}")
    temperature = real_number(temperature, "generate: temperature", least=0)
    top_k = None if top_k is None else whole_number(top_k, "generate: top_k", least=1)
    if top_p is not None and not 0 < real_number(top_p, "generate: top_p") <= 1:
        raise RefGPTError(f"generate: top_p must be in (0, 1], found {top_p!r}")
    freq_penalty = real_number(freq_penalty, "generate: freq_penalty")
    seed = None if seed is None else whole_number(seed, "generate: seed", least=0)
    stop_tokens, filler = _stop_tokens(model, stop_at_eos, eos_token_id)

    mask = None  # TransformerLens's initial attention mask: the pads of a batch, on its padding side
    if model.tokenizer is not None and model.tokenizer.pad_token_id is not None and (side == "left" or len(tokens) > 1):
        mask = attention_mask_from_tokens(tokens, model.tokenizer.pad_token_id,
                                          inputs.resolve_prepend_bos(model, prepend_bos), side)  # [batch, pos]
    rng = np.random.default_rng(seed)
    past = model.kv_cache(tokens.shape[0]) if use_past_kv_cache else None
    finished = np.zeros(tokens.shape[0], dtype=bool)  # [batch]
    out, step, step_mask = tokens, tokens, mask
    for _ in range(max_new_tokens):
        if past is None:
            step, step_mask = out, (None if mask is None else np.pad(mask, ((0, 0), (0, out.shape[1] - mask.shape[1])), constant_values=1))
        logits = model(step, past=past, attention_mask=step_mask, last_only=True)[:, -1]  # [batch, d_vocab]
        greedy = not do_sample or temperature == 0
        chosen = choose(logits, 0 if greedy else temperature, top_k, rng, top_p, freq_penalty, out)  # [batch]
        if stop_tokens:
            chosen[finished] = filler
            finished |= np.isin(chosen, stop_tokens)
        step, step_mask = chosen[:, None], np.ones_like(chosen[:, None])  # [batch, 1], a new token is never a pad
        out = np.concatenate([out, step], axis=1)  # [batch, pos + 1]
        if stop_tokens and finished.all():
            break
    if text_in and return_type in ("input", "str") or return_type == "str":
        texts = [model.tokenizer.decode([int(t) for t in row if int(t) not in model.tokenizer.special_tokens.values()])
                 for row in out]
        return texts[0] if len(texts) == 1 else texts
    return out if batched else out[0]


def _stop_tokens(model, stop_at_eos, eos_token_id) -> tuple[list[int], int | None]:
    """(the ids that end a row, the id a finished row gets from then on), as TransformerLens: the
    one ``eos_token_id``; for a list of them the tokenizer's EOS if it has one, else the first."""
    if not stop_at_eos:
        return [], None
    tokenizer_eos = model.tokenizer.eos_token_id if model.tokenizer is not None else None
    if eos_token_id is None:
        eos_token_id = tokenizer_eos
        if eos_token_id is None:
            raise RefGPTError("generate: stop_at_eos=True needs eos_token_id= (this model has no tokenizer "
                              "with <|endoftext|>), or pass stop_at_eos=False")
    one = isinstance(eos_token_id, (int, np.integer))
    ids = [int(eos_token_id)] if one else [int(i) for i in eos_token_id]
    if not ids or not all(0 <= i < model.cfg.d_vocab for i in ids):
        raise RefGPTError(f"generate: eos_token_id must be ids in [0, {model.cfg.d_vocab}), found {eos_token_id!r}")
    return ids, (ids[0] if one or tokenizer_eos is None else tokenizer_eos)


def choose(logits, temperature, top_k, rng, top_p=None, freq_penalty=0.0, previous=None):
    """One token per row of logits [batch, d_vocab], as TransformerLens's ``sample_logits``:
    greedy at temperature 0; otherwise logits / temperature − freq_penalty · (count of each token
    in ``previous`` [batch, pos]), the top k, the smallest set with probability ≥ top_p, sampled."""
    if temperature == 0:
        return logits.argmax(-1)  # [batch]
    with np.errstate(over="ignore"):
        scaled = logits.astype(np.float64) / temperature  # [batch, d_vocab]
    if not np.isfinite(scaled).all():
        raise RefGPTError(f"generate: temperature {temperature!r} is so small that logits / temperature "
                          "overflows float64; use temperature 0 for greedy decoding")
    if freq_penalty and previous is not None:
        counts = np.stack([np.bincount(row, minlength=scaled.shape[-1]) for row in previous])  # [batch, d_vocab]
        scaled = scaled - freq_penalty * counts
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = np.sort(scaled, axis=-1)[:, -top_k][:, None]  # [batch, 1] the k-th largest
        scaled = np.where(scaled >= kth, scaled, -np.inf)  # [batch, d_vocab]
    probs = softmax(scaled, in_place=True)  # [batch, d_vocab]
    if top_p is not None and top_p < 1:
        order = np.argsort(-probs, axis=-1, kind="stable")  # [batch, d_vocab] most likely first
        sorted_p = np.take_along_axis(probs, order, -1)  # [batch, d_vocab]
        before = np.cumsum(sorted_p, -1) - sorted_p  # [batch, d_vocab] mass of the more likely ones
        drop = np.zeros_like(probs, dtype=bool)
        np.put_along_axis(drop, order, before >= top_p, -1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs])  # [batch]
