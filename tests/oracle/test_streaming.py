"""Streaming goldens and comparisons (issue 17): ``write_streamed`` writes the same bytes as the
in-memory ``write(make(…))``, one forward stage at a time; the reference ``safetensors`` package
reads the files; ``compare`` walking a tensor a block of rows at a time gives the same report as
one block per tensor."""

from __future__ import annotations

import json
import mmap
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file

import refgpt
from random_models import model_and_tokens, random_model, save_checkpoint
from refgpt import Config, Model, RefGPTError, threads
from refgpt.oracle import comparison, golden
from refgpt.files.safetensors_file import SafetensorsFile, SafetensorsWriter

CFG = Config(d_model=16, n_layers=3, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=8)
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]])


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=model_and_tokens(), dtype=st.sampled_from(["float64", "float32"]),
       names=st.sampled_from([None, ["blocks.*.hook_resid_post"], ["*ln1*", "blocks.0.*"], ["*attn_scores"]]))
def test_streamed_golden_is_the_in_memory_golden_byte_for_byte(tmp_path, case, dtype, names):
    model, tokens = case
    if dtype == "float32":
        model = type(model)(model.cfg, dict(model.params), dtype="float32")
    chosen = golden.select(model, names) if names else None
    in_memory = golden.write(tmp_path / "a.safetensors", golden.make(model, tokens, chosen, command=["t"]))
    streamed = golden.write_streamed(tmp_path / "b.safetensors", model, tokens, chosen, command=["t"])
    assert in_memory.read_bytes() == streamed.read_bytes()
    assert not list(tmp_path.glob("*.partial"))


def test_the_reference_safetensors_package_reads_a_streamed_golden(tmp_path):
    model = random_model(CFG, seed=5)
    path = golden.write_streamed(tmp_path / "g.safetensors", model, TOKENS, command=["t"])
    expected = golden.compute(model, TOKENS)
    tensors = load_file(str(path))
    assert set(tensors) == set(expected)
    for name, value in expected.items():
        assert tensors[name].dtype == value.dtype and np.array_equal(tensors[name], value), name
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
    assert meta["format"] == "refgpt-golden" and json.loads(meta["command"]) == ["t"]
    floats = {n for n, a in expected.items() if a.dtype.kind == "f"}
    assert set(json.loads(meta["conditioning"])) == floats | {"probs"}  # probs: measured for llm.c candidates
    assert set(json.loads(meta["row_freedom"])) == {"log_probs", "probs", *(n for n in floats if n.endswith("hook_pattern"))}
    assert list(golden.read(path).tensors) == list(expected)  # stored in forward order


def test_layout_from_the_config_matches_the_tensors_made():
    model = random_model(CFG, seed=1)
    made = golden.compute(model, TOKENS[:, :5])
    assert {n: (a.dtype, a.shape) for n, a in made.items()} == golden.layout(model, (2, 5))
    assert list(golden.layout(model, (2, 5))) == list(made)


def test_stream_holds_one_stage_at_a_time():
    """Block L's tensors come out before block L + 1 starts: nothing waits for the whole pass."""
    model = random_model(CFG, seed=2)
    started = []
    hook = ("blocks.{}.hook_resid_pre", lambda a, name: started.append(name))
    hooks = [(hook[0].format(L), hook[1]) for L in range(CFG.n_layers)]
    for name, _ in golden.stream(model, TOKENS, fwd_hooks=hooks):
        if name.startswith("blocks."):
            assert len(started) == int(name.split(".")[1]) + 1, name


def test_stream_makes_log_probs_only_after_the_logits_are_read(monkeypatch):
    """A reader measuring the logits (the golden's error model) does not hold every pass's log_probs
    beside them: at GPT-2 medium's shape and T = 1024 that is 1 GB (benchmarks/RESULTS.md, memory-issue38)."""
    made, softmax = [], golden.log_softmax
    monkeypatch.setattr(golden, "log_softmax", lambda x: made.append(1) or softmax(x))
    names = [name for name, _ in golden.stream(random_model(CFG, seed=2), TOKENS) if name in ("logits", "log_probs")
             and not (name == "logits" and made)]
    assert names == ["logits", "log_probs"] and made == [1]


def _whole_tensor_error(name, r, x):
    """float32_error as one block, the whole tensor's arrays at once (the golden's format-2 measure)."""
    from refgpt.reference.compare import F32_TINY, inner_name, row_adjusted, row_freedom_of

    r, x = (np.exp(np.asarray(a.log_probs, np.float64)) if isinstance(a, golden._Probs) else a for a in (r, x))
    r, (x, freedom) = np.asarray(r, np.float64), row_adjusted(name, np.asarray(r, np.float64), np.asarray(x, np.float64))
    f = float(np.max(np.abs(freedom), initial=0.0) / 2**-24) if row_freedom_of(name) and row_freedom_of(name)[1] else None
    compared = np.isfinite(r) & ((r >= F32_TINY) if inner_name(name) == "probs" else True)
    err = np.abs(x[compared] - r[compared]) / (r[compared] if inner_name(name) == "probs" else 1.0)
    if not err.size:
        return 0.0, 0.0, f
    return float(err.max() / 2**-24), float(np.sqrt(np.mean(np.square(err))) / 2**-24), f


