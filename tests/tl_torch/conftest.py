"""tests/tl_torch/ tests refgpt's torch-facing model (refgpt/tl_torch/) against TransformerLens: they
need the ``peers`` extra (torch, transformers, transformer-lens). Without it they are not collected
(the vendored TransformerLens tests import torch at module level; the others skip by themselves)."""

import importlib.util

_PEERS = ("torch", "transformers", "transformer_lens")
collect_ignore_glob = [] if all(importlib.util.find_spec(m) for m in _PEERS) else ["*.py", "*/*.py"]


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tl4_dir():
    """The directory holding TransformerLens 4 beside 3.9 (tl4.py makes it once), or a skip saying why not."""
    import tl4

    found, why = tl4.overlay()
    if found is None:
        pytest.skip(why)
    return found
