"""Issue 38's two bugs smaller than the drift, at GPT-2 small's shape (12 layers, 12 heads, d_model
768, random weights, 48 tokens) in a bfloat16 port — TransformerLens 3.9 run by its user, its cache
saved with safetensors: one head's W_O 1 % too large at layer 10, and one position's LayerNorm ε
wrong at layer 9. The whole-tensor rule passes both (its bfloat16 rtol is 64·u = 25 %); the local
verdicts name each at its op and layer, and flag nothing on the same port without the bug.
docs/oracle.md's section "Local verdicts at GPT-2 small's shape" is the first, run as printed."""

from __future__ import annotations

import contextlib
import re
import shlex

import numpy as np
import pytest

from refgpt.oracle import comparison, golden, local

pytestmark = [pytest.mark.peer, pytest.mark.slow]  # TransformerLens; a 124M-parameter model (about a minute)

SECTION = "## Local verdicts at GPT-2 small's shape"
GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257, n_inner=None,
                  layer_norm_epsilon=1e-5, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                  reorder_and_upcast_attn=False, tie_word_embeddings=True)
HEAD, POSITION = 3, 7


def page_commands():
    from doc_pages import DOCS
    text = (DOCS / "oracle.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    section = text[start: text.find("\n## ", start + 1)]
    commands = [line for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S) for line in block.splitlines()]
    shown = re.findall(r"^```\n(OK: .*?)^```", section, flags=re.S | re.M)[0].splitlines()
    return commands, shown


@pytest.fixture(scope="module")
def small(tmp_path_factory, refgpt_cli):
    """(the directory, refgpt's float64 model, tokens, the bfloat16 TransformerLens, the golden):
    the page's checkpoint ``small/`` (random, float32, HF's layout), ``tokens.txt`` and the golden
    its first command writes."""
    import peers
    peers.require_peers()
    import refgpt
    directory = tmp_path_factory.mktemp("gpt2_small_bf16")
    config = peers.random_hf_config(0, act_fns=["gelu_new"], **GPT2_SMALL)
    hf = peers.as_dtype(peers.random_hf_model(config, 0, f32_exact=True), "float32")
    peers.save_hf_layout(hf, directory / "small")
    tl = peers.tl_model_from_hf(hf, "bfloat16")
    del hf
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (1, 48))
    (directory / "tokens.txt").write_text(" ".join(map(str, tokens[0])) + "\n")
    commands, _ = page_commands()
    with contextlib.chdir(directory):
        result = refgpt_cli.in_process(*shlex.split(commands[0])[1:])
    assert result.returncode == 0, result.stderr
    model = refgpt.load(str(directory / "small"), dtype="float64", tokenizer=False)
    return directory, model, tokens, tl, golden.read(directory / "golden.safetensors")


def tl_cache(tl, tokens, hooks=()):
    """What the port's author saves: run_with_cache's activations, the logits and the tokens (torch)."""
    import torch
    with torch.no_grad(), tl.hooks(fwd_hooks=list(hooks)):
        logits, cache = tl.run_with_cache(torch.from_numpy(tokens))
    return {"tokens": torch.from_numpy(tokens), "logits": logits, **dict(cache.items())}


@contextlib.contextmanager
def w_o_one_percent_off(tl, layer=10, head=HEAD):
    """The port's weights: head ``head``'s W_O at ``layer`` × 1.01, rounded to bfloat16."""
    import torch
    W_O = tl.blocks[layer].attn.W_O  # [head, d_head, d_model]
    kept = W_O.detach().clone()
    with torch.no_grad():
        W_O[head] = (W_O[head].float() * 1.01).to(W_O.dtype)
    try:
        yield
    finally:
        with torch.no_grad():
            W_O.copy_(kept)


def epsilon_wrong(scale, hook):
    """TransformerLens's hook_scale √(σ² + ε) [batch, pos, 1] at one position with ε + 0.1025·σ²
    (σ moves by 5 %, in float32, then stored in bfloat16 as TransformerLens stores it)."""
    import torch
    scale = scale.clone()
    s = scale[:, POSITION].float()  # [batch, 1]
    variance = s * s - GPT2_SMALL["layer_norm_epsilon"]
    scale[:, POSITION] = torch.sqrt(s * s + 0.1025 * variance).to(scale.dtype)
    return scale


def judged(small, cache):
    import torch
    _, model, tokens, _, g = small
    acts = {k: v.to(torch.float64).numpy() for k, v in cache.items() if k != "tokens"}
    report = local.judge(model.params, model.cfg, tokens, acts, "bfloat16")
    whole = comparison.compare(g, {"tokens": tokens, **acts}, name_map="tl", profile="bfloat16")
    return report, whole


def test_the_pages_gpt2_small_example_names_w_o_at_layer_10_where_the_whole_tensor_rule_passes(small, refgpt_cli):
    from safetensors.torch import save_file
    directory, _, tokens, tl, _ = small
    commands, shown = page_commands()
    assert [c.split()[:2] for c in commands] == [["refgpt", "golden"], ["refgpt", "compare"]]
    with w_o_one_percent_off(tl):
        cache = tl_cache(tl, tokens)
    # each cloned: TransformerLens's cache shares a block's resid_post with the next one's resid_pre
    save_file({k: v.contiguous().clone() for k, v in cache.items()}, str(directory / "tl_bf16.safetensors"))
    with contextlib.chdir(directory):
        status, out, err = refgpt_cli.in_process(*shlex.split(commands[1])[1:])
    assert status == 1, err  # the whole-tensor rule passes (its OK line is shown); the local verdict fails
    printed = out.splitlines()
    assert all(line in printed for line in shown), "\n".join(line for line in shown if line not in printed)
    assert any(line.startswith("OK: all ") for line in shown)
    assert "FIRST LOCAL FAILURE: attn out at blocks.10.hook_attn_out" in out
    local_part = out[out.index("local verdicts at"):].splitlines()  # after the whole-tensor table
    assert [line[21:].split()[0] for line in local_part if line.endswith("FLAGGED")] == ["blocks.10.hook_attn_out"]


def test_one_positions_layer_norm_epsilon_wrong_at_layer_9_is_named_there(small):
    _, _, tokens, tl, _ = small
    report, whole = judged(small, tl_cache(tl, tokens, [("blocks.9.ln1.hook_scale", epsilon_wrong)]))
    assert whole.ok, whole.table(after_first=3)  # today's rule: within bfloat16's drift
    first = report.first
    assert (first.op, first.name, first.layer, first.index[1]) == ("ln scale", "blocks.9.ln1.hook_scale", 9, POSITION)
    assert first.introduced > first.bound


def test_the_same_port_without_a_bug_has_no_local_flag(small):
    _, _, tokens, tl, _ = small
    report, whole = judged(small, tl_cache(tl, tokens))
    assert whole.ok and report.first is None, local.format_local(report)
    assert sum(v.skipped is None for v in report.ops) == 209  # every op but the means (TransformerLens has none)
