"""The embedded default model: shipped with the package, made by its script, described truly by
weights/README.md, byte-level, small, and marked UNTRAINED."""

from __future__ import annotations

import configparser
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refgpt
from random_models import rel_err
from refgpt.default_model import UNTRAINED_MARKER, is_untrained
from refgpt.safetensors_file import SafetensorsFile

DEFAULT = refgpt.default_model_path()
WEIGHTS = DEFAULT.parent  # the folder that installs as refgpt.weights
REPO = Path(__file__).resolve().parent.parent
SHIPPED = ["config.json", "model.safetensors", "vocab.json", "merges.txt", UNTRAINED_MARKER]


def readme_table(title: str) -> list[list[str]]:
    """The rows of the Markdown table under ``### title`` in weights/README.md, cells stripped of `."""
    text = (WEIGHTS / "README.md").read_text(encoding="utf-8")
    section = text.split(f"### {title}", 1)[1].split("\n#", 1)[0]
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    return rows[2:]  # without the header and the |---| line


def test_default_model_path_is_the_shipped_directory():
    assert DEFAULT.is_dir() and DEFAULT.name == "default"
    assert sorted(p.name for p in DEFAULT.iterdir()) == sorted(SHIPPED)


def test_make_default_reproduces_the_shipped_files_byte_for_byte(tmp_path):
    subprocess.run([sys.executable, str(WEIGHTS / "make_default.py"), str(tmp_path)], check=True)
    for name in SHIPPED:
        assert (tmp_path / name).read_bytes() == (DEFAULT / name).read_bytes(), name


def test_weights_readme_records_every_file_size_and_sha256():
    recorded = {name.removeprefix("default/"): (int(size), sha) for name, size, sha in readme_table("sha256")}
    actual = {name: ((DEFAULT / name).stat().st_size, hashlib.sha256((DEFAULT / name).read_bytes()).hexdigest())
              for name in SHIPPED}
    assert recorded == actual


def test_weights_readme_records_every_tensor_shape():
    cfg = refgpt.load_default().cfg
    recorded = {}
    for name, shape in readme_table("Shapes"):
        for L in range(cfg.n_layers) if ".h.L." in name else [None]:
            recorded[name.replace(".h.L.", f".h.{L}.")] = json.loads(shape)
    st_file = SafetensorsFile(DEFAULT / "model.safetensors")
    assert recorded == {name: list(st_file.shape(name)) for name in st_file.names}


def test_weights_readme_records_the_config():
    cfg = refgpt.load_default().cfg
    hf = json.loads((DEFAULT / "config.json").read_text())
    for hf_key, tl_name, value in readme_table("Config"):
        first = value.split()[0].strip("`")  # "64", "1e-5", "gelu_new", "true", ...
        try:
            recorded = json.loads(first)
        except json.JSONDecodeError:
            recorded = first
        assert hf[hf_key] == recorded, hf_key
        if tl_name:
            assert getattr(cfg, tl_name) == recorded, tl_name


def test_default_model_is_small_enough_to_commit():
    assert sum((DEFAULT / name).stat().st_size for name in SHIPPED) < 2 * 2**20


def test_default_model_is_marked_untrained(tmp_path):
    assert is_untrained(DEFAULT)
    assert "UNTRAINED" in (DEFAULT / UNTRAINED_MARKER).read_text()
    assert not is_untrained(tmp_path)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_load_default_gives_the_embedded_model_in_either_dtype(dtype):
    model = refgpt.load_default(dtype=dtype)
    assert model.source == DEFAULT and model.dtype == np.dtype(dtype)
    assert model.tokenizer is not None
    logits = model(model.to_tokens("Hello, world"))  # [pos, d_vocab]
    assert logits.dtype == np.dtype(dtype) and np.all(np.isfinite(logits))


def test_default_model_is_gpt2_initialisation():
    """make_default.py's docstring: biases 0, LayerNorm gains 1, the rest drawn (never zero)."""
    params = refgpt.load_default().params
    for name, value in params.items():
        if re.search(r"\.b(_[A-Za-z]+)?$", name):
            assert np.all(value == 0), name
        elif name.endswith(".w"):
            assert np.all(value == 1), name
        else:
            assert np.all(value != 0), name


def test_default_vocabulary_is_the_256_bytes_and_endoftext():
    tok = refgpt.load_default().tokenizer
    assert tok.vocab_size == 257 and tok.eot_token == 256 and tok.special_tokens == {"<|endoftext|>": 256}
    assert [tok.decode_bytes([i]) for i in range(256)] == [bytes([i]) for i in range(256)]


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_default_tokenizer_makes_one_token_per_utf8_byte(text):
    tok = refgpt.load_default().tokenizer
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text


def test_setup_cfg_installs_every_package_and_every_shipped_file():
    """`packages` is a list (find: cannot see weights/), so a new subpackage must be added to it."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    options = cfg["options"]
    listed = set(options["packages"].split())
    package_dir = dict(line.split(" = ") for line in options["package_dir"].strip().splitlines())
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "refgpt").rglob("__init__.py")}
    assert listed == found | {"refgpt.weights"} and package_dir == {"refgpt.weights": "weights"}
    patterns = [p.strip() for p in cfg["options.package_data"]["refgpt.weights"].split(",")]
    installed = {p.relative_to(REPO / "weights") for pattern in patterns for p in (REPO / "weights").glob(pattern)}
    assert installed >= {Path("default", name) for name in SHIPPED} | {Path("README.md")}


def test_hf_reads_the_default_model_and_agrees():
    """It is an ordinary HF GPT-2 directory: transformers loads it and gives refgpt's logits."""
    torch = pytest.importorskip("torch", reason="peer test: needs the peers extra")
    transformers = pytest.importorskip("transformers", reason="peer test: needs the peers extra")
    hf = transformers.GPT2LMHeadModel.from_pretrained(DEFAULT, torch_dtype=torch.float64).eval()
    model = refgpt.load_default()
    tokens = model.to_tokens("The embedded default model, byte by byte.")
    with torch.no_grad():
        reference = hf(torch.tensor(tokens)[None]).logits[0].numpy()  # [pos, d_vocab]
    assert rel_err(model(tokens), reference) <= 1e-12  # the README's float64 agreement with HF
