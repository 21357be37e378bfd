"""TransformerLens's demo notebooks, cell by cell, on refgpt's torch-facing model and on TransformerLens.

The GPT-2 cells of Main_Demo, Exploratory_Analysis, Activation_Patching, Attribution_Patching,
Head_Detector, Direct_Logit_Attribution, Patchscopes and SVD_Interpreter (vendored from the
TransformerLens 3.9.0 sdist: notebooks/PROVENANCE.md) run unchanged but for the loading line, in
three processes at once (tests/tl_torch/notebook_runner.py): refgpt's torch-facing model;
TransformerLens 3.9's HookedTransformer; TransformerLens 4's TransformerBridge (when it can be
fetched, tests/tl_torch/tl4.py). All three load the same random GPT-2 checkpoints (d_vocab 50,257
and GPT-2's tokenizer; 12 layers of 12 heads as "gpt2", 6 as "distilgpt2", 24 × 16 as
"gpt2-medium", 48 × 25 as "gpt2-xl"), in float64, TransformerLens's weight processing kept in
float64 (tests/peers.py).

Each cell is compared with TransformerLens 3.9 when it runs there, else with the bridge
(notebook_compare.py says what "agrees" means: float64's bound for numbers, every variable, every
figure's data, what is printed). tests/tl_torch/notebook_cells.py lists, with reasons, the cells
that are not GPT-2's, the departures (each a row of docs/transformerlens.md §2) and the cells left
for the long run; every other cell that runs on TransformerLens must run on refgpt and agree. A
listed departure that no longer differs fails too, so the list stays true.

The default run leaves out the cells TransformerLens's CI skips (``# NBVAL_SKIP``) and the slow
loops listed in notebook_cells.LONG (thousands of forward passes of a 50,257-token model), and runs
the bridge only on the notebooks TransformerLens 3.9 cannot run in full (notebook_cells.BRIDGE_DEFAULT);
``REFGPT_NOTEBOOKS=long`` runs every cell on all three but notebook_cells.VERY_LONG's (an hour or two
on two cores), ``REFGPT_NOTEBOOKS=all`` those too. ``REFGPT_NOTEBOOK_REPORT=FILE`` writes
the per-cell verdicts as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import peers as P

torch, transformers, transformer_lens = P.require_peers()
pytest.importorskip("IPython", reason="the notebooks run in an IPython shell (the test extra's ipython)")

import notebook_cells as cells  # noqa: E402
import tl4  # noqa: E402
import tl_port  # noqa: E402
from notebook_compare import compare_runs  # noqa: E402

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted((HERE / "notebooks").glob("*.ipynb"))
MODE = os.environ.get("REFGPT_NOTEBOOKS", "")
LONG = MODE in ("long", "all")
#: name → (n_layers, n_heads, d_head) of the random checkpoint standing in for it.
SHAPES = {"gpt2": (12, 12, 2), "distilgpt2": (6, 12, 2), "gpt2-medium": (24, 16, 2), "gpt2-xl": (48, 25, 1)}
ALIASES = {"openai-community/gpt2": "gpt2"}
RESULTS: dict = {}


@pytest.fixture(scope="session")
def notebook_checkpoints(tmp_path_factory):
    tl_port.tokenizer_files_or_skip()
    root = tmp_path_factory.mktemp("notebook_checkpoints")
    made = {}
    for i, (name, (layers, heads, d_head)) in enumerate(SHAPES.items()):
        if name == "gpt2-xl" and not LONG:
            continue  # only the long run's cells load it
        made[name] = str(tl_port.gpt2_checkpoint(root / name, seed=10 + i, n_layers=layers, n_embd=heads * d_head,
                                                 n_head=heads, n_positions=1024)[0])
    made.update({alias: made[name] for alias, name in ALIASES.items()})
    return made


@pytest.fixture(scope="session")
def notebook_runs(notebook_checkpoints, tmp_path_factory):
    """{(notebook, backend): records}: the three backends, each one process over every notebook, at once."""
    out = tmp_path_factory.mktemp("notebook_runs")
    skip = cells.LONG if not LONG else ({} if MODE == "all" else cells.VERY_LONG)
    common = ["--checkpoints", json.dumps(notebook_checkpoints), "--out", str(out), "--skip", json.dumps(skip)]
    common += ["--long"] if LONG else []
    runner = [sys.executable, str(HERE / "notebook_runner.py")]
    notebooks = {"refgpt": NOTEBOOKS, "tl": NOTEBOOKS,
                 "bridge": NOTEBOOKS if LONG else [nb for nb in NOTEBOOKS if nb.stem in cells.BRIDGE_DEFAULT]}
    repo = str(HERE.parents[1])
    environments = {"refgpt": {**os.environ, "PYTHONPATH": repo}, "tl": {**os.environ, "PYTHONPATH": repo}}
    tl4_dir, why_not = tl4.overlay()
    if tl4_dir is not None:
        environments["bridge"] = tl4.environment(tl4_dir)

    def run(backend):
        return subprocess.run(runner + [*map(str, notebooks[backend])] + common + ["--backend", backend],
                              env=environments[backend], capture_output=True, text=True,
                              timeout=6 * 3600 if LONG else 1800)

    with ThreadPoolExecutor(len(environments)) as pool:
        done = dict(zip(environments, pool.map(run, environments)))
    for backend, result in done.items():
        assert result.returncode == 0, f"{backend}: {result.stderr[-3000:]}"
    import pickle

    runs = {(nb.stem, backend): pickle.loads((out / f"{nb.stem}.{backend}.pkl").read_bytes())
            for backend in environments for nb in notebooks[backend]}
    runs["bridge unavailable"] = why_not
    return runs


def verdicts(runs, notebook) -> list[dict]:
    """Per cell: what ran where and the verdict against TL 3.9, or the bridge where 3.9 fails."""
    ref, tl, bridge = runs[(notebook, "refgpt")], runs[(notebook, "tl")], runs.get((notebook, "bridge"))
    ignore = cells.IGNORED_VALUES.get(notebook, {})
    against_tl = compare_runs(ref, tl, ignore)
    against_bridge = compare_runs(ref, bridge, ignore) if bridge else [None] * len(ref)
    out = []
    for r, t, vt, vb in zip(ref, tl, against_tl, against_bridge):
        i = r["index"]
        row = {"cell": i, "refgpt": r["status"], "tl": t["status"], "bridge": bridge[i]["status"] if bridge else None,
               "seconds": round(r["seconds"], 2)}
        if r["status"] == "skipped":
            row["verdict"], row["peer"] = "skipped (long)", None
        elif t["status"] == "ok":
            row["verdict"], row["peer"], row["details"] = vt.verdict, "TL 3.9", vt.details
        elif vb is not None and bridge[i]["status"] == "ok":
            row["verdict"], row["peer"], row["details"] = vb.verdict, "TL 4 bridge", vb.details
        else:
            row["verdict"], row["peer"], row["details"] = "fails on TL", None, vt.details
        out.append(row)
    return out


@pytest.mark.parametrize("notebook", [nb.stem for nb in NOTEBOOKS])
def test_notebook_cells_run_and_agree(notebook_runs, notebook):
    rows = verdicts(notebook_runs, notebook)
    RESULTS[notebook] = rows
    problems = []
    not_gpt2 = cells.NOT_GPT2.get(notebook, {})
    departures = cells.DEPARTURES.get(notebook, {})
    for row in rows:
        i, verdict = row["cell"], row["verdict"]
        where = f"{notebook} cell {i}"
        if verdict == "skipped (long)":
            continue
        if i in not_gpt2:
            if row["refgpt"] == "ok" or row["tl"] == "ok":
                problems.append(f"{where}: listed as not GPT-2's ({not_gpt2[i]}) but ran")
            continue
        if verdict == "fails on TL":
            if i not in cells.TL_FAILS.get(notebook, {}):
                problems.append(f"{where}: fails on TransformerLens, not listed in TL_FAILS: {row['details'][:2]}")
            continue
        if i in departures:
            if verdict == "match":
                problems.append(f"{where}: listed as a departure ({departures[i]}) but agrees with {row['peer']}")
            continue
        if verdict != "match":
            problems.append(f"{where}: {verdict} against {row['peer']}: {'; '.join(row['details'][:3])[:600]}")
    assert not problems, "\n".join(problems)


def test_notebook_summary(notebook_runs):
    """The counts docs/transformerlens.md reports (printed; written to $REFGPT_NOTEBOOK_REPORT)."""
    for nb in NOTEBOOKS:
        RESULTS.setdefault(nb.stem, verdicts(notebook_runs, nb.stem))
    summary = {}
    for notebook, rows in RESULTS.items():
        kinds = {}
        for row in rows:
            kind = ("not GPT-2" if row["cell"] in cells.NOT_GPT2.get(notebook, {}) else
                    "departure" if row["cell"] in cells.DEPARTURES.get(notebook, {}) and row["verdict"] != "skipped (long)"
                    else row["verdict"] + (f" ({row['peer']})" if row["verdict"] == "match" else ""))
            kinds[kind] = kinds.get(kind, 0) + 1
        kinds["seconds (refgpt)"] = round(sum(row["seconds"] for row in rows), 1)
        summary[notebook] = kinds
    print(json.dumps(summary, indent=1))
    table = markdown_table(summary)
    print(table)
    report = os.environ.get("REFGPT_NOTEBOOK_REPORT")
    if report:
        Path(report).write_text(json.dumps({"long": LONG, "bridge": notebook_runs["bridge unavailable"] or "ran",
                                            "summary": summary, "table": table, "cells": RESULTS},
                                           indent=1, default=str) + "\n")
    assert summary
    if not LONG:  # docs/transformerlens.md §4 shows the default run's counts (its seconds are one run's)
        page = (HERE.parents[1] / "docs" / "transformerlens.md").read_text(encoding="utf-8")
        shown = page.split("## 4. ", 1)[1].split("The long run", 1)[0]
        assert _counts(shown) == _counts(table), "docs/transformerlens.md §4's table is not this run's:\n" + table


def _counts(markdown: str) -> dict:
    """notebook → its row of a §4 table without the last column (seconds)."""
    rows = [line.split("|")[1:-1] for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]
    return {row[0].strip(): [c.strip() for c in row[1:-1]] for row in rows if row[0].strip() != "notebook"}


def markdown_table(summary) -> str:
    """The per-notebook counts as docs/transformerlens.md §4 shows them."""
    columns = ["code cells", "not GPT-2", "left for the long run", "agree with TL 3.9", "agree with TL 4's bridge",
               "departures (§2)", "TL cannot run", "seconds (refgpt)"]
    rows = ["| notebook | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    totals = [0] * len(columns)
    for notebook, kinds in summary.items():
        counts = [sum(v for k, v in kinds.items() if k != "seconds (refgpt)"), kinds.get("not GPT-2", 0),
                  kinds.get("skipped (long)", 0), kinds.get("match (TL 3.9)", 0), kinds.get("match (TL 4 bridge)", 0),
                  kinds.get("departure", 0), kinds.get("fails on TL", 0), kinds.get("seconds (refgpt)", 0)]
        other = counts[0] - sum(counts[1:7])
        assert other == 0, f"{notebook}: {kinds}"  # every cell is one of the columns (no unexplained 'differs')
        totals = [t + c for t, c in zip(totals, counts)]
        rows.append(f"| {notebook} | " + " | ".join(str(round(c, 1)) for c in counts) + " |")
    rows.append("| **all** | " + " | ".join(f"**{round(t, 1)}**" for t in totals) + " |")
    return "\n".join(rows)
