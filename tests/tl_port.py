"""Shared harness for the ported TransformerLens tests (tests/core/test_tl_ported_*.py).

TransformerLens's own tests run on pretrained checkpoints (gpt2-small, solu-1l); with no network,
the ported tests run the same bodies on one random float64 GPT-2 with the **real GPT-2 tokenizer**
(/work/shared/gpt2 or $REFGPT_GPT2_TOKENIZER: vocab.json + merges.txt, so d_vocab = 50257), built
twice from one HF checkpoint: refgpt loads the directory, TransformerLens 3.9 is built offline by
tests/peers.py and given the HF tokenizer (``set_tokenizer``, ``default_prepend_bos=True``, as
``from_pretrained("gpt2")`` sets it). Each ported body runs on both and the numbers are compared.

The pair is built once per session (tests/conftest.py's ``tl_pair`` fixture: one 50,257-token
model pair for all four files) and ``reset`` to ``from_pretrained("gpt2")``'s state around each test.

Import only after ``peers.require_peers()``.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np

import peers as P

TOKENIZER_DIR = Path(os.environ.get("REFGPT_GPT2_TOKENIZER", "/work/shared/gpt2"))


def tokenizer_files_or_skip():
    import pytest

    if not (TOKENIZER_DIR / "vocab.json").is_file() or not (TOKENIZER_DIR / "merges.txt").is_file():
        pytest.skip(f"ported TransformerLens tests need GPT-2's vocab.json + merges.txt in {TOKENIZER_DIR} "
                    "(set REFGPT_GPT2_TOKENIZER)")


def gpt2_checkpoint(directory, seed=0, n_layers=2, n_embd=16, n_head=2, n_positions=64):
    """A random float64 GPT-2 with d_vocab 50257 in the HF layout, GPT-2's tokenizer files beside it,
    every parameter and LayerNorm perturbed (peers.random_hf_model): (directory, the HF model)."""
    tokenizer_files_or_skip()
    cfg = P.random_hf_config(seed, vocab_size=50257, n_layer=n_layers, n_embd=n_embd, n_head=n_head,
                             n_positions=n_positions, n_inner=None, activation_function="gelu_new",
                             layer_norm_epsilon=1e-5, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                             reorder_and_upcast_attn=False, tie_word_embeddings=True, bos_token_id=50256,
                             eos_token_id=50256)
    hf = P.random_hf_model(cfg, seed)
    directory = Path(directory)
    P.save_hf_layout(hf, directory)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(TOKENIZER_DIR / name, directory / name)
    return directory, hf


def gpt2_pair(directory, seed=0, n_layers=2, n_embd=16, n_head=2, n_positions=64):
    """(refgpt Model, TransformerLens HookedTransformer): the same random float64 GPT-2 with d_vocab 50257
    and GPT-2's tokenizer (``gpt2_checkpoint``)."""
    import refgpt
    from transformers import GPT2TokenizerFast

    directory, hf = gpt2_checkpoint(directory, seed, n_layers, n_embd, n_head, n_positions)
    tl = P.tl_model_from_hf(hf, "float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl.set_tokenizer(GPT2TokenizerFast.from_pretrained(str(directory)))
    tl.cfg.default_prepend_bos = True
    return refgpt.load(directory), tl


#: TransformerLens's switches for optional hook points; off in ``from_pretrained("gpt2")``.
SWITCHES = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in", "use_hook_tokens")


def reset(pair):
    """The models back to ``from_pretrained("gpt2")``'s state: BOS prepended, right padding, no
    hooks (permanent ones included), no contexts, every optional hook point off."""
    for model in pair:
        model.reset_hooks(including_permanent=True)
        model.cfg.default_prepend_bos = True
        model.tokenizer.padding_side = "right"
        for switch in SWITCHES:
            setattr(model.cfg, switch, False)
        if hasattr(model.cfg, "use_hook_mean"):
            model.cfg.use_hook_mean = False
    return pair


def is_numpy(model) -> bool:
    """Is this refgpt's NumPy model (the departures of docs/transformerlens.md §2 apply), rather than
    its torch-facing model or TransformerLens (TransformerLens's bodies as written)?"""
    import refgpt

    return isinstance(model, refgpt.Model)


def torch_model(refgpt_model):
    """refgpt's torch-facing HookedTransformer over ``refgpt_model`` (refgpt/tl_torch/), as
    ``HookedTransformer.from_pretrained_no_processing`` would load the same checkpoint."""
    from refgpt.tl_torch import HookedTransformer

    return HookedTransformer(refgpt_model)


def N(x) -> np.ndarray:
    """A torch tensor or array → numpy (float64 stays float64)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def close(a, b, tol=P.TL_TOL) -> bool:
    """rel_err(a, b) ≤ tol, shapes equal (peers.rel_err)."""
    return P.rel_err(N(a), N(b)) <= tol
