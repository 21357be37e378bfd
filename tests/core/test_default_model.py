"""The embedded default model: shipped with the package, described truly by weights/README.md and
its training record, small enough to commit, read alike by refgpt and HF, and trained — it beats
the unigram baseline and puts ' be' after "To be, or not to".

Training it takes about 20 minutes, too slow for the suite, so nothing here re-makes it
(tests/train/test_training_smoke.py runs the training loop on a few kilobytes instead). What is checked
is that the committed files are the ones the README and the run's record describe, and that they
still produce the record's samples bit for bit."""

from __future__ import annotations

import configparser
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refgpt
from random_models import random_model, rel_err, save_checkpoint
from refgpt import Config
from refgpt.files.default_model import UNTRAINED_MARKER, is_untrained
from refgpt.files.safetensors_file import SafetensorsFile

DEFAULT = refgpt.default_model_path()
WEIGHTS = DEFAULT.parent  # the folder that installs as refgpt.weights
REPO = Path(__file__).resolve().parents[2]
MODEL_FILES = ["config.json", "model.safetensors", "vocab.json", "merges.txt"]  # what refgpt.load reads
RECORD_FILES = ["TRAINING.md", "training_log.json", "loss_curve.png"]  # the training run's record
SHIPPED = MODEL_FILES + RECORD_FILES


@pytest.fixture(scope="module")
def model():
    return refgpt.load_default()


@pytest.fixture(scope="module")
def log():
    return json.loads((DEFAULT / "training_log.json").read_text(encoding="utf-8"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def readme_table(title: str) -> list[list[str]]:
    """The rows of the Markdown table under ``### title`` in weights/README.md, cells stripped of `."""
    text = (WEIGHTS / "README.md").read_text(encoding="utf-8")
    section = text.split(f"### {title}", 1)[1].split("\n#", 1)[0]
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    return rows[2:]  # without the header and the |---| line


@functools.cache
def default_tokenizer():
    """Loaded once for the property test below (hypothesis cannot take function-scoped fixtures)."""
    return refgpt.load_default().tokenizer


def probabilities(model, text: str) -> np.ndarray:
    """The model's next-token distribution after ``text``: [d_vocab]."""
    logits = model(model.to_tokens(text, prepend_bos=False)[0], last_only=True)[-1]  # [d_vocab]
    p = np.exp(logits - logits.max())  # [d_vocab]
    return p / p.sum()  # [d_vocab]


# ---- the files, and what the README and the record say about them ------------------------------


def test_default_model_path_is_the_shipped_directory():
    assert DEFAULT.is_dir() and DEFAULT.name == "default"
    assert sorted(p.name for p in DEFAULT.iterdir()) == sorted(SHIPPED)


def test_the_lookup_takes_the_installed_model_else_the_source_checkout_s(tmp_path, monkeypatch):
    from refgpt.files import default_model as D

    assert D.SOURCE_CHECKOUT_WEIGHTS == REPO / "weights" / "default"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert D.find_default_model([DEFAULT, tmp_path]) == DEFAULT
    assert D.find_default_model([None, empty, DEFAULT]) == DEFAULT  # None: no refgpt.weights package
    with pytest.raises(refgpt.RefGPTError, match=f"looked in {empty}, {tmp_path / 'nowhere'}"):
        D.find_default_model([None, empty, tmp_path / "nowhere"])
    monkeypatch.setattr(D, "installed_weights", lambda: None)  # refgpt imported from a source checkout
    assert refgpt.default_model_path() == REPO / "weights" / "default"


def _without_site(cwd, *paths, code):
    """Run ``code`` with ``python -S`` (no site: no editable-install finder) and only ``paths``
    (plus numpy's site-packages) on PYTHONPATH, in ``cwd``."""
    site = Path(np.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), str(site)])}
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_python_started_in_the_repository_finds_the_default_model():
    """The source refgpt/ has no refgpt.weights subpackage: the model is the repository's weights/default."""
    where, path = _without_site(REPO, code="import refgpt; print(refgpt.__file__, refgpt.default_model_path())")
    assert Path(where) == REPO / "refgpt" / "__init__.py" and Path(path) == REPO / "weights" / "default"


@pytest.mark.skipif(not os.environ.get("REFGPT_INSTALL_TESTS"), reason="builds and installs the package "
                    "(pip install ., ~30 s); set REFGPT_INSTALL_TESTS=1")
