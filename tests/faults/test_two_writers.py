"""Two writers of one output at once (issue 24): the output is one writer's whole result — never a
mix of the two, never a partial file — both writers succeed, and nothing else is left behind.
Each round forks two children that wait on one pipe and then write together."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import refgpt
from fault_injection import LONG
from writers import NEW, OLD, TOKENS, WRITERS

ROUNDS = 12 if LONG else 3


def together(*actions) -> list[int]:
    """Run each action in its own forked child, released at the same moment; their exit statuses."""
    r, w = os.pipe()
    pids = []
    for action in actions:
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # wait for the start
            code = 0
            try:
                action()
            except BaseException:  # noqa: BLE001 — reported through the exit status
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(r)
    os.write(w, b"go" * len(actions))
    os.close(w)
    return [os.waitpid(pid, 0)[1] for pid in pids]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["golden.write_streamed", "refgpt.save", "save_tokenizer", "llmc.write_model",
                                  "lens.save_translators", "lens_directory.write_lens"])
def test_two_writers_leave_one_whole_result(tmp_path, name):
    w = next(w for w in WRITERS if w.name == name).prepare(tmp_path / "ref")
    for round_ in range(ROUNDS):
        root = tmp_path / f"round{round_}"
        root.mkdir()
        out = root / w.target
        if round_ % 2:  # an old output there, or none
            w.write(OLD, out)
        statuses = together(lambda: w.write(OLD, out), lambda: w.write(NEW, out))
        assert statuses == [0, 0], (name, round_, statuses)
        assert w.read(out) in (w.old, w.new), (name, round_)
        assert sorted(p.name for p in root.iterdir()) == [w.target], (name, round_, sorted(os.listdir(root)))
        shutil.rmtree(root)


def test_a_reader_of_a_directory_being_saved_gets_one_model(tmp_path):
    """refgpt.load reads several files; a save switching the directory between two of them would
    hand it a mix. The load checks the directory it read is still the one at the path, and reads
    again if not: across many loads racing many saves, every load is one whole model."""
    out = tmp_path / "ck"
    refgpt.save(OLD, out)
    states = {tuple(np.asarray(refgpt.load(out)(TOKENS)).ravel()[:4])}
    refgpt.save(NEW, out)
    states.add(tuple(np.asarray(refgpt.load(out)(TOKENS)).ravel()[:4]))

    def saves():
        for i in range(20 if LONG else 6):
            refgpt.save(NEW if i % 2 else OLD, out)

    def loads():
        for _ in range(40 if LONG else 12):
            m = refgpt.load(out)
            assert m.cfg in (OLD.cfg, NEW.cfg)
            assert tuple(np.asarray(m(TOKENS)).ravel()[:4]) in states

    assert together(saves, loads) == [0, 0]
