"""SAELens, the judge of refgpt's SAE support: random SAEs of every architecture, made and saved by
SAELens itself (tests/sae/)."""

from __future__ import annotations

import numpy as np

#: architecture → (SAELens SAE class name, config class name)
CLASSES = {
    "standard": ("StandardSAE", "StandardSAEConfig"), "topk": ("TopKSAE", "TopKSAEConfig"),
    "jumprelu": ("JumpReLUSAE", "JumpReLUSAEConfig"), "gated": ("GatedSAE", "GatedSAEConfig"),
    "transcoder": ("Transcoder", "TranscoderConfig"), "skip_transcoder": ("SkipTranscoder", "SkipTranscoderConfig"),
    "jumprelu_transcoder": ("JumpReLUTranscoder", "JumpReLUTranscoderConfig"),
    "jumprelu_skip_transcoder": ("JumpReLUSkipTranscoder", "JumpReLUSkipTranscoderConfig"),
}
ARCHITECTURES = tuple(CLASSES)


def require_sae_lens():
    import pytest

    sae_lens = pytest.importorskip("sae_lens", reason="SAE peer tests need sae-lens (the peers extra)")
    import torch

    torch.set_num_threads(1)
    return sae_lens


def sae_lens_sae(architecture, d_in, d_sae, seed, hook_name="blocks.1.hook_resid_pre", d_out=None, dtype="float64",
                 **cfg):
    """A SAELens SAE with every weight drawn N(0, 0.3²) (thresholds > 0), in ``dtype``."""
    import torch
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata

    sae_class, cfg_class = (getattr(sae_lens, name) for name in CLASSES[architecture])
    metadata = {"hook_name": hook_name, "model_name": "random"}
    if "transcoder" in architecture:
        cfg.setdefault("apply_b_dec_to_input", False)
        cfg["d_out"] = d_out or d_in
        metadata["hook_name_out"] = cfg.pop("hook_name_out", hook_name)
    config = cfg_class(d_in=d_in, d_sae=d_sae, dtype=dtype, metadata=SAEMetadata(**metadata), **cfg)
    sae = sae_class(config)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            values = 0.3 * rng.standard_normal(tuple(p.shape))
            if name == "threshold":
                values = np.abs(values) * 0.5
            p.copy_(torch.tensor(values, dtype=p.dtype))
    return sae


def run(sae, x):
    """SAELens's encode and forward on x (a NumPy array), as NumPy (a skip transcoder's forward adds
    x·W_skipᵀ to its decode)."""
    import torch

    with torch.no_grad():
        t = torch.tensor(x, dtype=sae.dtype)
        f = sae.encode(t)
        return f.numpy(), sae(t).numpy()
