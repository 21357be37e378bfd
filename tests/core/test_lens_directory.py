"""refgpt/files/lens_directory.py: the tuned-lens package's lens directory (config.json + params.pt),
both key spellings, safetensors, the unembedding hash and its misspelled key — and refusals by name."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from refgpt import RefGPTError
from refgpt.files.lens_directory import (CONFIG_FIELDS, lens_config, read_lens, unembed_hash, write_lens)
from refgpt.files.torch_zip import read_state_dict, write_state_dict

D, L = 6, 3


def translators(seed=0):
    rng = np.random.default_rng(seed)
    return {i: (rng.standard_normal((D, D)), rng.standard_normal(D)) for i in range(L)}


def config(**changes):
    return {**lens_config(D, L, "some/model", "ab" * 32), **changes}


def test_written_directory_reads_back_with_the_packages_seven_fields(tmp_path):
    t = translators()
    write_lens(tmp_path / "lens", t, config())
    stored = json.loads((tmp_path / "lens" / "config.json").read_text())
    assert tuple(stored) == CONFIG_FIELDS  # exactly the package's fields, in its order
    assert list(read_state_dict(tmp_path / "lens" / "params.pt")) == [f"{i}.{k}" for i in range(L) for k in ("weight", "bias")]
    lens = read_lens(tmp_path / "lens")
    assert lens.stream == "resid_pre" and lens.notes == [] and lens.unembed_hash == "ab" * 32
    for i in range(L):
        assert np.array_equal(lens.translators[i][0], t[i][0]) and np.array_equal(lens.translators[i][1], t[i][1])
    write_lens(tmp_path / "mid", t, {**config(), **lens_config(D, L, "m", None, stream="resid_mid")})
    assert read_lens(tmp_path / "mid").stream == "resid_mid"
    assert json.loads((tmp_path / "mid" / "config.json").read_text())["stream"] == "resid_mid"


def test_both_key_spellings_and_safetensors_read_alike(tmp_path):
    from safetensors.numpy import save_file

    t = translators(1)
    package = {f"{i}.{k}": a for i, (W, b) in t.items() for k, a in (("weight", W), ("bias", b))}
    prefixed = {f"layer_translators.{k}": a for k, a in package.items()}
    write_state_dict(tmp_path / "package.pt", package)
    write_state_dict(tmp_path / "prefixed.pt", prefixed)
    save_file(prefixed, str(tmp_path / "prefixed.safetensors"))
    save_file(package, str(tmp_path / "package.safetensors"))
    write_lens(tmp_path / "dir", t, config(), safetensors=True)  # params.safetensors in a lens directory
    for name in ("package.pt", "prefixed.pt", "prefixed.safetensors", "package.safetensors", "dir"):
        lens = read_lens(tmp_path / name)
        assert all(np.array_equal(lens.translators[i][0], t[i][0]) for i in range(L)), name
    write_state_dict(tmp_path / "whole.pt", {**prefixed, "unembed.unembedding.weight": np.zeros((4, D))})
    assert "ignored" in read_lens(tmp_path / "whole.pt").notes[0]  # TunedLens.state_dict() carries the unembedding


def test_the_misspelled_hash_key_of_the_hosted_lenses_is_read_and_reported(tmp_path):
    write_lens(tmp_path / "lens", translators(), config())
    raw = json.loads((tmp_path / "lens" / "config.json").read_text())
    raw["unemebd_hash"] = raw.pop("unembed_hash")  # as lens/gpt2/config.json on the hub spells it
    (tmp_path / "lens" / "config.json").write_text(json.dumps(raw))
    lens = read_lens(tmp_path / "lens")
    assert lens.unembed_hash == "ab" * 32
    assert any("'unemebd_hash'" in note and "never checks it" in note for note in lens.notes)
    raw["unembed_hash"], raw["extra"] = "cd" * 32, 1
    (tmp_path / "lens" / "config.json").write_text(json.dumps(raw))
    lens = read_lens(tmp_path / "lens")
    assert lens.unembed_hash == "cd" * 32 and any("they differ" in n for n in lens.notes)
    assert any("'extra'" in n and "ignored" in n for n in lens.notes)


@pytest.mark.slow
@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("d_model"), "'d_model' is missing"),
    (lambda c: c.update(d_model="6"), "'d_model' is '6', expected int"),
    (lambda c: c.update(num_hidden_layers=True), "'num_hidden_layers' is True, expected int"),
    (lambda c: c.update(num_hidden_layers=4), "holds 3 translators, but config.json says num_hidden_layers = 4"),
    (lambda c: c.update(d_model=7), "translators are 6 wide, but config.json says d_model = 7"),
    (lambda c: c.update(lens_type="logit"), "lens_type is 'logit'"),
    (lambda c: c.update(stream="resid_post"), "'stream' is 'resid_post'"),
    (lambda c: c.update(bias=False), "has biases, but config.json says bias = false"),
    (lambda c: c.update(unembed_hash=3), "'unembed_hash' is 3, expected str or null"),
])
def test_a_config_json_that_does_not_fit_is_refused_by_name(tmp_path, edit, message):
    write_lens(tmp_path / "lens", translators(), config())
    raw = json.loads((tmp_path / "lens" / "config.json").read_text())
    edit(raw)
    (tmp_path / "lens" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(RefGPTError, match=message):
        read_lens(tmp_path / "lens")


@pytest.mark.parametrize("tensors, message", [
    ({"0.weight": np.zeros((D, D)), "0.bias": np.zeros(D), "2.weight": np.zeros((D, D)), "2.bias": np.zeros(D)},
     r"1\.weight is missing"),
    ({"0.weight": np.zeros((D, D)), "layer_translators.1.weight": np.zeros((D, D))}, "mixes the keys"),
    ({"0.weight": np.zeros((D, D + 1))}, r"0\.weight is float64 \[6, 7\]"),
    ({"0.weight": np.zeros((D, D)), "0.bias": np.zeros(D + 1)}, r"0\.bias is float64 \[7\]"),
    ({"0.weight": np.zeros((D, D), np.int64)}, r"0\.weight is int64"),
    ({"0.weight": np.full((D, D), np.nan)}, "non-finite"),
    ({"0.weight": np.zeros((D, D)), "0.bias": np.zeros(D), "1.weight": np.zeros((D, D))}, r"1\.bias is missing"),
    ({"0.weight": np.zeros((D, D)), "1.weight": np.zeros((4, 4))}, "different widths"),
    ({"0.weight": np.zeros((D, D)), "optimizer": np.zeros(1)}, "key 'optimizer' is not a translator's"),
    ({}, "holds no translators"),
])
def test_a_translator_file_that_does_not_fit_is_refused_by_name(tmp_path, tensors, message):
    write_state_dict(tmp_path / "params.pt", tensors)
    with pytest.raises(RefGPTError, match=message):
        read_lens(tmp_path / "params.pt")


def test_a_lens_without_biases_reads_with_zero_biases(tmp_path):
    write_state_dict(tmp_path / "params.pt", {f"{i}.weight": np.eye(D) for i in range(L)})
    lens = read_lens(tmp_path / "params.pt")
    assert all(np.array_equal(b, np.zeros(D)) for _, b in lens.translators.values()) and "no biases" in lens.notes[0]


def test_directories_that_are_not_lenses_are_refused(tmp_path):
    with pytest.raises(RefGPTError, match="has no config.json"):
        read_lens(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config()))
    with pytest.raises(RefGPTError, match="has no params.pt"):
        read_lens(tmp_path)
    write_lens(tmp_path / "both", translators(), config())
    write_state_dict(tmp_path / "both" / "params.safetensors", {"x": np.zeros(1)})
    with pytest.raises(RefGPTError, match="both params.pt and params.safetensors"):
        read_lens(tmp_path / "both")
    with pytest.raises(RefGPTError, match="already there"):
        write_lens(tmp_path / "both", translators(), config(), safetensors=True)
    with pytest.raises(RefGPTError, match="lens not found"):
        read_lens(tmp_path / "nowhere")
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(RefGPTError, match="neither a torch zip file nor a readable safetensors file"):
        read_lens(tmp_path / "junk.safetensors")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("[1]")
    write_state_dict(tmp_path / "bad" / "params.pt", {"0.weight": np.zeros((D, D))})
    with pytest.raises(RefGPTError, match="must hold a JSON object"):
        read_lens(tmp_path / "bad")


def test_unembed_hash_is_the_packages_and_ignores_the_callers_print_options():
    """sha256(np.array_str(W_Uᵀ as float32, precision=1)), as tuned_lens.utils.tensor_hash; an
    unembedding this large is printed summarised, so only its corners count."""
    rng = np.random.default_rng(0)
    W_U = rng.standard_normal((16, 200))  # [d_model, d_vocab]: 3,200 entries, summarised
    expected = hashlib.sha256(np.array_str(W_U.T.astype(np.float32), precision=1).encode()).hexdigest()
    assert unembed_hash(W_U) == expected
    with np.printoptions(threshold=10**9, precision=8, suppress=True):
        assert unembed_hash(W_U) == expected
    middle = W_U.copy()
    middle[8, 100] += 1.0  # not a corner: the package's hash does not see it
    assert unembed_hash(middle) == expected
    corner = W_U.copy()
    corner[0, 0] += 1.0
    assert unembed_hash(corner) != expected