def test_after_a_real_pip_install_the_default_model_is_found_inside_and_outside_the_repository(tmp_path):
    source, target = tmp_path / "source", tmp_path / "site"  # a copy, so the build leaves the checkout alone
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("refgpt", "weights"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=600)
    code = "import refgpt; print(refgpt.__file__, refgpt.default_model_path(), refgpt.load_default().cfg.d_model)"
    where, path, width = _without_site(tmp_path, target, code=code)  # the installed copy
    assert Path(where).is_relative_to(target) and Path(path) == target / "refgpt" / "weights" / "default"
    where, path, width = _without_site(REPO, target, code=code)  # in the repository: the source copy
    assert Path(where) == REPO / "refgpt" / "__init__.py" and Path(path) == REPO / "weights" / "default"
    assert width == "144"


def test_weights_readme_records_every_file_size_and_sha256():
    recorded = {name.removeprefix("default/"): (int(size), sha) for name, size, sha in readme_table("sha256")}
    assert recorded == {name: ((DEFAULT / name).stat().st_size, sha256(DEFAULT / name)) for name in SHIPPED}
    total = f"{sum((DEFAULT / name).stat().st_size for name in SHIPPED):,} bytes"
    assert f"Together they are {total}." in (WEIGHTS / "README.md").read_text(encoding="utf-8")


def test_training_record_names_the_shipped_model_files(log):
    """The run wrote the sha256 of the four model files into its log and TRAINING.md: these files."""
    actual = {name: sha256(DEFAULT / name) for name in MODEL_FILES}
    assert log["sha256"] == actual
    training_md = (DEFAULT / "TRAINING.md").read_text(encoding="utf-8")
    assert all(f"| `{name}` | `{digest}` |" in training_md for name, digest in actual.items())


def test_weights_readme_records_every_tensor_shape(model):
    recorded = {}
    for name, shape in readme_table("Shapes"):
        for L in range(model.cfg.n_layers) if ".h.L." in name else [None]:
            recorded[name.replace(".h.L.", f".h.{L}.")] = json.loads(shape)
    st_file = SafetensorsFile(DEFAULT / "model.safetensors")
    assert recorded == {name: list(st_file.shape(name)) for name in st_file.names}
    n_params = sum(int(np.prod(st_file.shape(name))) for name in st_file.names)
    assert n_params == 2_201_184 and "2,201,184 parameters" in (WEIGHTS / "README.md").read_text(encoding="utf-8")


def test_weights_readme_records_the_config(model):
    hf = json.loads((DEFAULT / "config.json").read_text())
    for hf_key, tl_name, value in readme_table("Config"):
        first = value.split()[0].strip("`")  # "144", "1e-5", "gelu_new", "true", "8191", ...
        try:
            recorded = json.loads(first)
        except json.JSONDecodeError:
            recorded = first
        assert hf[hf_key] == recorded, hf_key
        if tl_name:
            assert getattr(model.cfg, tl_name) == recorded, tl_name
    assert model.cfg.d_head == 36  # "4 (`d_head` 36)"


def test_weights_readme_quotes_the_training_run_truly(log):
    """Every number in README's "How it was made" table is the run's own, from training_log.json."""
    readme = (WEIGHTS / "README.md").read_text(encoding="utf-8")
    wall = log["wall_seconds"]
    quoted = [
        f"sha256 `{log['sdist_sha256']}`",
        f"({log['n_train_tokens']:,} tokens)", f"validation ({log['n_val_tokens']:,} tokens)",
        f"`refgpt/train/bpe_trainer.py`, {log['bpe_seconds']:.1f} s",
        f"{len(log['steps'])} steps of {log['hyper']['batch']} windows × {log['config']['n_positions']} tokens",
        f"AdamW (lr {log['hyper']['lr']}, {log['hyper']['warmup']} warm-up steps, cosine decay to "
        f"{log['hyper']['min_lr']}, betas {tuple(log['hyper']['betas'])}, weight decay {log['hyper']['weight_decay']}",
        f"{wall / 60:.1f} min ({wall:.1f} s, {wall / len(log['steps']):.2f} s/step)",
        f"Python {log['machine']['python']}, NumPy {log['machine']['numpy']}",
        f"{log['val_loss'][0]:.3f} nats/token at step 0 (ln 8192 = {np.log(8192):.3f}), "
        f"**{log['val_loss'][-1]:.3f}** at the end (perplexity {np.exp(log['val_loss'][-1]):.0f})",
        f"{log['hyper']['eval_windows']} fixed random windows",
        f"({log['hyper']['eval_windows'] * log['config']['n_positions']:,} predicted tokens)",
        f"{log['baseline']['val_loss']:.3f} nats/token on the whole validation split "
        f"(perplexity {np.exp(log['baseline']['val_loss']):.0f})",
        f"{np.mean(log['train_loss'][-50:]):.3f} nats/token (mean of the last 50 steps)",
    ]
    if log["hyper"].get("bos_fraction"):  # the recipe's BOS windows (weights/train_default.py)
        quoted.append(f"{log['hyper']['bos_fraction']:.0%} of them starting with `<\\|endoftext\\|>`")  # | escaped in a table
    assert [q for q in quoted if q not in readme] == []
    assert log["stopped_early"] is False and log["seed"] == 0
    assert [name.removesuffix("_gut.txt") for name in log["val_works"]] == ["julius_caesar", "macbeth", "twelfth_night"]