def _error_model_cases():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(2, 3, 9, 9)) * 4  # [batch, head, query, key]
    scores[..., np.triu_indices(9, 1)[0], np.triu_indices(9, 1)[1]] = -np.inf
    pattern = np.exp(scores - scores.max(-1, keepdims=True))
    pattern /= pattern.sum(-1, keepdims=True)  # [batch, head, query, key], 0 above the diagonal
    logits = rng.normal(size=(2, 7, 300)) * 3  # [batch, pos, d_vocab]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    gaps = log_probs.copy()
    gaps[1, 2, 5], gaps[0, 4] = np.nan, -np.inf  # a shift then read by nanmedian: one block
    probs = np.exp(log_probs * 12)  # many below float32's smallest normal
    resid = rng.normal(size=(2, 7, 16))

    def near(a, size=3e-7, shift=None):  # a float32 pass of ``a``: a little off, each row shifted or scaled
        noise = rng.normal(size=a.shape) * size
        with np.errstate(invalid="ignore"):
            return (a * (1 + noise) if shift is None else a + noise + shift).astype(np.float32)

    row_shift = rng.normal(size=(2, 7, 1)) * 1e-6
    return [("logits", logits, near(logits, shift=row_shift)), ("log_probs", log_probs, near(log_probs, shift=row_shift)),
            ("step.1.log_probs", gaps, near(gaps, shift=row_shift)), ("probs", probs, near(probs)),
            ("probs", golden._Probs(log_probs * 12), golden._Probs(near(log_probs * 12, shift=row_shift))),  # made by blocks
            ("blocks.0.attn.hook_pattern", pattern, near(pattern)), ("blocks.0.attn.hook_attn_scores", scores, near(scores)),
            ("blocks.0.hook_resid_post", resid, near(resid)), ("loss_mean", np.float64(2.5), np.float32(2.5001)),
            ("loss", np.zeros((1, 0)), np.zeros((1, 0), np.float32))]


