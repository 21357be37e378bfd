"""benchmarks/mutation.py --local (benchmarks/MUTATION.md's last section): how a forward mutant's dump
is classified — the first tensor that differs from the unmutated forward's is the op the mutant
changed, and the first local flag names it or not — and that the full report keeps the section."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from doc_pages import load_script
from random_models import random_params
from refgpt import Config, Model

mutation = load_script(Path(__file__).resolve().parents[2] / "benchmarks" / "mutation.py")
CFG = Config(**mutation._LOCAL_CFG)
PARAMS = random_params(CFG, seed=0, scale=0.3)
TOKENS = np.random.default_rng(0).integers(0, CFG.d_vocab, (1, 8))  # [batch, pos]


def forward(**edits):
    """refgpt's float64 forward, dumped as a port's, with ``edits`` (name → function of the array)."""
    logits, cache = Model(CFG, PARAMS).run_with_cache(TOKENS)
    acts = {**cache.cache_dict, "logits": logits}
    return {k: edits[k](v) if k in edits else v for k, v in acts.items()}


def judged(acts, reference):
    mutant = mutation.Mutant("attention", "attention", "attention", 1, "arith", "a", "b", source="x = a")
    from refgpt.oracle import local
    order = [v.name for v in local.judge(PARAMS, CFG, TOKENS, reference, "float64").ops]
    return mutation._judge_mutant(mutant, acts, reference, order, (PARAMS, CFG, TOKENS), "float64")


def test_each_outcome_of_a_mutants_dump():
    reference = forward()
    z = "blocks.1.attn.hook_z"
    named = judged(forward(**{z: lambda a: a * 1.01}), reference)
    assert (named.outcome, named.changed, named.first) == ("named", z, f"z at {z}")
    assert judged(forward(), reference).outcome == "unchanged"
    dropped = {k: v for k, v in reference.items() if k != "blocks.0.ln1.hook_mean"}
    assert judged(dropped, reference).outcome == "not dumped"
    assert judged("ValueError: repeated axis in transpose", reference).outcome == "error"
    tiny = judged(forward(**{z: lambda a: a * (1 + 2.0 ** -52)}), reference)  # one ulp: a rounding
    assert (tiny.outcome, tiny.changed) == ("within bounds", z)


def test_the_report_keeps_the_local_section(tmp_path):
    md = tmp_path / "MUTATION.md"
    section = mutation.local_section([mutation.LocalResult("layernorm", "f", 3, "x = a", "delete", "within bounds",
                                                           "blocks.0.ln1.hook_scale")], "A note.")
    mutation.write_report([], md, tmp_path / "MUTATION.json")
    mutation.write_local_section(md, section)
    mutation.write_report([], md, tmp_path / "MUTATION.json")  # the tests' report again: the section stays
    text = md.read_text()
    assert text.count(mutation.LOCAL_SECTION) == 1 and text.endswith(section)
    assert "| layernorm | 1 | 0 | 0 | 1 | 0 | 0 | 0 |" in text
    mutation.write_local_section(md, section.replace("A note.", "Another."))  # replaced, not appended
    assert md.read_text().count(mutation.LOCAL_SECTION) == 1 and "Another." in md.read_text()
