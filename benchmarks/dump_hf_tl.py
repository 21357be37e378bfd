"""Dump a PyTorch GPT-2's activations into a candidate file for ``refgpt compare``.

    python benchmarks/dump_hf_tl.py --hf DIR --tokens ids.txt -o hf.safetensors [--dtype float32]
    refgpt compare golden.safetensors hf.safetensors --map hf

    python benchmarks/dump_hf_tl.py --hf DIR --tl --tokens ids.txt -o tl.safetensors
    refgpt compare golden.safetensors tl.safetensors --map tl

    python benchmarks/dump_hf_tl.py --hf DIR --text "The quick brown fox" --generate 8 -o hf_decode.safetensors
    refgpt compare decode.safetensors hf_decode.safetensors --map hf

``hf_generate_candidate`` runs HF's greedy ``generate`` with ``output_hidden_states``,
``output_attentions``, ``output_logits`` and ``return_dict_in_generate`` and keeps, flattened,
``sequences``, ``hidden_states.S.i``, ``attentions.S.i``, ``logits.S`` for every step S and the
final ``past_key_values.L.key`` / ``.value`` (docs/oracle.md, decode goldens; rows of different
lengths in ``prompt.txt`` are left-padded, as ``refgpt golden --generate`` pads them).

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


def hf_generate_candidate(model, prompt, steps, attention_mask=None) -> dict[str, np.ndarray]:
    """HF's greedy ``generate`` of ``steps`` tokens after ``prompt`` [batch, P], flattened under the
    names refgpt's hf decode map reads (refgpt/oracle/name_maps.py, ``decode_to_refgpt``)."""
    import torch

    ids = torch.as_tensor(np.atleast_2d(prompt), dtype=torch.long)  # [batch, P]
    # an explicit mask: without one HF infers it from pad_token_id, masking every real token of that id
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask, dtype=torch.long)
    config = model.generation_config
    eos, config.eos_token_id = config.eos_token_id, None  # exactly ``steps`` tokens, as refgpt golden --generate: no stop
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                                 output_hidden_states=True, output_attentions=True, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
    finally:
        config.eos_token_id = eos
    tensors = {"sequences": _np(out.sequences)}  # [batch, P + steps]
    for S in range(len(out.hidden_states)):
        tensors.update({f"hidden_states.{S}.{i}": _np(h) for i, h in enumerate(out.hidden_states[S])})
        tensors.update({f"attentions.{S}.{i}": _np(a) for i, a in enumerate(out.attentions[S])})
        tensors[f"logits.{S}"] = _np(out.logits[S])  # [batch, d_vocab]
    for L, layer in enumerate(out.past_key_values.layers):  # [batch, head, pos, d_head] after the last step
        tensors[f"past_key_values.{L}.key"], tensors[f"past_key_values.{L}.value"] = _np(layer.keys), _np(layer.values)
    return tensors


def main(argv=None) -> int:
    import torch
    from safetensors.numpy import save_file
    from transformers import GPT2LMHeadModel

    from refgpt.oracle.token_files import read_tokens

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf", metavar="DIR", required=True, help="HF GPT-2 directory (or hub name, if you are online)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokens", metavar="FILE", help="token ids, as `refgpt golden --tokens` reads them")
    source.add_argument("--text", help="text, tokenized as `refgpt golden TEXT` tokenizes it (the --hf directory's "
                        "vocab.json and merges.txt, no <|endoftext|> first)")
    p.add_argument("-o", "--output", required=True, help="candidate .safetensors to write")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--tl", action="store_true", help="run TransformerLens (no weight processing) instead of HF")
    p.add_argument("--generate", type=int, metavar="N", help="HF's greedy generate of N tokens after the tokens: "
                   "every step's hidden states, attentions and logits, and the KV cache")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    hf = GPT2LMHeadModel.from_pretrained(args.hf, attn_implementation="eager", torch_dtype=dtype).eval()
    if args.text is not None:
        import refgpt

        tokens = refgpt.load(args.hf).to_tokens(args.text, prepend_bos=False)[0]  # [pos]
    else:
        tokens = read_tokens(args.tokens, ragged=args.generate is not None)[0]
    if args.generate:
        from refgpt.gpt2.padding import pad_rows

        prompt, mask = pad_rows(tokens, "left", int(hf.config.eos_token_id or 0))
        tensors = hf_generate_candidate(hf, prompt, args.generate, mask)
    elif args.tl:
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
