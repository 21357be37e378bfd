"""docs/oracle.md's llm.c walkthrough, run command by command.

Every ``refgpt`` command of the walkthrough runs verbatim in a directory holding llm.c's files.
llm.c's own commands have stand-ins: ``python train_gpt2.py`` writes gpt2_124M.bin,
gpt2_124M_debug_state.bin and gpt2_tokenizer.bin for a small random model (refgpt's llm.c
writers, the byte layout train_gpt2.py writes); ``make test_gpt2 && ./test_gpt2`` compiles a small C
program around the page's ``dump_state`` function (the page's C, verbatim), with llm.c's GPT2
field names, which fills the struct with a float32 run of that model — correct, or with the bug the
page shows planted — and calls ``dump_state``. Without a C compiler, refgpt's Python writer of the
same layout stands in (``llmc_dump.write_dump``, which the compiled program is checked against).
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import refgpt.gpt2.activations as activations
from random_models import random_params
from refgpt import Config, Model
from refgpt.oracle import golden, llmc, llmc_dump

from doc_pages import DOCS

CFG = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=64, d_vocab=50, n_ctx=12)
B, T = 2, 8
SECTION = "## llm.c, end to end"


def section() -> str:
    text = (DOCS / "oracle.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    return text[start: end if end > 0 else len(text)]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section(), flags=re.S)


def the_model() -> Model:
    p = {k: v.astype(np.float32).astype(np.float64) for k, v in random_params(CFG, 8, 0.5).items()}
    p["unembed.W_U"] = p["embed.W_E"].T
    return Model(CFG, p)


class Toy:
    """A byte-per-token tokenizer for the stand-in gpt2_tokenizer.bin."""

    vocab_size, eot_token = CFG.d_vocab, CFG.d_vocab - 1

    def decode_bytes(self, ids):
        return b"".join(bytes([97 + int(i) % 26]) for i in ids)


def train_gpt2_py(d):
    """Stand-in for llm.c's train_gpt2.py: the three files it writes."""
    model = the_model()
    tokens = np.random.default_rng(3).integers(0, CFG.d_vocab, size=(B, T + 1))
    llmc.write_model(d / "gpt2_124M.bin", model)
    llmc.write_debug_state(d / "gpt2_124M_debug_state.bin", model, tokens)
    llmc.write_tokenizer(d / "gpt2_tokenizer.bin", Toy())


def run_of(d, bug: str | None):
    """llm.c's buffers after step 0 of test_gpt2 (float32), with the page's bug planted."""
    state = llmc.read_debug_state(d / "gpt2_124M_debug_state.bin", CFG.d_vocab, CFG)
    saved = dict(activations.ACTIVATIONS), activations._tanh_gelu_backward
    try:
        if bug == "forward":  # gelu_forward with GELU_SCALING_FACTOR = sqrtf(2.0f / 3.14f)
            def gelu_314(x):
                c = np.sqrt(np.float32(2.0) / np.float32(3.14))
                return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x**3)))
            activations.ACTIVATIONS["gelu_new"] = gelu_314
        elif bug == "backward":  # gelu_backward with (1.0f + 0.044715f * x * x): the 3 of d(x³)/dx lost
            source = textwrap.dedent(inspect.getsource(saved[1])).replace("3.0 * 0.044715", "0.044715")
            namespace = dict(vars(activations))
            exec(source, namespace)
            activations._tanh_gelu_backward = namespace["_tanh_gelu_backward"]
        m = Model(CFG, dict(the_model().params), dtype="float32")  # picks up the planted GELU
        t = golden.compute(m, state.x, targets=state.y, backward=True)
    finally:
        activations.ACTIVATIONS.clear()
        activations.ACTIVATIONS.update(saved[0])
        activations._tanh_gelu_backward = saved[1]
    return llmc_dump.llmc_tensors_of_golden(t, CFG)


STAND_IN_C = r"""
#include <stdio.h>
#include <stdlib.h>
// llm.c's GPT2 struct, the fields dump_state reads (train_gpt2.c)
typedef struct { int max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels; } GPT2Config;
typedef struct {
    GPT2Config config; size_t num_parameters; float* grads_memory; float* acts_memory; size_t num_activations;
    float* grads_acts_memory; int batch_size; int seq_len; int* inputs; int* targets; float mean_loss;
} GPT2;
DUMP_STATE
// test_gpt2 stand-in: fill the struct from run.bin (B, T, Vp, num_parameters, num_activations, then the
// buffers) as llm.c's gpt2_forward and gpt2_backward would have, and dump it
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb"); int h[5]; GPT2 m;
    if (!f || fread(h, sizeof(int), 5, f) != 5) return 1;
    m.batch_size = h[0]; m.seq_len = h[1]; m.config.padded_vocab_size = h[2];
    m.num_parameters = h[3]; m.num_activations = h[4];
    size_t BT = (size_t)h[0] * h[1];
    m.inputs = malloc(BT * sizeof(int)); m.targets = malloc(BT * sizeof(int));
    m.acts_memory = malloc(m.num_activations * sizeof(float));
    m.grads_memory = malloc(m.num_parameters * sizeof(float));
    m.grads_acts_memory = malloc(m.num_activations * sizeof(float));
    if (fread(m.inputs, sizeof(int), BT, f) != BT || fread(m.targets, sizeof(int), BT, f) != BT
        || fread(&m.mean_loss, sizeof(float), 1, f) != 1
        || fread(m.acts_memory, sizeof(float), m.num_activations, f) != m.num_activations
        || fread(m.grads_memory, sizeof(float), m.num_parameters, f) != m.num_parameters
        || fread(m.grads_acts_memory, sizeof(float), m.num_activations, f) != m.num_activations) return 2;
    fclose(f);
    dump_state(&m, "llmc_state.bin");
    return 0;
}
"""