def test_everything_committed_in_weights_is_under_12_MB():
    """The installed package stays small: the model (8.8 MB, float64), its tuned lens (0.4 MB) and,
    since issue 42, its SAE (1.35 MB: issue 42 asks for it in float64) — under 12 MB, was 10."""
    files = [p for p in WEIGHTS.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) < 12 * 10**6


# ---- it loads, in both dtypes and in HF -----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_load_default_gives_the_embedded_model_in_either_dtype(dtype):
    model = refgpt.load_default(dtype=dtype)
    assert model.source == DEFAULT and model.dtype == np.dtype(dtype)
    assert model.tokenizer is not None
    logits = model(model.to_tokens("To be, or not to be", prepend_bos=False)[0])  # [pos, d_vocab]
    assert logits.dtype == np.dtype(dtype) and np.all(np.isfinite(logits))


@pytest.mark.peer
def test_hf_reads_the_default_model_and_agrees(model):
    """It is an ordinary HF GPT-2 directory: transformers loads it and gives refgpt's logits."""
    torch = pytest.importorskip("torch", reason="peer test: needs the peers extra")
    transformers = pytest.importorskip("transformers", reason="peer test: needs the peers extra")
    hf = transformers.GPT2LMHeadModel.from_pretrained(DEFAULT, torch_dtype=torch.float64).eval()
    tokens = model.to_tokens("Now is the winter of our discontent\nMade glorious summer by this sun of York;", prepend_bos=False)[0]
    with torch.no_grad():
        reference = hf(torch.tensor(tokens)[None]).logits[0].numpy()  # [pos, d_vocab]
    assert rel_err(model(tokens), reference) <= 1e-12  # the README's float64 agreement with HF


# ---- its tokenizer --------------------------------------------------------------------------------


def test_default_vocabulary_is_the_bytes_the_merges_and_endoftext(model):
    """weights/README.md: ids 0-255 the bytes, 256-8190 the 7,935 merges in order, 8191 <|endoftext|>."""
    tok = model.tokenizer
    assert tok.vocab_size == 8192 and tok.eot_token == 8191 and tok.special_tokens == {"<|endoftext|>": 8191}
    assert [tok.decode_bytes([i]) for i in range(256)] == [bytes([i]) for i in range(256)]
    merges = (DEFAULT / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0] == "#version: 0.2" and len(merges) - 1 == 7935
    assert [tok.decode_bytes([256 + i]) for i in range(3)] == [b" t", b"he", b" a"]  # Ġt, he, Ġa
    assert [tok.decode_bytes([i]) for i in model.to_tokens("Hello", prepend_bos=False)[0]] == [b"H", b"ell", b"o"]


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.text())
def test_default_tokenizer_round_trips_any_text(text):
    tok = default_tokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 8191 for i in ids)  # <|endoftext|> in text is not special unless asked
    assert tok.decode(ids) == text


# ---- it is trained ----------------------------------------------------------------------------------


def test_validation_loss_beats_the_unigram_baseline_by_more_than_a_nat(log):
    """Measured: 4.296 against 6.423 nats/token, 2.13 nats better (weights/README.md)."""
    assert log["val_loss"][-1] <= log["baseline"]["val_loss"] - 1.0
    assert abs(log["val_loss"][0] - np.log(8192)) < 0.05  # it started from a near-uniform guess


def test_to_be_or_not_to_puts_be_on_top(model):
    """As measured on the shipped weights: ' be' first (0.070), then ' the', ' me'."""
    p = probabilities(model, "To be, or not to")  # [d_vocab]
    top = np.argsort(-p, kind="stable")[:3]
    assert [model.to_string([t]) for t in top] == [" be", " the", " me"]
    assert [round(float(p[t]), 3) for t in top] == [0.07, 0.039, 0.03]


