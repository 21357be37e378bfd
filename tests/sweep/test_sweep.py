"""refgpt sweep in this process (workers=0, no Dask): PROMPTS files, each task's record against
what refgpt.load gives for that prompt, resumption, interruption, failing prompts, OUT's checks,
the progress line and the command line. The same sweeps on a LocalCluster: test_sweep_dask.py."""

from __future__ import annotations

import io
import json
import math
import shutil

import numpy as np
import pytest

import refgpt
from conftest import FAILING, TEXTS, TOKENS, records, write_corpus
from refgpt.analysis.attribution import attribute, required_hooks
from refgpt.analysis.lens import (TunedLens, fit_least_squares_translators, load_translators, logit_lens,
                                  save_translators, tuned_lens)
from refgpt.errors import RefGPTError
from refgpt.gpt2.activations import log_softmax
from refgpt.oracle import golden
from refgpt.sweep import Prompt, read_prompts, run_sweep
from refgpt.sweep.progress import Progress
from refgpt.sweep.prompts import escaped_id
from refgpt.sweep.records import SweepDirectory
from refgpt.sweep.task_lens import lens_metrics


@pytest.fixture(scope="module")
def model():
    return refgpt.load_default()


def tokens_of(model, record):
    return np.asarray(record["provenance"]["tokens"])


# ---- PROMPTS ----------------------------------------------------------------------------------


def test_a_text_file_is_one_prompt_per_line_with_line_numbers_as_ids(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("\ufeffFirst line\r\n\n  spaced  \nlast".encode() + b"\n")
    prompts = read_prompts(path)
    assert [(p.id, p.text) for p in prompts] == [("1", "First line"), ("3", "  spaced  "), ("4", "last")]


def test_prompt_id_order_puts_whole_numbers_by_value_then_strings(corpus):
    assert [p.id for p in read_prompts(corpus)] == ["1", "2", "9", "10", "a", "b", "bad-vocab", "empty", "long",
                                                    "one", "tok"]


@pytest.mark.parametrize("line, message", [
    ('{"text": "x"}', 'line 2: no "id"'),
    ('{"id": 1, "text": "x", "tokens": [1]}', "not both"),
    ('{"id": 1}', "found neither"),
    ('{"id": true, "text": "x"}', '"id" must be a string or an integer'),
    ('{"id": 1, "tokens": [1, "2"]}', '"tokens" must be a list of integer token ids'),
    ('{"id": 1, "tokens": [1, true]}', '"tokens" must be a list of integer token ids'),
    ('{"id": 1, "text": 5}', '"text" must be a string'),
    ('[1, 2]', "expected a JSON object"),
    ('{"id": 1, "text": "x"', "not valid JSON"),
    ('{"id": "0", "text": "x"}', "id '0' is already the id of line 1"),
])
def test_a_malformed_jsonl_file_is_refused_naming_the_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 0, "text": "first"}\n' + line + "\n")
    with pytest.raises(RefGPTError, match=message.replace("(", r"\(").replace("[", r"\[")) as error:
        read_prompts(path)
    assert str(path) in str(error.value)


def test_record_names_are_injective_and_short():
    ids = ["a/b", "a%2Fb", "a_b", "a.b", "é", "x" * 300, "x" * 299 + "y"]
    names = {escaped_id(i) for i in ids}
    assert len(names) == len(ids)
    assert all(len(n) <= 80 and all(c.isalnum() or c in "%_-~" for c in n) for n in names)
    same_id = [Prompt("7", text="one"), Prompt("7", text="two")]
    assert same_id[0].stem != same_id[1].stem  # the content hash tells two versions of a prompt apart


# ---- each task's record is what refgpt.load gives for that prompt -------------------------------


@pytest.mark.slow
def test_loss_records_are_the_models_per_token_loss(serial, model):
    out, result = serial("loss")
    for prompt_id, r in records(out).items():
        if r["status"] != "ok":
            continue
        expected = model(tokens_of(model, r)[None], return_type="loss", loss_per_token=True)[0]
        assert r["result"]["loss"] == expected.tolist()
        assert r["result"]["loss_sum"] == math.fsum(expected.tolist())
    assert result.summary["result"]["targets"] == sum(r["result"]["n_targets"] for r in records(out).values()
                                                      if r["status"] == "ok")


