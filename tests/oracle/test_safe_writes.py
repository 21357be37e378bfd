"""Every file the oracle (and the lens) writes goes through refgpt.files.atomic_write: a symlink is
written through, a non-regular file (here a socket; never /dev/null in a test) is refused."""

from __future__ import annotations

import numpy as np
import pytest

from fuzzing import socket_file
from random_models import random_params
from refgpt import Config, Model, RefGPTError
from refgpt.analysis.lens import save_translators
from refgpt.oracle import golden, llmc

CFG = Config(d_model=8, n_layers=1, n_heads=2, d_mlp=32, d_vocab=11, n_ctx=6)


def tied_model():
    """A model llm.c can hold too: d_mlp = 4·d_model, W_U = W_Eᵀ."""
    p = random_params(CFG, 0)
    p["unembed.W_U"] = p["embed.W_E"].T
    return Model(CFG, p)


@pytest.mark.parametrize("writer", ["golden", "llmc_model", "llmc_state", "llmc_activations", "translators"])
def test_every_writer_goes_through_a_link_and_refuses_a_non_regular_file(tmp_path, writer):
    model = tied_model()
    write = {
        "golden": lambda p: golden.write(p, golden.make(model, np.array([[1, 2, 3]]))),
        "llmc_model": lambda p: llmc.write_model(p, model),
        "llmc_state": lambda p: llmc.write_debug_state(p, model, np.array([[1, 2, 3]]), grads=False),
        "llmc_activations": lambda p: llmc.write_activations(p, golden.make(model, np.array([[1, 2, 3]])).tensors, CFG),
        "translators": lambda p: save_translators(p, {0: (np.eye(8), np.zeros(8))}),
    }[writer]
    (tmp_path / "real").write_bytes(b"old")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    write(tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real").read_bytes() != b"old"
    with pytest.raises(RefGPTError, match="not a regular file"):
        write(socket_file(tmp_path / "socket"))
