"""Loading the torch-facing model as TransformerLens users do.

    HookedTransformer.from_pretrained("gpt2")                      TransformerLens 3's way
    HookedTransformer.from_pretrained("path/to/dir", fold_ln=False, center_writing_weights=False)
    bridge = TransformerBridge.boot_transformers("gpt2")           TransformerLens 4's way
    bridge.enable_compatibility_mode()                             (refgpt/tl_torch/bridge.py)

A name is found as refgpt finds it (refgpt.load: a directory with config.json + model.safetensors,
or a hub name in the HF cache, downloaded into it unless HF_HUB_OFFLINE=1). The processing
keywords are TransformerLens's, with its defaults (``fold_ln``, ``center_writing_weights``,
``center_unembed``, ``fold_value_biases`` on; ``refactor_factored_attn_matrices`` off), computed
by refgpt.tl.processing in the model's dtype — float64 unless ``dtype`` says float32 (TransformerLens
defaults to float32 and rounds float64 weights to float32 while processing; refgpt does not). The
refactor's SVD is torch's, so its signs are TransformerLens's.
"""

from __future__ import annotations

import torch

from ..errors import RefGPTError
from ..files.checkpoint import load
from ..tl import processing
from .circuits import TorchLapack
from .config import TLConfig

_DTYPES = {torch.float64: "float64", torch.float32: "float32", "float64": "float64", "float32": "float32",
           "torch.float64": "float64", "torch.float32": "float32"}
_PROCESSING = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases",
               "refactor_factored_attn_matrices")


def _dtype(dtype, what) -> str:
    if dtype not in _DTYPES:
        raise RefGPTError(f"{what}: refgpt computes in float64 or float32, found dtype={dtype!r}")
    return _DTYPES[dtype]


def _check_device(device, what):
    if device is not None and torch.device(device).type != "cpu":
        raise RefGPTError(f"{what}: refgpt computes on the CPU, not device={device!r}")


def pretrained(model_name, fold_ln=True, center_writing_weights=True, center_unembed=True,
               refactor_factored_attn_matrices=False, checkpoint_index=None, checkpoint_value=None,
               hf_model=None, device=None, n_devices=1, tokenizer=None, move_to_device=True,
               fold_value_biases=True, default_prepend_bos=None, default_padding_side="right",
               dtype="float64", first_n_layers=None, **from_pretrained_kwargs):
    """The refgpt Model ``HookedTransformer.from_pretrained`` wraps: TransformerLens's keywords and
    processing defaults for a GPT-2 (``dtype`` float64 by default). Keywords for other
    architectures or training checkpoints (``checkpoint_index`` …, ``hf_model``,
    ``first_n_layers``) are refused."""
    for name, value in (("checkpoint_index", checkpoint_index), ("checkpoint_value", checkpoint_value),
                        ("hf_model", hf_model), ("tokenizer", tokenizer), ("first_n_layers", first_n_layers)):
        if value is not None:
            raise RefGPTError(f"from_pretrained: {name}= is not supported (refgpt loads GPT-2 checkpoints "
                              "from a directory or the HF cache)")
    if n_devices != 1:
        raise RefGPTError(f"from_pretrained: n_devices={n_devices!r}: refgpt computes on one CPU")
    unknown = set(from_pretrained_kwargs) - {"trust_remote_code", "revision"}
    if unknown:
        raise RefGPTError(f"from_pretrained: unknown keyword(s) {sorted(unknown)}")
    _check_device(device, "from_pretrained")
    revision = from_pretrained_kwargs.get("revision")
    model = load(f"{model_name}@{revision}" if revision else model_name, dtype=_dtype(dtype, "from_pretrained"))
    flags = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                 fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=refactor_factored_attn_matrices)
    steps = [name for name in _PROCESSING if flags[name]]
    if steps:
        model = processing.process(model, steps, factored=TorchLapack)
    if fold_ln:
        model.cfg = TLConfig.of(model.cfg, torch.float64)  # (its dtype is set again by the torch model)
        model.cfg.mark_ln_folded()
    if default_prepend_bos is not None:
        model.cfg.default_prepend_bos = bool(default_prepend_bos)
    if model.tokenizer is not None:
        model.tokenizer.padding_side = default_padding_side
    return model


