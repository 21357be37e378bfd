"""Dump a PyTorch GPT-2's activations into a candidate file for ``refgpt compare``.

    python benchmarks/dump_hf_tl.py --hf DIR --tokens ids.txt -o hf.safetensors [--dtype float32]
    refgpt compare golden.safetensors hf.safetensors --map hf

    python benchmarks/dump_hf_tl.py --hf DIR --tl --tokens ids.txt -o tl.safetensors
    refgpt compare golden.safetensors tl.safetensors --map tl

``hf_candidate`` runs Hugging Face's GPT2LMHeadModel with ``output_hidden_states`` and
``output_attentions`` and keeps ``logits``, ``hidden_states.i`` (i = 0..n_layers: the residual
stream entering block i; the last one is after ln_f) and ``attentions.i`` (block i's pattern;
needs the eager attention implementation). ``tl_candidate`` keeps every entry of a
TransformerLens ``run_with_cache`` and the logits. A TransformerLens model must be loaded
*without* weight processing (``HookedTransformer.from_pretrained_no_processing``): fold_ln and
center_writing_weights change what the hooks see (a centred residual stream, LayerNorms without
gain and bias), though not the logits. center_unembed shifts each position's logits by a
constant, which the oracle ignores (it compares logits by their log-softmax).

Needs torch and transformers (and transformer_lens for --tl); refgpt itself never imports them.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def hf_candidate(model, tokens) -> dict[str, np.ndarray]:
    """HF GPT2LMHeadModel's logits, hidden_states.i and attentions.i on ``tokens`` [batch, pos]."""
    import torch

    ids = torch.as_tensor(np.atleast_2d(tokens), dtype=torch.long)  # [batch, pos]
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True, use_cache=False)
    tensors = {"tokens": _np(ids), "logits": _np(out.logits)}  # [batch, pos, d_vocab]
    for i, h in enumerate(out.hidden_states):  # n_layers + 1 entries, each [batch, pos, d_model]
        tensors[f"hidden_states.{i}"] = _np(h)
    for i, a in enumerate(out.attentions or ()):  # [batch, head, pos, key_pos]
        if a is not None:
            tensors[f"attentions.{i}"] = _np(a)
    return tensors


def tl_candidate(model, tokens) -> dict[str, np.ndarray]:
    """A HookedTransformer's full activation cache and logits on ``tokens`` [batch, pos]."""
    import torch

    ids = torch.as_tensor(np.atleast_2d(tokens), dtype=torch.long)  # [batch, pos]
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
    tensors = {name: _np(value) for name, value in cache.items()}
    tensors["tokens"] = _np(ids)
    tensors["logits"] = _np(logits)  # [batch, pos, d_vocab]
    return tensors


def main(argv=None) -> int:
    import torch
    from safetensors.numpy import save_file
    from transformers import GPT2LMHeadModel

    from refgpt.cli.golden import read_tokens

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf", metavar="DIR", required=True, help="HF GPT-2 directory (or hub name, if you are online)")
    p.add_argument("--tokens", metavar="FILE", required=True, help="token ids, as `refgpt golden --tokens` reads them")
    p.add_argument("-o", "--output", required=True, help="candidate .safetensors to write")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--tl", action="store_true", help="run TransformerLens (no weight processing) instead of HF")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    hf = GPT2LMHeadModel.from_pretrained(args.hf, attn_implementation="eager", torch_dtype=dtype).eval()
    tokens = read_tokens(args.tokens)
    if args.tl:
        from transformer_lens import HookedTransformer

        tl = HookedTransformer.from_pretrained_no_processing("gpt2", hf_model=hf, dtype=dtype, device="cpu")
        tensors = tl_candidate(tl, tokens)
    else:
        tensors = hf_candidate(hf, tokens)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, args.output)
    print(f"wrote {args.output}: {len(tensors)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
