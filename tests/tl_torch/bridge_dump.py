"""Run TransformerLens 4's TransformerBridge as a TL 4 user does and save everything it caches:

    python bridge_dump.py CHECKPOINT_DIR TOKENS.npy OUT.npz [--dtype float32|float64]

``boot_transformers(CHECKPOINT_DIR)`` then ``enable_compatibility_mode()`` (TL 4's own processing,
in the bridge's dtype: float32 by default, as TL 4 gives it), ``run_with_cache(tokens)``: every
cached activation by its hook name, and the logits. Run with TransformerLens 4 first on the path
(tests/tl_torch/tl4.py); tests/tl_torch/test_bridge_peer.py compares the file with refgpt.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    directory, tokens_path, out = argv[:3]
    dtype_name = argv[argv.index("--dtype") + 1] if "--dtype" in argv else "float32"
    warnings.filterwarnings("ignore")
    import torch
    import transformer_lens
    from transformer_lens.model_bridge import TransformerBridge

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    bridge = TransformerBridge.boot_transformers(directory, dtype=getattr(torch, dtype_name), device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True)
    tokens = torch.from_numpy(np.load(tokens_path))
    logits, cache = bridge.run_with_cache(tokens)
    arrays = {name: value.detach().numpy() for name, value in cache.items()}
    np.savez(out, __logits__=logits.numpy(), __version__=np.array(transformer_lens.__version__ if hasattr(
        transformer_lens, "__version__") else "4"), **arrays)


if __name__ == "__main__":
    main()