def test_text_prompts_are_tokenized_as_the_model_does(serial, model):
    for prompt_id, r in records(serial("loss")[0]).items():
        if prompt_id in TEXTS and r["status"] == "ok":
            assert r["provenance"]["tokens"] == model.to_tokens(TEXTS[prompt_id], prepend_bos=False)[0].tolist()
        elif prompt_id == "tok":
            assert r["provenance"]["tokens"] == TOKENS["tok"]


@pytest.mark.slow
def test_lens_records_are_the_logit_lens_of_refgpt_analysis(serial, model):
    for r in records(serial("lens")[0]).values():
        if r["status"] != "ok":
            continue
        tokens = tokens_of(model, r)
        logits, cache = model.run_with_cache(tokens[None])
        lens = logit_lens(cache).logits[:, 0]  # [stream, pos, d_vocab]
        log_p = log_softmax(logits[0])
        got = r["result"]["lenses"]["logit lens"]
        for M in range(len(lens)):
            kl, ce, entropy = lens_metrics(log_p, lens[M], tokens[1:])
            assert got["kl_sum"][M] == math.fsum(kl.tolist())
            assert got["cross_entropy_sum"][M] == math.fsum(ce.tolist())
            assert got["entropy_sum"][M] == math.fsum(entropy.tolist())
        assert got["kl_sum"][-1] < 1e-12  # the final stream's logit lens is the model's own prediction


@pytest.mark.slow
def test_the_translator_lens_and_a_plug_in_lens_are_the_tuned_lens_of_refgpt_analysis(tmp_path, model):
    _, cache = model.run_with_cache(model.to_tokens(TEXTS["1"], prepend_bos=False))
    path = save_translators(tmp_path / "lens.safetensors", fit_least_squares_translators(cache))
    corpus = tmp_path / "p.jsonl"
    corpus.write_text(json.dumps({"id": "9", "text": TEXTS["9"]}) + "\n")
    TunedLens(model, load_translators(path, model)).save(tmp_path / "lens-dir")  # the package's directory
    specs = {"translators": [{"translators": str(path)}],
             "directory": [{"translators": str(tmp_path / "lens-dir")}],
             "plug-in": [{"factory": "refgpt.sweep.task_lens:translator_lens", "path": str(path)}]}
    for kind, lenses in specs.items():
        out = tmp_path / kind
        run_sweep(corpus, "lens", out, options={"lenses": lenses}, workers=0)
        r = records(out)["9"]
        tokens = tokens_of(model, r)
        logits, cache = model.run_with_cache(tokens[None])
        tuned = tuned_lens(cache, path).logits[:, 0]
        name = "translators lens-dir" if kind == "directory" else "translators lens.safetensors"
        got = r["result"]["lenses"][name]
        for M in range(len(tuned)):
            kl, ce, entropy = lens_metrics(log_softmax(logits[0]), tuned[M], tokens[1:])
            assert got["kl_sum"][M] == math.fsum(kl.tolist()) and got["entropy_sum"][M] == math.fsum(entropy.tolist())
        assert list(r["result"]["lenses"]) == ["logit lens", name]


@pytest.mark.slow
def test_attribute_records_are_refgpt_attribute_of_each_next_token(serial, model):
    for r in records(serial("attribute")[0]).values():
        if r["status"] != "ok":
            continue
        tokens = tokens_of(model, r)
        logits, cache = model.run_with_cache(tokens[None, :-1], names=required_hooks(model.cfg, logits=False))
        a = attribute(cache, tokens[None, 1:], granularity="head", logits=logits)
        assert r["result"]["labels"] == a.labels
        assert r["result"]["sum"] == [math.fsum(row) for row in a.values[:, 0].tolist()]
        assert r["result"]["abs_sum"] == [math.fsum(row) for row in np.abs(a.values[:, 0]).tolist()]
        assert r["result"]["n_positions"] == len(tokens) - 1


@pytest.mark.slow
def test_attribute_records_of_a_target_at_the_last_position(serial, model):
    out, result = serial("attribute-target")
    target, against = model.to_single_token(" the"), model.to_single_token(" a")
    for r in records(out).values():
        if r["status"] != "ok":
            continue
        tokens = tokens_of(model, r)
        logits, cache = model.run_with_cache(tokens[None], names=required_hooks(model.cfg, logits=False))
        a = attribute(cache, target, against, logits=logits)
        assert r["result"]["sum"] == a.values[:, 0, -1].tolist()
        assert r["result"]["position"] == len(tokens) - 1
    assert "one" not in dict(result.failed)  # a target needs no next token


