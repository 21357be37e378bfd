"""What the sweep's tests share: the embedded model, a corpus of prompts (text, tokens, and
prompts that must fail), and the serial sweeps every distributed run is compared with."""

from __future__ import annotations

import json

import numpy as np
import pytest

import refgpt
from refgpt.sweep import run_sweep

#: The corpus: ids in an order a string sort would get wrong, text and tokens, and four that fail
#: for some task (out of the vocabulary, longer than the context, one token, an empty text).
TEXTS = {"1": "To be, or not to be, that is the question", "2": "My lord, I", "10": "The king is dead; long live",
         "9": "What light through yonder window breaks?", "b": "O Romeo, Romeo, wherefore art thou",
         "a": " Now is the winter of our discontent", "long": "and " * 200, "empty": ""}
TOKENS = {"tok": [5, 17, 300, 2048, 8000, 12], "bad-vocab": [5, 99999, 7], "one": [42]}
FAILING = {"long", "bad-vocab", "empty"}  # for every task; "one" fails where a next token is needed


def write_corpus(path, order=None):
    items = [{"id": k, "text": v} for k, v in TEXTS.items()] + [{"id": k, "tokens": v} for k, v in TOKENS.items()]
    if order is not None:
        items = [items[i] for i in order]
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def long_prompts(path, n=16, seed=0):
    """``n`` token prompts: four of 8 tokens, then 90–127 tokens each (slow enough to kill a
    worker, or interrupt the command, in the middle of the sweep)."""
    rng = np.random.default_rng(seed)
    lengths = [8] * 4 + rng.integers(90, 128, n - 4).tolist()
    lines = [json.dumps({"id": i, "tokens": rng.integers(0, 8192, T).tolist()}) for i, T in enumerate(lengths)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def model_dir():
    return refgpt.default_model_path()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "prompts.jsonl")


#: Options per task for the shared serial runs.
TASK_OPTIONS = {"golden": {}, "lens": {}, "attribute": {"granularity": "head"}, "loss": {},
                "attribute-target": {"target": " the", "against": " a", "granularity": "layer"}}


@pytest.fixture(scope="session")
def serial(corpus, tmp_path_factory):
    """task → (OUT, SweepResult) of a serial sweep over the corpus, made once per session."""
    made = {}

    def get(name):
        if name not in made:
            out = tmp_path_factory.mktemp(f"serial-{name}")
            made[name] = (out, run_sweep(corpus, name.split("-")[0], out, options=TASK_OPTIONS[name], workers=0))
        return made[name]

    return get


def records(out):
    """{prompt id: record} of OUT's records."""
    found = {}
    for path in sorted((out / "records").glob("*.json")):
        record = json.loads(path.read_text())
        found[record["id"]] = record
    return found
