"""Every writer, killed before each of its file-system events and failed at many byte offsets
(tests/fault_injection.py), leaves the old result or the new one — never a mix, never a partial
file that reads as valid — and the next writer of the same output removes what a killed one left.

For each writer the old result is written first (or nothing, ``fresh``), then the new one is
written in a forked child that is killed (SIGKILL) just before its n-th event, or whose files may
not grow past a limit (EFBIG, as a full disk; or SIGXFSZ, a kill at that byte). Afterwards:

1. the output reads as exactly the old result or exactly the new one (a checkpoint directory: the
   model refgpt.load gives back, and nothing else in the directory but carried-over files);
2. every other entry is a temporary of refgpt's (``.NAME.refgpt-KIND-…``), which refgpt's readers
   refuse by name, and whose content — read under another name — is the old or the new result,
   never a mix or a partial file that parses;
3. after a failure (EFBIG) there is no leftover at all, and the error is one line naming the
   output, never the temporary;
4. writing again, uninterrupted, gives the new result and leaves nothing else behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fault_injection import LONG, byte_limits, count_events, listing, run_killed, run_with_file_size_limit, sample
from refgpt import RefGPTError
from refgpt.files.atomic_write import is_temporary
from writers import NEW, OLD, WRITERS, Writer

KILLS, LIMITS = 10, 3  # events and byte limits sampled per writer in CI (REFGPT_FAULTS=long: all, 8× more)
RESULTS: dict[str, dict[str, int]] = {}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Each writer's old and new results, as read back from uninterrupted writes."""
    return {w.name: w.prepare(tmp_path_factory.mktemp("ref")) for w in WRITERS}


def start(w: Writer, root: Path) -> Path:
    """A fresh directory holding the writer's old output (unless ``fresh``) and a bystander file."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    (root / "bystander.txt").write_text("not refgpt's")
    out = root / w.target
    if not w.fresh:
        w.write(OLD, out)
        for name in w.extra:  # files of the user's in a checkpoint directory, which a save carries over
            if name.endswith("/"):
                (out / name).mkdir()
                (out / name / "log.txt").write_text("training log")
            else:
                (out / name).write_text("the user's notes")
    return out


def state(w: Writer, out: Path):
    if not out.exists():
        return None
    return w.read(out)


def check_after(w: Writer, root: Path, out: Path, why: str, clean: bool) -> None:
    """The invariants 1–2 (and 3 when ``clean``) of the module docstring."""
    found = state(w, out)
    allowed = {w.old, w.new} | ({None} if w.fresh else set())
    assert found in allowed, f"{w.name} {why}: the output is neither the old nor the new result"
    if out.is_dir() and found is not None:
        expected = {"config.json", "model.safetensors", "vocab.json", "merges.txt", "refgpt-manifest.json",
                    "runs/", "runs/log.txt", "README.md", "params.pt", "training_log.json"}
        assert set(listing(out)) <= expected, (w.name, why, listing(out))
        for name in w.extra:  # carried over, whichever model the directory holds
            assert (out / name).exists(), (w.name, why, name)
    for entry in sorted(root.iterdir()):
        if entry.name in ("bystander.txt", w.target):
            continue
        assert not clean, f"{w.name} {why}: {entry.name} was left after a failure"
        assert is_temporary(entry), f"{w.name} {why}: {entry.name} left, not a temporary"
        with pytest.raises(RefGPTError, match="temporary"):  # refused by name
            w.read(entry)
        probe = root / ("probe" + Path(w.target).suffix)
        (shutil.copytree if entry.is_dir() else shutil.copy)(entry, probe)
        try:
            content = w.read(probe)
        except (RefGPTError, OSError):
            content = "invalid"
        finally:
            (shutil.rmtree if probe.is_dir() else Path.unlink)(probe)
        # llm.c's raw activations have no header to write last: a temporary cut short at the size of a
        # smaller Vp would read, under another name; refgpt never reads it under its own (refused above)
        assert content in (w.old, w.new, "invalid") or w.headerless, \
            f"{w.name} {why}: leftover {entry.name} reads as a third result"
    assert (root / "bystander.txt").read_text() == "not refgpt's"


def rewrite_cleans_up(w: Writer, root: Path, out: Path, why: str) -> None:
    """Invariant 4: the next write gives the new result and removes the killed writer's leftovers."""
    w.write(NEW, out)
    assert state(w, out) == w.new, f"{w.name} {why}: the rewrite does not read back"
    assert sorted(p.name for p in root.iterdir()) == sorted({"bystander.txt", w.target}), \
        f"{w.name} {why}: leftovers survive the next write: {sorted(p.name for p in root.iterdir())}"


def tally(w, what):
    RESULTS.setdefault(w.name, {}).setdefault(what, 0)
    RESULTS[w.name][what] += 1


@pytest.mark.slow
@pytest.mark.parametrize("name", [w.name for w in WRITERS])
def test_a_kill_at_any_event_leaves_the_old_result_or_the_new(prepared, tmp_path, name):
    w = prepared[name]
    root = tmp_path / "root"
    out = start(w, root)
    n, log = count_events(lambda: w.write(NEW, out), root)
    assert n >= 3, (name, log)
    for k in sample(n, KILLS):
        out = start(w, root)
        outcome = run_killed(lambda: w.write(NEW, out), root, k)
        assert outcome == "killed", (name, k, outcome)
        why = f"killed before event {k}/{n} ({log[k - 1]})"
        check_after(w, root, out, why, clean=False)
        rewrite_cleans_up(w, root, out, why)
        tally(w, "killed")


@pytest.mark.slow
@pytest.mark.parametrize("name", [w.name for w in WRITERS])
def test_a_file_system_that_fails_at_any_byte_leaves_the_old_result_and_one_line(prepared, tmp_path, name):
    w = prepared[name]
    root = tmp_path / "root"
    out = start(w, root)
    w.write(NEW, out)
    size = max((p.stat().st_size for p in ([out] if out.is_file() else out.rglob("*")) if p.is_file()), default=1)
    for limit in byte_limits(size, LIMITS):
        for kill in (False, True):
            out = start(w, root)
            outcome = run_with_file_size_limit(lambda: w.write(NEW, out), limit, kill=kill)
            why = f"{'killed' if kill else 'EFBIG'} at byte {limit} of {size}"
            if kill:
                assert outcome in ("killed", ("ok", None, None)), (name, why, outcome)
                check_after(w, root, out, why, clean=False)
                rewrite_cleans_up(w, root, out, why)
            else:
                assert outcome[0] == "refgpt", (name, why, outcome)  # never another exception
                message = outcome[1].removeprefix("RefGPTError: ")
                assert "\n" not in message and ".refgpt-" not in message and w.target in message, (name, why, message)
                assert "File too large" in message, (name, why, message)  # the first cause, not a cleanup's
                check_after(w, root, out, why, clean=True)
                assert state(w, out) == (None if w.fresh else w.old), (name, why)
            tally(w, "killed" if kill else "failed")


def test_the_fault_suite_ran_its_cases():
    """How many cases ran (printed with -s; the issue's closing note quotes the long run)."""
    if not RESULTS:
        pytest.skip("run together with the fault tests")
    total = sum(sum(v.values()) for v in RESULTS.values())
    print(f"\nwriter fault cases: {total} ({'long' if LONG else 'CI'}): {json.dumps(RESULTS)}")
    assert total >= 14 * 10