@pytest.mark.slow
def test_golden_files_hold_what_golden_compute_gives(serial, model):
    out, result = serial("golden")
    for r in records(out).values():
        if r["status"] != "ok":
            continue
        g = golden.read(out / r["result"]["file"]["path"])
        expected = golden.compute(model, tokens_of(model, r))
        assert list(g.tensors) == list(expected)
        for name, value in expected.items():
            assert np.array_equal(g.tensors[name], value), name
        assert json.loads(g.metadata["command"])[-2:] == ["--prompt-id", r["id"]]
    assert result.summary["result"]["files"] == len(list((out / "goldens").iterdir()))


@pytest.mark.slow
def test_compare_against_the_sweeps_own_goldens_passes_and_an_edited_one_fails_first_where_edited(serial, corpus,
                                                                                                  tmp_path):
    goldens = serial("golden")[0] / "goldens"
    candidates = tmp_path / "candidates"
    candidates.mkdir()
    for path in goldens.iterdir():
        tensors = dict(golden.read(path).tensors)
        if path.name.startswith("9."):
            tensors["blocks.1.hook_resid_mid"] = tensors["blocks.1.hook_resid_mid"] + 1e-3  # a port's bug
        np.savez(candidates / f"{path.name.split('.')[0]}.npz", **tensors)  # named by id alone
    out = tmp_path / "verdicts"
    result = run_sweep(corpus, "compare", out, options={"candidates": str(candidates)}, workers=0)
    s = result.summary["result"]
    assert s["not_ok_prompts"] == ["9"] and s["ok"] == s["candidates"] - 1
    assert s["first_divergence"] == [{"tensor": "blocks.1.hook_resid_mid", "prompts": 1}]
    assert dict(result.failed)["one"].startswith("the prompt is 1 token long")


# ---- failing prompts ---------------------------------------------------------------------------


def test_failing_prompts_are_recorded_with_their_one_line_error_and_the_others_run(serial, corpus):
    out, result = serial("loss")
    failed = dict(result.failed)
    assert set(failed) == FAILING | {"one"}
    assert failed["long"] == "the prompt is 201 tokens long, but the model's context holds at most 128"
    assert "id 99999 at position 1 is outside the vocabulary [0, 8192)" in failed["bad-vocab"]
    assert failed["empty"].startswith("the prompt is empty")
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [m["id"] for m in manifest] == [p.id for p in read_prompts(corpus)]
    assert {m["id"]: m.get("error") for m in manifest if m["status"] == "failed"} == failed
    assert result.summary["failed"] == len(failed) and result.summary["ok"] == len(manifest) - len(failed)


@pytest.mark.slow
def test_the_command_exits_1_with_the_count_of_failed_prompts(refgpt_cli, corpus, tmp_path):
    r = refgpt_cli.in_process("sweep", corpus, "--task", "loss", "-o", tmp_path / "o", "--workers", "0")
    assert r.returncode == 1
    assert r.stderr.startswith("refgpt: error: 4 of 11 prompts failed") and r.stderr.count("\n") == 1
    assert "mean loss" in r.stdout
    again = refgpt_cli.in_process("sweep", corpus, "--task", "loss", "-o", tmp_path / "o", "--workers", "0", "--json")
    answer = json.loads(again.stdout)
    assert again.returncode == 1 and answer["ran"] == 4 and answer["skipped"] == 7  # the failed ones are tried again


def test_a_sweep_without_failures_exits_0(refgpt_cli, tmp_path):
    (tmp_path / "p.txt").write_text("To be, or not\nMy lord\n")
    r = refgpt_cli.in_process("sweep", tmp_path / "p.txt", "--task", "lens", "-o", tmp_path / "o", "--workers", "0")
    assert r.returncode == 0 and r.stderr == "" and "final_post" in r.stdout


# ---- resumption, interruption, OUT --------------------------------------------------------------


