"""compare fails closed: a reference that cannot judge, a candidate that shows too little, or a
broken file is an error or a failure — never "OK"."""

from __future__ import annotations

import gc
import json
import warnings

import numpy as np
import pytest

from random_models import random_model
from refgpt import Config, RefGPTError
from refgpt.oracle import comparison as oracle
from refgpt.oracle import golden

CFG = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=11, n_ctx=6)
TOKENS = np.array([[3, 1, 4, 1, 5]])


@pytest.fixture(scope="module")
def reference():
    return golden.make(random_model(CFG, seed=2), TOKENS)


def edited(g, tensors=None, **metadata):
    return golden.Golden({**g.tensors, **(tensors or {})}, {**g.metadata, **metadata})


def test_an_identical_candidate_is_ok(reference):
    assert oracle.compare(reference, reference.tensors).ok


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_reference_is_an_error_naming_the_tensor(reference, value):
    resid = np.array(reference.tensors["blocks.1.hook_resid_post"])
    resid[0, 2, 3] = value
    with pytest.raises(RefGPTError, match=r"'blocks.1.hook_resid_post' holds .* at index \[0, 2, 3\]"):
        oracle.compare(edited(reference, {"blocks.1.hook_resid_post": resid}), reference.tensors)


def test_an_all_nan_reference_does_not_pass_an_all_zero_candidate(reference):
    nan = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v for k, v in reference.tensors.items()}
    zero = {k: np.zeros_like(v) if v.dtype.kind == "f" else v for k, v in reference.tensors.items()}
    with pytest.raises(RefGPTError, match="a reference must be finite"):
        oracle.compare(golden.Golden(nan, reference.metadata), zero)


def test_the_causal_mask_in_attention_scores_is_allowed(reference):
    assert np.isneginf(reference.tensors["blocks.0.attn.hook_attn_scores"]).any()
    assert oracle.compare(reference, reference.tensors).ok


@pytest.mark.parametrize("conditioning,match", [
    ({"logits": float("nan")}, "NaN is not a JSON number"),
    ({"logits": float("inf")}, "Infinity is not a JSON number"),
    ({"logits": -1.0}, "the value of 'logits' must be a finite number ≥ 0, found -1.0"),
    ({"logits": "1"}, "the value of 'logits' must be a finite number ≥ 0"),
    ([1, 2], "expected an object of tensor name → number"),
])
def test_golden_conditioning_is_validated(reference, tmp_path, conditioning, match):
    path = golden.write(tmp_path / "g.safetensors", edited(reference, conditioning=json.dumps(conditioning)))
    with pytest.raises(RefGPTError, match=f"g.safetensors: golden metadata 'conditioning': {match}"):
        oracle.compare(path, reference.tensors)


def test_conditioning_given_by_the_caller_is_validated(reference):
    with pytest.raises(RefGPTError, match="must be a finite number ≥ 0"):
        oracle.compare(reference, reference.tensors, conditioning={"logits": float("nan")})


def test_broken_golden_config_metadata_is_one_line(reference, tmp_path):
    path = golden.write(tmp_path / "g.safetensors", edited(reference, config='{"n_layer": '))
    with pytest.raises(RefGPTError, match="g.safetensors: golden metadata 'config': not valid JSON") as info:
        oracle.compare(path, reference.tensors)
    assert "\n" not in str(info.value)


def test_a_candidate_with_only_tokens_fails_saying_what_is_missing(reference):
    report = oracle.compare(reference, {"tokens": TOKENS})
    assert not report.ok
    assert "no logits" in report.table() and "no activation was compared" in report.table()
    assert report.to_dict()["too_little"]


def test_a_candidate_without_logits_fails(reference):
    cand = {k: v for k, v in reference.tensors.items() if k not in ("logits", "log_probs")}
    report = oracle.compare(reference, cand)
    assert not report.ok and "FAIL: compared too little: the candidate has no logits" in report.table()


@pytest.mark.parametrize("data", [b"", b"PK\x03\x04 broken", b"not a zip at all"])
def test_broken_npz_is_one_line(reference, tmp_path, data):
    path = tmp_path / "c.npz"
    path.write_bytes(data)
    with pytest.raises(RefGPTError, match="c.npz: not a readable .npz file") as info:
        oracle.compare(reference, path)
    assert "\n" not in str(info.value)


def test_truncated_npz_is_one_line(reference, tmp_path):
    path = tmp_path / "c.npz"
    np.savez(path, **{k: np.asarray(v) for k, v in reference.tensors.items()})
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(RefGPTError, match="c.npz: not a readable .npz file"):
        oracle.compare(reference, path)


@pytest.mark.parametrize("value", [1e300, 1.7e308, -np.finfo(np.float64).max])
def test_a_reference_near_float64s_maximum_is_judged_without_a_warning(reference, value):
    resid = np.array(reference.tensors["blocks.1.hook_resid_post"])
    resid[0, 2, 3] = value  # finite, legitimate input: its square overflows float64
    huge = edited(reference, {"blocks.1.hook_resid_post": resid})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        same, other = oracle.compare(huge, huge.tensors), oracle.compare(huge, reference.tensors)
        same.table(), other.table()
    assert same.ok and not other.ok
    result = next(t for t in same.tensors if t.name == "blocks.1.hook_resid_post")
    assert result.rms == 0.0 and np.isfinite(result.bias_tolerance)



@pytest.mark.slow
def test_a_broken_npz_closes_its_file(tmp_path):
    """np.load(path) leaves its file to be closed at deallocation when the zip is broken (a
    ResourceWarning, "unclosed file"); refgpt opens the file itself and closes it."""
    path = tmp_path / "c.npz"
    path.write_bytes(b"PK\x03\x04 not a zip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(RefGPTError, match="not a readable .npz file"):
            oracle.load(path)
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
