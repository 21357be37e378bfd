"""The runtime tests' shared models and graphs: made once per session (torch.onnx takes tens of seconds)."""

from __future__ import annotations

import pytest

_ONNX_EXTRA = "the onnx extra (onnx, onnxscript, onnxruntime) is not installed"


def _exporting():
    pytest.importorskip("onnxruntime", reason=_ONNX_EXTRA)
    pytest.importorskip("onnxscript", reason=_ONNX_EXTRA)
    pytest.importorskip("transformers", reason="exporting needs transformers (the peers extra)")


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    """(golden file, .onnx) of a 4-layer random GPT-2 on 2 × 16 tokens."""
    _exporting()
    from onnx_graphs import SMALL, SMALL_POS, exported

    return exported(tmp_path_factory, SMALL, "small", 0.3, SMALL_POS)


@pytest.fixture(scope="session")
def gpt2_small_saved(tmp_path_factory):
    """(golden file, the directory refgpt.save wrote) of a random GPT-2 of GPT-2 small's shape on 2 × 4
    tokens: GPT-2's own initialisation scale (0.02), LayerNorm gains 1 + N(0, 0.02²), biases N(0, 0.02²)
    (HF's initialisation would leave them 1 and 0)."""
    from random_models import GPT2_SMALL, saved

    return saved(tmp_path_factory, GPT2_SMALL, "gpt2_small", 0.02, 4)


@pytest.fixture(scope="session")
def gpt2_small(gpt2_small_saved):
    """(golden file, .onnx): torch.onnx's export of ``gpt2_small_saved``."""
    _exporting()
    from refgpt.runtimes import onnx_model

    golden_path, directory = gpt2_small_saved
    return golden_path, onnx_model.export(directory, directory.parent / "model.onnx")
