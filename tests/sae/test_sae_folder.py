"""SAELens's folders both ways, every architecture, SAELens as the judge: refgpt reads what SAELens
saves and SAELens reads what refgpt saves; features and reconstructions agree."""

from __future__ import annotations

import json

import numpy as np
import pytest

import refgpt
from refgpt.errors import RefGPTError
from refgpt.sae import folder
from sae_peer import ARCHITECTURES, require_sae_lens, run, sae_lens_sae

pytestmark = pytest.mark.peer  # SAELens saves and reads every folder these tests compare

#: float64 on both sides: the two compute the same products in another order (torch's and NumPy's
#: BLAS), so they differ by a few ulps of each sum; measured ≤ 1e-14 relative here.
F64_TOL = 1e-12
#: float32 folders: SAELens computes in float32, refgpt in float64 of the same stored weights; the
#: difference is float32 rounding of each product's sum, ≤ d_in·2⁻²⁴ relative (d_in ≤ 32 here).
F32_TOL = 32 * 2.0**-24

CASES = [(a, n) for a in ARCHITECTURES for n in (["none", "constant_norm_rescale", "layer_norm"]
                                                 if "transcoder" not in a else ["none"])]


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(1e-300, np.max(np.abs(b))))


def _extra(architecture, normalize):
    cfg = {"normalize_activations": normalize}
    if architecture == "topk":
        cfg["k"] = 3
    return cfg


@pytest.mark.parametrize("architecture,normalize", CASES)
def test_refgpt_reads_what_sae_lens_saves(tmp_path, architecture, normalize):
    require_sae_lens()
    d_out = 10 if "transcoder" in architecture else None
    peer = sae_lens_sae(architecture, 8, 24, seed=1, d_out=d_out, **_extra(architecture, normalize))
    peer.save_model(tmp_path / "sae")
    sae = refgpt.load_sae(tmp_path / "sae")
    assert sae.architecture == architecture and sae.d_in == 8 and sae.d_sae == 24 and sae.d_out == (d_out or 8)
    x = 2.0 * np.random.default_rng(2).standard_normal((3, 5, 8))  # [batch, pos, d_in]
    f_peer, x_hat_peer = run(peer, x)
    f = sae.encode(x)
    assert (f > 0).sum() > 0 and np.array_equal(f > 0, f_peer > 0)
    assert rel(f, f_peer) <= F64_TOL
    assert rel(sae.forward(x), x_hat_peer) <= F64_TOL
    if architecture == "topk":
        assert ((f > 0).sum(-1) <= 3).all()


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_sae_lens_reads_what_refgpt_saves(tmp_path, architecture):
    sae_lens = require_sae_lens()
    extra = {"k": 4, "rescale_acts_by_decoder_norm": True} if architecture == "topk" else {}
    peer = sae_lens_sae(architecture, 6, 16, seed=3, d_out=7 if "transcoder" in architecture else None, **extra)
    peer.save_model(tmp_path / "theirs")
    sae = refgpt.load_sae(tmp_path / "theirs")
    refgpt.sae.save_sae(sae, tmp_path / "ours")
    again = sae_lens.SAE.load_from_disk(tmp_path / "ours", dtype="float64")
    assert type(again).__name__ == type(peer).__name__
    x = np.random.default_rng(4).standard_normal((7, 6))  # [batch, d_in]
    f_peer, x_hat_peer = run(again, x)
    assert rel(sae.encode(x), f_peer) <= F64_TOL and rel(sae.forward(x), x_hat_peer) <= F64_TOL
    assert folder.load_sae(tmp_path / "ours").cfg == {**sae.cfg, "metadata": {
        **sae.metadata, "sae_lens_version": folder.FORMAT_VERSION, "refgpt_version": refgpt.__version__},
        "dtype": "float64", "device": "cpu"}


def test_float32_folders_agree_to_float32_rounding(tmp_path):
    require_sae_lens()
    peer = sae_lens_sae("jumprelu", 32, 64, seed=5, dtype="float32")
    peer.save_model(tmp_path / "sae")
    sae = refgpt.load_sae(tmp_path / "sae")
    x = np.random.default_rng(6).standard_normal((4, 32)).astype(np.float32)
    f_peer, x_hat_peer = run(peer, x)
    f = sae.encode(x)
    assert np.array_equal(f > 0, f_peer > 0)  # no pre-activation within rounding of its threshold here
    print("float32 folder: features", rel(f, f_peer), "reconstruction", rel(sae.forward(x), x_hat_peer))
    assert rel(f, f_peer) <= F32_TOL and rel(sae.forward(x), x_hat_peer) <= F32_TOL


def test_pre_6_0_config_names(tmp_path):
    """A pre-6.0 cfg.json (hook_point, activation_fn_str, activation_fn_kwargs.k, normalize as a bool)
    reads as SAELens 6.x reads it."""
    sae_lens = require_sae_lens()
    peer = sae_lens_sae("topk", 6, 12, seed=7, k=2)
    peer.save_model(tmp_path / "sae")
    old = {"d_in": 6, "d_sae": 12, "dtype": "float64", "device": "cpu", "hook_point": "blocks.2.hook_resid_pre",
           "hook_point_layer": 2, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 2},
           "normalize_activations": False, "model_name": "gpt2", "context_size": 128, "lr": 4e-4,
           "model_from_pretrained_kwargs": {"center_writing_weights": True}}
    (tmp_path / "sae" / "cfg.json").write_text(json.dumps(old))
    theirs = sae_lens.SAE.load_from_disk(tmp_path / "sae", dtype="float64")
    sae = refgpt.load_sae(tmp_path / "sae")
    assert sae.architecture == "topk" and sae.cfg["k"] == 2 and sae.hook_name == "blocks.2.hook_resid_pre"
    assert sae.metadata["model_from_pretrained_kwargs"] == {"center_writing_weights": True}
    assert theirs.cfg.metadata.hook_name == sae.hook_name and theirs.cfg.k == 2
    x = np.random.default_rng(8).standard_normal((5, 6))
    assert rel(sae.encode(x), run(theirs, x)[0]) <= F64_TOL


@pytest.mark.parametrize("change,message", [
    ({"architecture": "matching_pursuit"}, "architecture 'matching_pursuit'"),
    ({"normalize_activations": "covariance_whitening"}, "normalize_activations 'covariance_whitening'"),
    ({"normalize_activations": "expected_average_only_in"}, "norm scaling factor"),
    ({"d_sae": 17}, "tensor 'W_enc' has shape [6, 16], but cfg.json's d_in/d_sae say [6, 17]"),
    ({"d_in": True}, "d_in must be a whole number"),
    ({"k": 3}, "k is a topk setting"),
    ({"reshape_activations": "hook_q"}, "reshape_activations 'hook_q'"),
    ({"lr": 1.0}, "unknown key 'lr'"),
])
def test_a_cfg_that_lies_is_refused_by_name(tmp_path, change, message):
    require_sae_lens()
    sae_lens_sae("standard", 6, 16, seed=9).save_model(tmp_path / "sae")
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    (tmp_path / "sae" / "cfg.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(RefGPTError, match=None) as caught:
        refgpt.load_sae(tmp_path / "sae")
    assert message in str(caught.value) and "\n" not in str(caught.value)
