"""Issue 37: the traps a new user fell into on the command line, each kept shut by a test here."""

from __future__ import annotations

import json
import re

import pytest

from refgpt.errors import size_shown


# ---- sizes in the unit that fits ------------------------------------------------------------------


@pytest.mark.parametrize("nbytes, text", [(0, "0 bytes"), (1, "1 byte"), (1023, "1,023 bytes"), (1024, "1.0 KiB"),
                                          (52_000, "50.8 KiB"), (2**20 - 1, "1,024.0 KiB"), (2**20, "1.0 MiB"),
                                          (3_474_259_968, "3.2 GiB"), (5 * 2**40, "5.0 TiB")])
def test_sizes_are_shown_in_the_unit_that_fits(nbytes, text):
    assert size_shown(nbytes) == text


def test_explore_says_how_big_its_page_is_in_the_unit_that_fits(refgpt_cli, tmp_path):
    """explore called a 52 KB page "0.0 MiB"."""
    out = tmp_path / "page.html"
    done = refgpt_cli.in_process("explore", "To be", "--no-tuned", "--layers", "0", "-o", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(", " + size_shown(out.stat().st_size)), done.stdout
    assert "0.0 MiB" not in done.stdout


def test_golden_says_how_big_its_file_is_in_the_unit_that_fits(refgpt_cli, tmp_path):
    out = tmp_path / "g.safetensors"
    done = refgpt_cli.in_process("golden", "To be", "--names", "blocks.0.hook_resid_post", "-o", out)
    assert done.returncode == 0, done.stderr
    assert f"tensors, {size_shown(out.stat().st_size)}, tokens" in done.stdout, done.stdout