@pytest.mark.parametrize("name, r, x", _error_model_cases(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("block_bytes", [1, 3000, 2**30])  # a row per block, a few rows, the whole tensor
def test_the_error_model_by_blocks_of_rows_is_the_whole_tensors_bit_for_bit(monkeypatch, name, r, x, block_bytes):
    monkeypatch.setattr(golden, "ERROR_BLOCK_BYTES", block_bytes)
    with threads.limit(2, parallel_bytes=0):  # the blocks on two threads, however small
        measured = golden.float32_error(name, r, x)
    assert repr(measured) == repr(_whole_tensor_error(name, r, x))
    if name != "loss":  # and a pass is counted where it is finite wherever the reference is
        assert golden._finite_where_finite(r, x) and not golden._finite_where_finite(r, np.full(np.shape(r), np.nan))
    assert measured[0] > 0 or name == "loss"


def test_writer_fails_closed_and_leaves_no_file(tmp_path):
    layout = {"a": (np.float64, (2, 3)), "b": (np.int64, (4,))}
    path = tmp_path / "x.safetensors"
    with pytest.raises(RefGPTError, match="never written.*'b'"):
        with SafetensorsWriter(path, layout) as w:
            w.write("a", np.zeros((2, 3)))
    assert list(tmp_path.iterdir()) == []  # not even NAME.partial
    with pytest.raises(RefGPTError, match="never written.*'b'"):  # the first fault is the one named
        with SafetensorsWriter(path, layout, {"c": ""}, header_length=200) as w:
            w.write("a", np.zeros((2, 3)))
            w.metadata = {"c": "x" * 500}
    with pytest.raises(RefGPTError, match="'a' is float32 \\[2, 3\\], the header says float64"):
        with SafetensorsWriter(path, layout) as w:
            w.write("a", np.zeros((2, 3), np.float32))
    with pytest.raises(RefGPTError, match="'c' is not in the header"):
        with SafetensorsWriter(path, layout) as w:
            w.write("c", np.zeros(1))
    assert list(tmp_path.iterdir()) == []
    with SafetensorsWriter(path, layout, {"k": "v"}) as w:  # any order, strided input
        w.write("b", np.arange(8)[::2])
        w.write("a", np.arange(6.0).reshape(3, 2).T)
    got = load_file(str(path))
    assert np.array_equal(got["a"], np.arange(6.0).reshape(3, 2).T) and np.array_equal(got["b"], [0, 2, 4, 6])


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_a_failed_write_closes_its_file(tmp_path):
    """A writer given up (an error inside its with block) closes the partial file, not just unlinks it."""
    before, writers = _open_fds(), []
    for _ in range(3):
        with pytest.raises(RefGPTError, match="'b' is not in the header"):
            with SafetensorsWriter(tmp_path / "x.safetensors", {"a": (np.float64, (2,))}) as w:
                writers.append(w)  # still referenced: only abort can have closed its file
                w.write("b", np.zeros(1))
    assert _open_fds() == before and list(tmp_path.iterdir()) == []


def test_a_writer_that_cannot_write_or_is_closed_twice_fails_closed(tmp_path):
    with pytest.raises(RefGPTError, match="cannot write"):
        SafetensorsWriter(tmp_path / "no such directory" / "x.safetensors", {"a": (np.float64, (2,))})
    with pytest.raises(RefGPTError, match="never written"):  # close() inside the block: its error, not abort's
        with SafetensorsWriter(tmp_path / "x.safetensors", {"a": (np.float64, (2,))}) as w:
            w.close()
    assert list(tmp_path.iterdir()) == []


def test_reading_a_missing_file_or_a_directory_is_a_refgpt_error(tmp_path):
    for path in (tmp_path / "missing.safetensors", tmp_path):
        with pytest.raises(RefGPTError, match=f"^{re.escape(str(path))}: weights file not found$"):
            SafetensorsFile(path)


def test_release_of_an_empty_tensor_at_the_end_of_a_page_aligned_file(tmp_path):
    """An empty tensor whose place is the file's end, at a page boundary: nothing to release, and
    no madvise past the mapping (mmap refuses a start at its end)."""
    page = mmap.PAGESIZE
    header = b'{"a":{"dtype":"U8","shape":[N],"data_offsets":[0,N]},"b":{"dtype":"F32","shape":[0],"data_offsets":[N,N]}}'
    width = (len(header) + 2 * 8 + 7) // 8 * 8  # room for N's digits, padded to 8 bytes
    n = page - 8 - width
    text = header.replace(b"N", str(n).encode()).ljust(width)
    path = tmp_path / "edge.safetensors"
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(range(256)) * (n // 256) + bytes(n % 256))
    assert path.stat().st_size == page and load_file(str(path))["b"].shape == (0,)  # the reference reads it
    f = SafetensorsFile(path)
    f.release("b")
    f.release("a")
    assert f.raw("b").shape == (0,) and np.array_equal(f.raw("a"), load_file(str(path))["a"])


def test_writer_metadata_filled_in_at_the_end_must_fit_its_room(tmp_path):
    layout = {"a": (np.float64, (2,))}
    path = tmp_path / "x.safetensors"
    with SafetensorsWriter(path, layout, {"c": ""}, header_length=200) as w:
        w.write("a", np.ones(2))
        w.metadata = {"c": "x" * 50}
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"c": "x" * 50} and np.array_equal(f.get_tensor("a"), np.ones(2))
    with pytest.raises(RefGPTError, match="outgrew the room"):
        with SafetensorsWriter(tmp_path / "y.safetensors", layout, {"c": ""}, header_length=80) as w:
            w.write("a", np.ones(2))
            w.metadata = {"c": "x" * 500}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]


def test_release_drops_pages_but_not_values(tmp_path):
    model = random_model(CFG, seed=3)
    path = golden.write_streamed(tmp_path / "g.safetensors", model, TOKENS, command=["t"])
    g = golden.read(path)
    before = np.array(g.tensors["blocks.1.attn.hook_pattern"])
    g.release("blocks.1.attn.hook_pattern")
    assert np.array_equal(g.tensors["blocks.1.attn.hook_pattern"], before)
    assert isinstance(g.file, SafetensorsFile)


def test_float32_twin_of_a_float32_checkpoint_is_the_mapped_file(tmp_path):
    """The conditioning pass's float32 weights: mapped from a float32 checkpoint (no copy) when the
    model holds that file's weights unchanged; rounded copies otherwise. The same numbers either way."""
    ckpt = save_checkpoint(random_model(CFG, seed=6), tmp_path / "m")  # float32 on disk
    model = refgpt.load(ckpt)  # float64
    twin = golden.float32_twin(model)
    rounded = Model(model.cfg, dict(model.params), dtype="float32")
    for name, value in rounded.params.items():
        assert twin.params[name].dtype == np.float32 and np.array_equal(twin.params[name], value), name
    assert not twin.params["blocks.0.mlp.W_in"].flags.owndata  # a view of the mapped file
    changed = dict(model.params)
    changed["blocks.0.mlp.b_in"] = changed["blocks.0.mlp.b_in"] + 2.0**-40  # not a float32 number any more
    edited = Model(model.cfg, changed, source=ckpt)
    assert golden.float32_twin(edited).params["blocks.0.mlp.W_in"].flags.owndata


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 30), ties=st.booleans(), nan=st.booleans())
def test_top_k_is_the_first_k_of_a_stable_argsort(seed, width, ties, nan):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, (6, width)).astype(float) if ties else rng.standard_normal((6, width))
    if nan:
        x[2, rng.integers(0, width)] = np.nan
    k = min(5, width)
    assert np.array_equal(comparison._top_k(x, k), np.argsort(-x, axis=-1, kind="stable")[:, :k])
