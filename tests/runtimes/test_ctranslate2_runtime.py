"""A CTranslate2 model directory as a candidate (``--runtime ctranslate2``): made by CTranslate2's own
converter from the HF directory refgpt saves, float32, run on the golden's tokens; its logits (all it
exposes) pass with no false alarm on the embedded model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
pytest.importorskip("transformers", reason="CTranslate2's converter reads the HF model with transformers")

from refgpt.files.default_model import default_model_path  # noqa: E402


@pytest.mark.slow
def test_the_embedded_model_in_ctranslate2_float32_passes(tmp_path, refgpt_cli):
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(str(default_model_path())).convert(str(tmp_path / "ct2"), quantization="float32")
    assert refgpt_cli.in_process("golden", "--bos", "To be, or not to be", "-o", tmp_path / "g.safetensors").returncode == 0
    result = refgpt_cli.in_process("compare", tmp_path / "g.safetensors", tmp_path / "ct2", "--runtime", "ctranslate2",
                                   "--json", "--save", tmp_path / "captured.safetensors")
    assert result.stderr == "", result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report["first_divergence"]
    assert [t["name"] for t in report["tensors"]] == ["tokens", "logits"]
    assert report["logits"]["top1_agreement"] == 1.0
    assert (tmp_path / "captured.safetensors").is_file()
    # locally nothing can be judged: every op's output or inputs are hidden, and the report says so
    local = refgpt_cli.in_process("compare", tmp_path / "g.safetensors", tmp_path / "ct2", "--runtime", "ctranslate2",
                                  "--local")
    assert local.returncode == 0 and "(0 ops judged)" in local.stdout
    assert "their output or inputs hidden by the runtime: embed ×2, residual ×" in local.stdout


@pytest.mark.slow
def test_a_random_model_of_gpt2_small_shape_in_ctranslate2_float32_passes(gpt2_small_saved, tmp_path, refgpt_cli):
    from ctranslate2.converters import TransformersConverter

    golden_path, directory = gpt2_small_saved
    TransformersConverter(str(directory)).convert(str(tmp_path / "ct2"), quantization="float32")
    result = refgpt_cli.in_process("compare", golden_path, tmp_path / "ct2", "--runtime", "ctranslate2", "--json")
    assert result.stderr == "", result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report["first_divergence"]
    assert [t["name"] for t in report["tensors"]] == ["tokens", "logits"]


def test_a_directory_without_model_bin_is_refused_in_one_line(tmp_path, refgpt_cli):
    assert refgpt_cli.in_process("golden", "To be", "-o", tmp_path / "g.safetensors").returncode == 0
    (tmp_path / "empty").mkdir()
    result = refgpt_cli.in_process("compare", tmp_path / "g.safetensors", tmp_path / "empty", "--runtime", "ctranslate2")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "not a CTranslate2 model directory (no model.bin)" in result.stderr