@pytest.mark.slow
def test_a_rerun_runs_only_the_prompts_without_a_verified_record(serial, corpus, tmp_path):
    out, first = serial("golden")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    stems = {p.id: p.stem for p in read_prompts(corpus)}
    ok = sorted(p for p, r in records(copy).items() if r["status"] == "ok")
    (copy / "records" / f"{stems[ok[0]]}.json").unlink()  # a missing record
    damaged = copy / "records" / f"{stems[ok[1]]}.json"
    damaged.write_text(damaged.read_text().replace('"loss_sum": ', '"loss_sum": 1'))  # an edited one
    golden_file = copy / "goldens" / f"{stems[ok[2]]}.safetensors"
    golden_file.write_bytes(golden_file.read_bytes()[:-1] + b"\x00")  # a golden file changed under its record
    (copy / "summary.json").unlink()
    result = run_sweep(corpus, "golden", copy, workers=0)
    assert result.ran == 3 + len(first.failed) and result.skipped == len(ok) - 3
    assert (copy / "summary.json").read_bytes() == (out / "summary.json").read_bytes()


@pytest.mark.slow
def test_ctrl_c_leaves_only_complete_records_and_a_rerun_finishes_the_same(serial, corpus, tmp_path):
    out = tmp_path / "o"
    seen = []

    def interrupt(prompt, record):
        seen.append(prompt.id)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(corpus, "golden", out, workers=0, on_record=interrupt)
    assert sorted(records(out)) == sorted(seen)
    assert not (out / "summary.json").exists() and not list(out.rglob("*.tmp"))
    assert len(list((out / "goldens").iterdir())) == sum(records(out)[i]["status"] == "ok" for i in seen)
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert sum(m["status"] == "missing" for m in manifest) == len(manifest) - 3
    result = run_sweep(corpus, "golden", out, workers=0)
    assert result.ran == len(manifest) - 3 + sum(records(out)[i]["status"] == "failed" for i in seen)
    assert (out / "summary.json").read_bytes() == (serial("golden")[0] / "summary.json").read_bytes()


@pytest.mark.slow
def test_the_summary_does_not_depend_on_the_order_of_the_prompts_file(serial, tmp_path):
    shuffled = write_corpus(tmp_path / "shuffled.jsonl", order=np.random.default_rng(3).permutation(11).tolist())
    run_sweep(shuffled, "lens", tmp_path / "o", workers=0)
    assert (tmp_path / "o" / "summary.json").read_bytes() == (serial("lens")[0] / "summary.json").read_bytes()


def test_out_of_another_sweep_is_refused(serial, corpus):
    out = serial("lens")[0]
    with pytest.raises(RefGPTError, match="holds a sweep with another dtype"):
        run_sweep(corpus, "lens", out, workers=0, dtype="float32")
    with pytest.raises(RefGPTError, match="holds a sweep with another options, task"):
        run_sweep(corpus, "loss", out, workers=0)


def test_one_sweep_at_a_time_writes_to_out(tmp_path):
    with SweepDirectory(tmp_path / "o"):
        with pytest.raises(RefGPTError, match="another sweep is writing to it now"):
            SweepDirectory(tmp_path / "o")
    SweepDirectory(tmp_path / "o").close()  # free again


def test_float32_records_say_float32(tmp_path):
    (tmp_path / "p.txt").write_text("To be, or not\n")
    result = run_sweep(tmp_path / "p.txt", "loss", tmp_path / "o", workers=0, dtype="float32")
    r = records(tmp_path / "o")["1"]
    assert r["provenance"]["dtype"] == "float32" and result.summary["dtype"] == "float32"
    model = refgpt.load_default(dtype="float32")
    assert r["result"]["loss"] == model(np.array(r["provenance"]["tokens"]), return_type="loss",
                                        loss_per_token=True)[0].tolist()


# ---- the progress line, the command line ---------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_shows_done_rate_and_eta():
    clock = iter([0.0, 2.0, 4.0])
    stream = Terminal()
    progress = Progress(10, skipped=2, stream=stream, clock=lambda: next(clock))
    progress.update()
    progress.update(failed=True)
    assert stream.getvalue().split("\r")[1:] == [
        "sweep: 3/10 prompts · 0.5 prompts/s · eta 14 s\x1b[K",
        "sweep: 4/10 prompts (1 failed) · 0.5 prompts/s · eta 12 s\x1b[K"]
    quiet = io.StringIO()
    Progress(10, stream=quiet).update()
    assert quiet.getvalue() == ""  # not a terminal: nothing