def write_run(path, run):
    """The stand-in's input: a header, then llm.c's buffers in memory order."""
    Vp = run["logits"].shape[-1]
    acts = llmc.activation_shapes(CFG, B, T, Vp)
    pars = llmc.parameter_shapes(CFG.n_ctx, Vp, CFG.n_layers, CFG.d_model)
    n_acts, n_pars = (sum(int(np.prod(s)) for s in x.values()) for x in (acts, pars))
    parts = [np.array([B, T, Vp, n_pars, n_acts], "<i4").tobytes(), np.asarray(run["tokens"], "<i4").tobytes(),
             np.asarray(run["targets"], "<i4").tobytes(), np.asarray([run["loss_mean"]], "<f4").tobytes()]
    parts += [np.asarray(run[k], "<f4").tobytes() for k in acts]
    parts += [np.asarray(run["grads." + k], "<f4").tobytes() for k in pars]
    parts += [np.asarray(run["grads_acts." + k], "<f4").tobytes() for k in acts]
    path.write_bytes(b"".join(parts))


def run_test_gpt2(d, bug):
    """Stand-in for `make test_gpt2 && ./test_gpt2` with dump_state added: writes llmc_state.bin."""
    run = run_of(d, bug)
    if not (d / "test_gpt2").exists():  # no C compiler: the same layout from Python
        llmc_dump.write_dump(d / "llmc_state.bin", CFG, run)
        return
    write_run(d / "run.bin", run)
    subprocess.run([d / "test_gpt2", d / "run.bin"], cwd=d, check=True)


def make_test_gpt2(d):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return
    dump_state = next(b for b in blocks("c") if "void dump_state" in b)
    (d / "test_gpt2.c").write_text(STAND_IN_C.replace("DUMP_STATE", dump_state))
    subprocess.run([cc, "-O1", "-o", d / "test_gpt2", d / "test_gpt2.c"], cwd=d, check=True)


def test_the_pages_dump_state_is_the_one_refgpt_reads():
    dump_state = next(b for b in blocks("c") if "void dump_state" in b)
    def lines(text):
        return "\n".join(line.strip() for line in text.strip().splitlines())

    assert lines(dump_state) in lines(llmc_dump.__doc__)


def run_page(d, bugs=(None, "forward", "backward")):
    """Run the walkthrough's commands in order in ``d`` (llm.c's run correct), then steps 3 and 4
    again for each planted bug. Returns [(bug, command, returncode, stdout)] of the refgpt commands."""
    commands = [line.strip() for b in blocks("bash") for line in b.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    assert commands[0] == "python train_gpt2.py" and "make test_gpt2" in commands and "./test_gpt2" in commands
    again = commands[commands.index("./test_gpt2"):]  # ./test_gpt2, then compare
    outputs = []
    for bug in bugs:
        for command in commands if bug is None else again:
            if command == "python train_gpt2.py":
                train_gpt2_py(d)
            elif command == "make test_gpt2":
                make_test_gpt2(d)
            elif command == "./test_gpt2":
                run_test_gpt2(d, bug)
            else:
                assert command.startswith("refgpt "), command
                r = subprocess.run([sys.executable, "-m", "refgpt", *command.split()[1:]], cwd=d,
                                   capture_output=True, text=True)
                assert r.returncode in (0, 1) and r.stderr == "", (command, r.stderr)
                outputs.append((bug, command, r.returncode, r.stdout))
    return outputs


def test_the_llmc_walkthrough_runs_and_names_each_planted_bug(tmp_path):
    outputs = run_page(tmp_path)
    assert all(rc == 0 for bug, _, rc, _ in outputs if bug is None), [o for o in outputs if o[2]]
    compares = {bug: out for bug, c, rc, out in outputs if c.startswith("refgpt compare golden.safetensors llmc_state")}
    named = [re.search(r"first divergence: (\S+)", compares[bug]).group(1) for bug in ("forward", "backward")]
    assert named == ["blocks.0.mlp.hook_post", "grad.blocks.1.mlp.hook_pre"]
    assert named == re.findall(r"first divergence: (\S+)", section())
    assert "systematic error" in compares["forward"] and "the activation (GELU)" in compares["backward"]
    for bug in ("forward", "backward"):  # the page shows what compare prints (numbers may differ by BLAS)
        shown = re.search(r"first divergence: \S+ \(layer \d\)(: a systematic error)?", compares[bug]).group(0)
        assert shown in section(), shown
    assert "the backward of blocks.1: the activation (GELU) is wrong." in section()
    # test_gpt2's own check (|Δ| ≤ 2e-2 on every parameter's gradient) passes the backward bug
    dump = llmc_dump.read_dump(tmp_path / "llmc_state.bin", CFG)
    expected = llmc.read_debug_state(tmp_path / "gpt2_124M_debug_state.bin", CFG.d_vocab, CFG).grads
    got = np.concatenate([dump["grads." + k].ravel() for k in llmc.PARAMETERS])
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 2e-2
    golden_out = next(out for _, c, _, out in outputs if c.startswith("refgpt golden"))
    assert "llm.c's debug state" in golden_out and "backward: mean loss" in golden_out
    # the C program wrote exactly what refgpt's Python writer writes
    if (tmp_path / "test_gpt2").exists():
        llmc_dump.write_dump(tmp_path / "python.bin", CFG, run_of(tmp_path, "backward"))
        assert (tmp_path / "python.bin").read_bytes() == (tmp_path / "llmc_state.bin").read_bytes()
    else:
        pytest.skip("no C compiler: the walkthrough ran with refgpt's Python writer of the dump")
