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


# ---- steer says when it pads the shorter prompt ------------------------------------------------------


def test_steer_announces_the_padding_of_the_shorter_prompt(refgpt_cli):
    """steer padded the shorter of PLUS and MINUS with the space token without saying so."""
    args = ("steer", "I hate you because", "--plus", "Love", "--minus", "Hate it", "--layer", "1", "--coeff", "5")
    done = refgpt_cli.in_process(*args)
    assert done.returncode == 0, done.stderr
    assert "padding: PLUS is 2 tokens shorter; padded on the right with 2 × ' ' (id 32)" in done.stdout
    answer = json.loads(refgpt_cli.in_process(*args, "--json").stdout)
    assert answer["padding"] == {"prompt": "plus", "count": 2, "token": {"id": 32, "text": " ", "bytes": "20"}}
    assert [t["id"] for t in answer["plus"]][-2:] == [32, 32]
    same = ("steer", "I hate you because", "--plus", "a", "--minus", "b", "--layer", "1")
    assert "padding" not in refgpt_cli.in_process(*same).stdout
    assert json.loads(refgpt_cli.in_process(*same, "--json").stdout)["padding"] is None
    swapped = json.loads(refgpt_cli.in_process(*args[:3], "Hate it", "--minus", "Love", *args[6:], "--json").stdout)
    assert swapped["padding"]["prompt"] == "minus"