@pytest.mark.parametrize("argv, message", [
    (["--task", "loss", "--candidates", "x"], "--candidates goes with --task compare, not --task loss"),
    (["--task", "attribute", "--target", "a", "--target-id", "3"], "give --target or --target-id, not both"),
    (["--task", "attribute", "--pos", "2"], "--pos goes with --target"),
    (["--task", "compare"], "--task compare needs --candidates DIR"),
    (["--task", "lens", "--translators", "nowhere.safetensors"], "nowhere.safetensors: file not found"),
    (["--task", "lens", "--workers", "1", "--scheduler", "tcp://127.0.0.1:1"], "not both"),
    (["--task", "lens", "--workers", "0", "--blas-threads", "2"], "--workers 0 runs in this process"),
])
def test_bad_options_are_one_line(refgpt_cli, tmp_path, argv, message):
    (tmp_path / "p.txt").write_text("x\n")
    r = refgpt_cli.in_process("sweep", tmp_path / "p.txt", "-o", tmp_path / "o", *argv)
    assert r.returncode in (1, 2) and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_without_dask_the_command_says_which_extra_to_install(refgpt_cli, tmp_path, monkeypatch):
    import sys

    (tmp_path / "p.txt").write_text("To be\n")
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the dask extra were not installed
    monkeypatch.delitem(sys.modules, "refgpt.sweep.on_dask", raising=False)
    r = refgpt_cli.in_process("sweep", tmp_path / "p.txt", "--task", "loss", "-o", tmp_path / "o")
    assert r.returncode == 1 and "pip install 'refgpt[dask]'" in r.stderr and "--workers 0" in r.stderr
    assert refgpt_cli.in_process("sweep", tmp_path / "p.txt", "--task", "loss", "-o", tmp_path / "o",
                                 "--workers", "0").returncode == 0


@pytest.mark.slow
def test_the_golden_size_formula_of_docs_sweep_md_counts_every_number(serial, model):
    """docs/sweep.md §5: T·(L·(13d + 2·d_mlp) + 4d + 2V) + 2·L·H·T² numbers; the rest of the file is
    the header and the small tensors (tokens, targets, loss, each LayerNorm's mean and scale)."""
    c = model.cfg
    for r in records(serial("golden")[0]).values():
        if r["status"] != "ok":
            continue
        T = len(r["provenance"]["tokens"])
        path = serial("golden")[0] / r["result"]["file"]["path"]
        data = path.stat().st_size - 8 - int.from_bytes(path.read_bytes()[:8], "little")
        formula = T * (c.n_layers * (13 * c.d_model + 2 * c.d_mlp) + 4 * c.d_model + 2 * c.d_vocab) \
            + 2 * c.n_layers * c.n_heads * T * T
        small = T + 2 * (T - 1) + (2 * c.n_layers + 1) * 2 * T  # tokens, targets and loss, LN means and scales
        assert data == 8 * (formula + small)


def test_golden_names_keeps_the_tensors_asked_for(tmp_path):
    (tmp_path / "p.txt").write_text("To be, or not\n")
    run_sweep(tmp_path / "p.txt", "golden", tmp_path / "o", options={"names": ["blocks.*.hook_resid_post"]}, workers=0)
    (path,) = (tmp_path / "o" / "goldens").iterdir()
    assert list(golden.read(path).tensors) == ["tokens", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                                               "blocks.2.hook_resid_post", "blocks.3.hook_resid_post", "logits",
                                               "log_probs", "targets", "loss"]


def test_blas_info_is_numpys_whatever_else_loaded_a_blas(monkeypatch):
    """A package with a BLAS of its own (scipy's OpenBLAS, loaded by sae-lens's imports) may come first
    in threadpoolctl's list: the record names NumPy's (the one in numpy.libs), or a sweep's serial and
    Dask summaries disagree (CI found it after the SAE and runtime extras joined the suite)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from pathlib import Path

    from refgpt.sweep.worker import blas_info

    mine = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"
            and Path(i["filepath"]).resolve().parent.name == "numpy.libs"]
    if not mine:
        pytest.skip("this NumPy's BLAS is not a wheel's numpy.libs")
    other = {**mine[0], "filepath": "/elsewhere/scipy.libs/libscipy_openblas.so", "version": "0.0.other"}
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [other, mine[0]])
    assert blas_info()["version"] == mine[0]["version"] != "0.0.other"
