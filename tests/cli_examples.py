"""Command lines as the docs print them (README.md's bash blocks, each subcommand's ``--help``
examples), run as written: in one directory, in order, so a line may read what an earlier one wrote.

A printed line is ``[VAR=value …] refgpt ARGS [&& [VAR=value …] refgpt ARGS …] [# comment]``:
shell words (quotes as a POSIX shell reads them), commands joined by ``&&``. Anything else — a
pipe, a redirect, ``;``, a program other than refgpt — is refused, so a printed example never
needs more of a shell than this reads. Files an example reads that a user brings along (their
port's ids, llm.c's checkpoint and debug state, tuned-lens translators) are made by
:func:`user_files`; everything else an example needs, an earlier example makes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

ENV = re.compile(r"[A-Z_][A-Z0-9_]*=.*")


def commands(line: str) -> list[tuple[dict[str, str], list[str]]]:
    """The commands of one printed line: (environment, arguments after ``refgpt``) each."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    words = list(lexer)
    found, current = [], []
    for word in words + ["&&"]:
        if word != "&&":
            current.append(word)
            continue
        env = {}
        while current and ENV.fullmatch(current[0]):
            name, _, value = current.pop(0).partition("=")
            env[name] = value
        assert current and current[0] == "refgpt", f"not a refgpt command: {line!r}"
        assert not any(re.fullmatch(r"[|;<>&()]+", w) for w in current), f"more shell than && in: {line!r}"
        found.append((env, current[1:]))
        current = []
    return found


def run_line(cli, line: str, monkeypatch) -> list:
    """Run every command of ``line`` in this process (``cli.in_process``) with its environment; each
    must exit 0. Returns their results."""
    results = []
    for env, argv in commands(line):
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            result = cli.in_process(*argv)
        assert result.returncode == 0, f"{line!r} → exit {result.returncode}: {result.stderr}"
        results.append(result)
    return results


def needs_matplotlib(line: str) -> None:
    """Skip the calling test when ``line`` plots and the optional ``plot`` extra is missing."""
    if "--plot" in line:
        pytest.importorskip("matplotlib", reason="--plot needs the optional 'plot' extra (matplotlib)")


def user_files(directory: Path) -> None:
    """The files examples read that a user brings, made from the embedded model in ``directory``:
    ``ids.txt`` (token ids), llm.c's ``gpt2_124M.bin`` and ``gpt2_124M_debug_state.bin``,
    tuned-lens translators ``lens.safetensors`` and a lens directory ``lens-dir`` (config.json +
    params.pt, as the tuned-lens package writes one), a corpus ``prompts.txt`` (one prompt per line)
    and a text ``macbeth.txt`` (the first 6,000 characters of tests/data/macbeth_act1.txt)."""
    import refgpt
    from refgpt.analysis.lens import TunedLens, save_translators
    from refgpt.oracle import llmc

    model = refgpt.load_default()
    (directory / "ids.txt").write_text("1 2 3\n")
    (directory / "macbeth.txt").write_text((Path(__file__).parent / "data" / "macbeth_act1.txt").read_text()[:6000])
    (directory / "prompts.txt").write_text("To be, or not to be, that is the question\nMy lord, I\nO Romeo, Romeo\n")
    llmc.write_model(directory / "gpt2_124M.bin", model)
    llmc.write_debug_state(directory / "gpt2_124M_debug_state.bin", model, model.to_tokens("To be, or not to be")[:, :6])
    d = model.cfg.d_model
    rng = np.random.default_rng(0)
    translators = {L: (0.01 * rng.standard_normal((d, d)), np.zeros(d)) for L in range(model.cfg.n_layers)}
    save_translators(directory / "lens.safetensors", translators)
    TunedLens(model, translators).save(directory / "lens-dir")
