"""The runtime tests' shared graphs: exported once per session (torch.onnx takes tens of seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    """(golden file, .onnx) of a 4-layer random GPT-2 on 2 × 16 tokens."""
    pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
    pytest.importorskip("onnxscript", reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
    pytest.importorskip("transformers", reason="exporting needs transformers (the peers extra)")
    from onnx_graphs import SMALL, SMALL_POS, exported

    return exported(tmp_path_factory, SMALL, "small", 0.3, SMALL_POS)
