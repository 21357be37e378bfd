"""The tuned lens shipped for the embedded model (weights/default_lens/): installed with the package,
described truly by its training record, read by the tuned-lens package as it is, used by
`refgpt lens --kind tuned` by default — and better than the logit lens at every layer on a text
neither the model nor the lens saw (Macbeth, Act I; the recipe holds all of Macbeth out)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import refgpt
from refgpt.analysis.lens import TunedLens, evaluate_lenses
from refgpt.files.default_model import default_lens_path
from refgpt.files.lens_directory import CONFIG_FIELDS, unembed_hash
from refgpt.train.tuned_lens import text_windows

LENS = default_lens_path()
HELD_OUT = Path(__file__).resolve().parents[1] / "data" / "macbeth_act1.txt"
HELD_OUT_WINDOWS = 16  # its first 2,048 tokens (of 56 windows): the margins are wide, the test time is not


@pytest.fixture(scope="module")
def model():
    return refgpt.load_default()


@pytest.fixture(scope="module")
def lens(model):
    return TunedLens.load(model)


def test_the_shipped_lens_is_the_embedded_models_in_the_packages_format(model, lens):
    assert LENS.name == "default_lens" and (LENS / "TRAINING.md").is_file()
    config = json.loads((LENS / "config.json").read_text())
    assert tuple(config) == CONFIG_FIELDS and config["unembed_hash"] == unembed_hash(model.params["unembed.W_U"])
    assert lens.stream == "resid_pre" and len(lens) == model.cfg.n_layers and lens.notes == []


@pytest.mark.slow
def test_it_beats_the_logit_lens_at_every_layer_on_held_out_text(model, lens):
    windows, nats_to_bpb = text_windows(model.tokenizer, HELD_OUT.read_text(encoding="utf-8"), model.cfg.n_ctx)
    result = evaluate_lenses(model, windows[:HELD_OUT_WINDOWS], lens, nats_to_bpb=nats_to_bpb)
    logit, tuned = result.metrics["logit"]["kl"], result.metrics["tuned"]["kl"]
    assert all(t < g for t, g in zip(tuned, logit)), (tuned, logit)


def test_the_training_record_is_true(model, lens):
    """TRAINING.md's sha256 table is the files'; training_log.json holds the recipe's settings, a
    line per step, and held-out numbers (on the three held-out works; re-measuring them needs the
    sdist) with the tuned lens ahead at every layer, which TRAINING.md quotes; params.pt is float32."""
    text = (LENS / "TRAINING.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"\| `([\w.]+)` \| `([0-9a-f]{64})` \|", text))
    assert set(table) == {"config.json", "params.pt", "training_log.json"}
    for name, digest in table.items():
        assert hashlib.sha256((LENS / name).read_bytes()).hexdigest() == digest, name
    log = json.loads((LENS / "training_log.json").read_text())
    import sys

    sys.path.insert(0, str(LENS.parent))
    from train_default_lens import SETTINGS, STORED_DTYPE

    assert log["settings"] == SETTINGS.__dict__ and log["stored_dtype"] == STORED_DTYPE
    assert len(log["kl"]) == SETTINGS.steps and log["lr"][0] == pytest.approx(SETTINGS.lr)
    held = log["held_out"]["nats"]["lenses"]
    assert all(t < g for t, g in zip(held["tuned"]["kl"], held["logit"]["kl"]))
    for M, label in enumerate(log["held_out"]["layers"]):  # TRAINING.md quotes the log's numbers
        assert f"| `{label}` | {held['logit']['kl'][M]:.4f} " in text and f"| {held['tuned']['kl'][M]:.4f} " in text
    assert lens.translators[0][0].dtype == np.float64  # read in the model's dtype; stored in float32:
    from refgpt.files.torch_zip import read_state_dict

    assert {a.dtype for a in read_state_dict(LENS / "params.pt").values()} == {np.dtype(np.float32)}


@pytest.mark.slow
def test_refgpt_lens_kind_tuned_uses_it_by_default(refgpt_cli, model, lens):
    out = refgpt_cli.in_process("lens", "To be, or not to", "--bos", "--kind", "tuned", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["kind"] == "tuned lens" and Path(answer["lens"]) == LENS
    ids, probs = lens.run(model.to_tokens("To be, or not to", prepend_bos=True)).top(1)
    for j, row in enumerate(answer["cells"]):
        assert [c["top"]["id"] for c in row] == ids[:, 0, j, 0].tolist()
        assert [c["probability"] for c in row] == probs[:, 0, j, 0].tolist()
    table = refgpt_cli.in_process("lens", "To be, or not to", "--bos", "--kind", "tuned")
    assert table.returncode == 0 and f"lens: {LENS} (resid_pre)" in table.stdout


def test_a_hub_style_copy_with_the_misspelled_key_says_so(refgpt_cli, tmp_path):
    shutil.copytree(LENS, tmp_path / "lens")
    raw = json.loads((tmp_path / "lens" / "config.json").read_text())
    raw["unemebd_hash"] = raw.pop("unembed_hash")
    (tmp_path / "lens" / "config.json").write_text(json.dumps(raw))
    out = refgpt_cli.in_process("lens", "Hi", "--kind", "tuned", "--lens", tmp_path / "lens")
    assert out.returncode == 0, out.stderr
    assert "spells the unembedding hash 'unemebd_hash'" in out.stdout


@pytest.mark.peer
def test_the_package_reads_the_shipped_lens_as_it_is(model, lens):
    from tuned_lens_peer import hf_lens_forward, lens_forward_bound, require_tuned_lens

    require_tuned_lens()
    import transformers
    from tuned_lens import TunedLens as PackageLens

    hf = transformers.GPT2LMHeadModel.from_pretrained(str(model.source))
    theirs = PackageLens.from_model_and_pretrained(hf, str(LENS))
    assert theirs.config.unembed_hash == json.loads((LENS / "config.json").read_text())["unembed_hash"]
    _, cache = model.run_with_cache(model.to_tokens("Fair is foul, and foul is fair"))
    u32, u64 = np.finfo(np.float32).eps / 2, np.finfo(np.float64).eps / 2
    for i in range(model.cfg.n_layers):
        h = cache["resid_pre", i].astype(np.float32).astype(np.float64)  # the float32 values the package reads
        W, b = lens.translators[i]
        bound = lens_forward_bound(model, W, b, h, u32) + lens_forward_bound(model, W, b, h, u64)
        assert np.all(np.abs(lens.forward(h, i) - hf_lens_forward(theirs, h, i)) <= bound), i
