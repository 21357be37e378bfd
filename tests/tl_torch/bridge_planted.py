"""A bug planted in TransformerLens 4's own hook map, run as the bridge runs (in a process importing
TL 4, tl4.py):

    python bridge_planted.py HF_DIR TOKENS.npy OUT.npz LAYER

Block LAYER's compatibility alias ``hook_attn_out`` is pointed at ``ln2.hook_in``, the residual
stream after the attention output is added (TransformerLens #1639: ``hook_attn_out`` holding
residual-added states); the bridge is then run and its cache saved as refgpt.runtimes.tl_bridge
saves it."""

from __future__ import annotations

import sys
import warnings

import numpy as np

from refgpt.runtimes import tl_bridge


def main(directory, tokens, out, layer):
    warnings.filterwarnings("ignore")
    bridge = tl_bridge.boot(directory)
    block = bridge.blocks[int(layer)]
    block.hook_aliases = {**block.hook_aliases, "hook_attn_out": "ln2.hook_in"}
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)  # registers the aliases again
    np.savez(out, **tl_bridge.cache_of(bridge, np.load(tokens)))


if __name__ == "__main__":
    main(*sys.argv[1:])
