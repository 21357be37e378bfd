"""Hostile SAE folders: a mutated cfg.json (any key set to any JSON value, removed, or its text
edited; pre-6.0 and 6.x), weights of the wrong shapes, non-finite or missing, extra tensors, a
sparsity file that disagrees. ``load_sae`` gives an SAE that computes finite numbers of the shapes
its cfg says, or one line — never a traceback, never a silent number."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save_file

import refgpt
from fuzzing import fuzz_settings, json_values, refused_cleanly, text_mutation
from refgpt.sae import SAE, save_sae
from refgpt.sae.folder import weight_shapes

ARCHS = ["standard", "topk", "jumprelu", "gated", "skip_transcoder"]
CFG_KEYS = ["d_in", "d_sae", "d_out", "dtype", "apply_b_dec_to_input", "normalize_activations", "reshape_activations",
            "architecture", "k", "rescale_acts_by_decoder_norm", "metadata", "hook_point", "activation_fn_str",
            "activation_fn", "activation_fn_kwargs", "finetuning_scaling_factor", "sae_lens_version"]
OUTCOMES: dict[str, dict[str, int]] = {}


def base_sae(architecture):
    cfg = {"d_in": 4, "d_sae": 6, "architecture": architecture, "apply_b_dec_to_input": "transcoder" not in architecture,
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"hook_name": "blocks.0.hook_resid_pre", "prepend_bos": True}}
    if architecture == "topk":
        cfg["k"] = 2
    if "transcoder" in architecture:
        cfg["d_out"] = 5
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal(shape) for name, shape in weight_shapes(cfg).items()}
    return SAE(cfg, params, sparsity=np.linspace(-3, 0, 6))


def accepted_sae_computes(directory):
    def action():
        sae = refgpt.load_sae(directory)
        x = np.random.default_rng(1).standard_normal((3, sae.d_in))
        f, out = sae.encode(x), sae.forward(x)
        assert f.shape == (3, sae.d_sae) and out.shape[-1] == sae.d_out
        assert np.isfinite(f).all() and np.isfinite(out).all()
    return action


def count(test, outcome):
    OUTCOMES.setdefault(test, {}).setdefault(outcome, 0)
    OUTCOMES[test][outcome] += 1


@pytest.mark.slow
@fuzz_settings(150)
@given(data=st.data())
def test_any_cfg_json_loads_or_is_refused_in_one_line(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("sae")
    save_sae(base_sae(data.draw(st.sampled_from(ARCHS))), directory)
    cfg = json.loads((directory / "cfg.json").read_text())
    kind = data.draw(st.sampled_from(["value", "value", "metadata", "remove", "text"]))
    if kind == "text":
        text = text_mutation(data.draw, json.dumps(cfg, indent=1))
    elif kind == "metadata":
        key = data.draw(st.sampled_from(["hook_name", "prepend_bos", "model_from_pretrained_kwargs", "sae_lens_version",
                                         "hook_name_out", "hook_head_index"]))
        text = json.dumps({**cfg, "metadata": {**cfg["metadata"], key: data.draw(json_values())}})
    else:
        key = data.draw(st.sampled_from(CFG_KEYS))
        changed = dict(cfg)
        if kind == "remove":
            changed.pop(key, None)
        else:
            changed[key] = data.draw(json_values())
        text = json.dumps(changed)
    (directory / "cfg.json").write_text(text)
    count("cfg.json", refused_cleanly(accepted_sae_computes(directory)))


@pytest.mark.slow
@fuzz_settings(100)
@given(data=st.data())
def test_any_weights_load_or_are_refused_in_one_line(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("sae")
    sae = base_sae(data.draw(st.sampled_from(ARCHS)))
    save_sae(sae, directory)
    tensors = {k: np.array(v) for k, v in sae.params.items()}
    name = data.draw(st.sampled_from(sorted(tensors)))
    kind = data.draw(st.sampled_from(["shape", "nonfinite", "remove", "extra", "dtype", "sparsity"]))
    if kind == "shape":
        shape = data.draw(st.lists(st.integers(0, 7), min_size=0, max_size=3))
        tensors[name] = np.zeros(shape)
    elif kind == "nonfinite":
        tensors[name].flat[data.draw(st.integers(0, tensors[name].size - 1))] = data.draw(
            st.sampled_from([np.nan, np.inf, -np.inf]))
    elif kind == "remove":
        del tensors[name]
    elif kind == "extra":
        tensors[data.draw(st.sampled_from(["scaling_factor", "log_threshold", "W_skip", "b_gate", "x"]))] = \
            data.draw(st.sampled_from([np.ones(6), np.full(6, 2.0), np.zeros((5, 4))]))
    elif kind == "dtype":
        tensors[name] = tensors[name].astype(data.draw(st.sampled_from([np.int32, np.float16, np.uint8])))
    else:
        save_file({data.draw(st.sampled_from(["sparsity", "log_sparsity"])):
                   np.zeros(data.draw(st.integers(0, 8)))}, str(directory / "sparsity.safetensors"))
    if kind != "sparsity":
        save_file(tensors, str(directory / "sae_weights.safetensors"))
    count("weights", refused_cleanly(accepted_sae_computes(directory)))


@pytest.mark.slow  # reads what the two fuzz tests above counted: it runs where they run
def test_the_fuzzing_reached_both_outcomes():
    for test, outcomes in OUTCOMES.items():
        assert outcomes.get("refused", 0) > 0, (test, outcomes)
    assert OUTCOMES.get("cfg.json", {}).get("accepted", 0) > 0, OUTCOMES
