"""tests/tl_torch/ tests refgpt's torch-facing model (refgpt/tl_torch/) against TransformerLens: they
need the ``peers`` extra (torch, transformers, transformer-lens). Without it they are not collected
(the vendored TransformerLens tests import torch at module level; the others skip by themselves)."""

import importlib.util

_PEERS = ("torch", "transformers", "transformer_lens")
collect_ignore_glob = [] if all(importlib.util.find_spec(m) for m in _PEERS) else ["*.py", "*/*.py"]