BOS_GAP_TEXT = REPO / "tests" / "data" / "macbeth_act1.txt"  # Macbeth is a held-out work
BOS_GAP_LIMIT = 0.03  # weights/README.md: with BOS first at most 3 % worse, for a model of the BOS recipe


def recorded_bos_gap() -> dict[str, tuple[float, float, float]]:
    """weights/README.md's "BOS gap" table: prompt length → (with, without, gap in %)."""
    return {length.split()[0]: (float(with_), float(without), float(gap.replace("%", "").replace("−", "-")))
            for length, _, with_, without, gap in readme_table("BOS gap")}


@pytest.mark.slow
def test_the_bos_gap_on_held_out_short_prompts_is_the_readme_s(model, log):
    """weights/README.md's BOS-gap table is measured on these weights: the mean loss on 256
    prompts of 8 and of 32 tokens from line starts of Macbeth's first act, with <|endoftext|>
    first (the API's default) and without, on the same targets (train_default.bos_gap). A model
    trained with the recipe's BOS windows (its log records ``bos_fraction``) must be within 3 %;
    the shipped one predates them."""
    from refgpt.weights import train_default as T

    measured = T.bos_gap(model, [BOS_GAP_TEXT.read_text(encoding="utf-8")])
    assert {k: (round(g["with_bos"], 3), round(g["without_bos"], 3), round(100 * g["gap"], 1))
            for k, g in measured.items()} == recorded_bos_gap()
    assert [g["prompts"] for g in measured.values()] == [256, 255]  # one line too near the end for 32 tokens
    if log["hyper"].get("bos_fraction"):  # made by the recipe with BOS windows: "within a few percent"
        assert all(g["gap"] <= BOS_GAP_LIMIT for g in measured.values()), measured


def test_refgpt_predict_prints_be_first(refgpt_cli):
    status, out, _ = refgpt_cli.in_process("predict", "To be, or not to", "--top-k", "3")
    assert status == 0
    assert "UNTRAINED" not in out
    rows = out.split("rank", 1)[1].splitlines()[1:4]
    assert [re.split(r"\s{2,}", row.strip())[2] for row in rows] == ["' be'", "' the'", "' me'"]


@pytest.mark.slow
def test_the_shipped_weights_reproduce_the_recorded_samples(model, log):
    """TRAINING.md's top-5 tables and greedy continuations come from these files. The run computed
    them in float64 from its own arrays (W_U a view of W_Eᵀ); loaded from disk they agree within
    the float64 bound refgpt holds against HF, 1e-12 relative (measured: bit for bit)."""
    for sample in log["samples"]:
        ids = model.to_tokens(sample["prompt"], prepend_bos=False)[0]
        p = probabilities(model, sample["prompt"])  # [d_vocab]
        top = np.argsort(-p, kind="stable")[:5]
        assert [model.to_string([t]) for t in top] == [text for text, _ in sample["top5"]], sample["prompt"]
        assert rel_err(p[top], [q for _, q in sample["top5"]]) <= 1e-12, sample["prompt"]
        greedy = np.asarray(model.generate(ids, 24, temperature=0.0, stop_at_eos=False))[len(ids):]
        assert model.to_string(greedy) == sample["greedy"], sample["prompt"]


def test_what_the_readme_says_it_cannot_do(model, log):
    """weights/README.md: greedy text loops, and it knows no facts."""
    assert any("the King, the King, the King" in s["greedy"] for s in log["samples"])
    p = probabilities(model, "The capital of France is")  # [d_vocab]
    assert [model.to_string([t]) for t in np.argsort(-p, kind="stable")[:3]] == [" in", ",", " the"]


# ---- the UNTRAINED marker: for any model directory, not the default ----------------------------


def test_the_default_is_not_marked_untrained():
    assert not is_untrained(DEFAULT) and not (DEFAULT / UNTRAINED_MARKER).exists()


def test_a_directory_with_the_marker_is_untrained(tmp_path):
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=12, d_vocab=20, n_ctx=6)
    directory = save_checkpoint(random_model(cfg, seed=0), tmp_path / "random")
    assert not is_untrained(directory)
    (directory / UNTRAINED_MARKER).write_text("UNTRAINED: a random initialisation\n")
    assert is_untrained(directory)


# ---- packaging ------------------------------------------------------------------------------------


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
