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


# ---- --model: a path that exists is read from the disk, in every subcommand ------------------------

from refgpt.cli import COMMANDS, name_of  # noqa: E402
from test_options import BASE  # noqa: E402  (each subcommand's cheap command line)

MODEL_TAKERS = sorted(name_of(c) for c in COMMANDS if "--model" in c.USES)


@pytest.fixture
def llmc_dir(tmp_path, monkeypatch, hub):
    """A directory of the test's own with an llm.c checkpoint of the embedded model (m.bin), a file
    named like a hub repository (gpt2), the hub a fake one that records every request."""
    import refgpt
    from refgpt.oracle import llmc

    llmc.write_model(tmp_path / "m.bin", refgpt.load_default())
    (tmp_path / "gpt2").write_text("not a model\n")
    (tmp_path / "prompts.txt").write_text("To be\n")
    (tmp_path / "ids.txt").write_text("1 2 3 4\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_subcommand_that_takes_a_model_takes_it(refgpt_cli):
    assert MODEL_TAKERS == ["attribute", "eval-lens", "eval-sae", "explore", "generate", "golden", "inspect", "lens",
                            "predict", "steer", "sweep", "train-lens"]


@pytest.mark.parametrize("name", MODEL_TAKERS)
@pytest.mark.parametrize("model", ["m.bin", "gpt2"])
def test_a_model_file_is_read_locally_never_sent_to_the_hub(refgpt_cli, llmc_dir, hub, name, model):
    """--model m.bin read an llm.c checkpoint in golden but sent predict to the network (m.bin looks
    like a hub name); a file named gpt2 went to the hub too. Now a file is a file everywhere: golden
    reads llm.c's, every other subcommand says in one line what it reads."""
    argv = [a.replace("{out}", "out") for a in BASE[name]]
    if name == "golden":
        argv = ["golden", "--tokens", "ids.txt", "-o", "out.safetensors"]
    done = refgpt_cli.in_process(*argv, "--model", model)
    assert hub.requests == []
    if name == "golden" and model == "m.bin":
        assert done.returncode == 0, done.stderr
        assert "wrote out.safetensors" in done.stdout
        return
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    if model == "gpt2":
        assert done.stderr.startswith("refgpt: error: gpt2: a file, not a model directory"), done.stderr
    else:
        assert done.stderr.startswith("refgpt: error: m.bin: an llm.c checkpoint, which only refgpt golden reads")


def test_a_hub_name_that_is_no_path_still_goes_to_the_hub(refgpt_cli, llmc_dir, hub):
    (llmc_dir / "gpt2").unlink()
    done = refgpt_cli.in_process("predict", "To be", "--model", "gpt2")
    assert hub.requests, done.stderr  # asked the (fake) hub


def test_the_python_api_reads_a_file_path_locally_too(llmc_dir, hub):
    import refgpt

    with pytest.raises(refgpt.RefGPTError, match=r"^gpt2: a file, not a model directory"):
        refgpt.load("gpt2")
    with pytest.raises(refgpt.RefGPTError, match=r"give the directory it sits in"):
        refgpt.load(refgpt.default_model_path() / "model.safetensors")
    assert hub.requests == []


def test_the_model_option_says_what_it_reads_the_same_way_everywhere(refgpt_cli):
    helps = {name: " ".join(refgpt_cli.in_process(name, "--help").stdout.split()) for name in MODEL_TAKERS}
    for name, text in helps.items():
        assert "A path that exists is always read from the disk, never looked up on the hub" in text, name
        assert "llm.c checkpoint" in text, name


# ---- no subcommand swallows a TEXT -----------------------------------------------------------------


@pytest.mark.parametrize("word", ["train", "eval", "train-lens", "eval-lens", "predict", "lens", "help"])
def test_lens_reads_any_word_as_its_text(refgpt_cli, word):
    """`refgpt lens train` was lens training, so the lens of the text "train" needed `lens -- train`.
    Training and evaluating are their own commands now (train-lens, eval-lens): every word is a TEXT."""
    done = refgpt_cli.in_process("lens", word, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["text"] == word


@pytest.mark.parametrize("command", [["predict"], ["inspect"], ["generate", "-n", "1"],
                                     ["steer", "--plus", "a", "--minus", "b", "--layer", "0"], ["explore", "-o", "p.html"],
                                     ["attribute", "--target", "#1"]])
@pytest.mark.parametrize("word", ["train", "eval", "lens", "golden"])
def test_no_subcommand_takes_a_word_of_its_text_for_an_action(refgpt_cli, tmp_path, monkeypatch, command, word):
    monkeypatch.chdir(tmp_path)
    done = refgpt_cli.in_process(command[0], word, *command[1:], "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer.get("text", word) == word and "tokens" in answer or "output" in answer, answer.keys()


def test_the_old_lens_train_spelling_says_where_the_command_went(refgpt_cli, tmp_path):
    for argv, new in ((["lens", "train", "--text", "x.txt", "-o", tmp_path / "d"], "train-lens"),
                      (["lens", "eval", "--text", "x.txt"], "eval-lens")):
        done = refgpt_cli.in_process(*argv)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"is now refgpt {new}" in done.stderr


# ---- the oracle's logic lives below the CLI ----------------------------------------------------------


def test_golden_command_only_parses_and_prints():
    """Token-file readers, batch padding and llm.c model loading were in refgpt/cli/golden.py; they
    are refgpt.oracle.token_files, refgpt.gpt2.padding.pad_rows and _chosen_model.load_chosen."""
    import numpy as np

    from refgpt.cli import golden as golden_cli
    from refgpt.gpt2.padding import pad_rows
    from refgpt.oracle import token_files

    for name in ("read_tokens", "padded", "_raw_tokens", "_text_or_npy_tokens", "RAW_TOKEN_DTYPES", "_pad_id"):
        assert not hasattr(golden_cli, name), name
    assert callable(token_files.read_tokens) and callable(token_files.with_tokenizer)
    tokens, mask = pad_rows([[1, 2, 3], [4]], "left", 0)
    assert tokens.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    tokens, mask = pad_rows([[1, 2, 3], [4]], "right", 9)
    assert tokens.tolist() == [[1, 2, 3], [4, 9, 9]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    same = np.array([[1, 2], [3, 4]])
    assert pad_rows(same, "left", 0)[0] is same and pad_rows([[1, 2], [3, 4]], "left", 0)[1] is None
