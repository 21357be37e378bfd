"""Decode goldens (issue 25, item 1): the prompt pass and every KV-cached step, named step by step.

A clean float32 decode passes a float64 decode golden — refgpt's own, HF's ``generate``, and the C
port's llm.c-style generation loop (its per-step acts_memory dumps) — and bugs planted in a copy of
refgpt's KV path (a KVCache subclass, the way a port's cache goes wrong) and in an HF decoding loop
are each named at their step, row and tensor: a position id off by one from step 1, the cache
appended twice, the cache not appended, the newest key missing, a wrong mask row under left
padding, pad rows attended.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import c_port
from random_models import random_params, save_checkpoint
from refgpt import Config, Model
from refgpt.gpt2.kv_cache import KVCache
from refgpt.oracle import comparison as oracle
from refgpt.oracle import decode

CFG = Config(d_model=16, n_layers=2, n_heads=4, d_mlp=64, d_vocab=50, n_ctx=48)
PROMPT = np.array([[7, 3, 9, 1, 4, 2], [0, 0, 0, 5, 8, 6]])  # row 1: three left pads
MASK = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
STEPS = 6


def model(dtype="float64"):
    p = {k: v.astype(np.float32).astype(np.float64) for k, v in random_params(CFG, 5, 0.5).items()}
    p["unembed.W_U"] = p["embed.W_E"].T  # tied: llm.c's C port can run it too
    return Model(CFG, p, dtype=dtype)


@pytest.fixture(scope="module")
def goldens():
    m = model()
    return {"plain": decode.make(m, PROMPT[:1], STEPS), "padded": decode.make(m, PROMPT, STEPS, attention_mask=MASK)}


def first(report):
    t = report.first_divergence
    assert t is not None, report.table()
    return t


def f32_decode(golden, past=None):
    mask = MASK if "attention_mask" in golden.tensors else None
    prompt = PROMPT if mask is not None else PROMPT[:1]
    m = model("float32")
    tensors, chosen = decode.run(m, prompt, STEPS, attention_mask=mask, past=past)
    return {"tokens": np.concatenate([prompt, chosen], axis=1), **tensors}


# ---- clean decodes pass ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "padded"])
def test_refgpts_float32_decode_passes_and_every_step_is_judged(goldens, kind):
    g = goldens[kind]
    report = oracle.compare(g, f32_decode(g))
    assert report.ok, report.table(after_first=2)
    names = [t.name for t in report.tensors]
    assert names.index("step.1.hook_embed") > names.index("step.0.chosen")  # walked step by step
    assert {f"step.{STEPS - 1}.blocks.1.attn.cache_k", "step.2.blocks.0.attn.hook_pattern", "step.3.logits"} <= set(names)
    assert decode.info(g)["steps"] == STEPS and g.tensors["tokens"].shape[1] == PROMPT.shape[1] + STEPS
    if kind == "padded":
        cache = report["step.2.blocks.0.attn.cache_k"]
        assert cache.n_compared == (6 + 3 + 2 * 2) * CFG.n_heads * CFG.d_head  # pad keys not judged


def test_the_c_ports_llmc_style_generation_passes(goldens, tmp_path):
    if c_port.compiler() is None:
        pytest.skip("no C compiler")
    g = goldens["plain"]
    inputs = c_port.write_inputs(tmp_path, model(), PROMPT[:1], PROMPT[:1])
    for build in ("O3", "Ofast"):
        steps = c_port.run_generate(c_port.build(*c_port.BUILDS[build]), inputs, tmp_path, STEPS, build)
        report = oracle.compare(g, steps, name_map="llmc")
        assert report.ok, report.table(after_first=2)
        judged = {t.name for t in report.tensors}
        assert {"step.0.blocks.0.hook_resid_pre", "step.3.blocks.1.attn.cache_v", "step.5.probs", "step.5.logits"} <= judged


# ---- bugs planted in a copy of refgpt's KV path --------------------------------------------------------


def position_off_by_one(model):
    """A decode step embeds its token at the position after its own (from step 1 on): the hook point
    where the step adds W_pos, given the wrong row — what a port that counts positions from the
    cache's length plus one computes."""
    W_pos = model.params["pos_embed.W_pos"]

    def hook(pos_embed, hook):
        if hook.start == 0:
            return pos_embed
        return np.broadcast_to(W_pos[hook.start + 1:hook.start + 1 + pos_embed.shape[1]], pos_embed.shape).copy()

    return [("hook_pos_embed", hook)]


class AppendedTwice(KVCache):
    """A decode step's keys and values stored twice (as when the step and the loop both append)."""

    def extend(self, layer, k, v):
        keys, values = super().extend(layer, k, v)
        if self.length == 0:
            return keys, values
        end = self.length + 2 * k.shape[1]
        self.keys[layer, :, end - k.shape[1]:end], self.values[layer, :, end - k.shape[1]:end] = k, v
        return self.keys[layer, :, :end], self.values[layer, :, :end]

    def advance(self, new):
        self.length += new if self.length == 0 else 2 * new


class NotAppended(KVCache):
    """A decode step attends to the new key but never stores it."""

    def extend(self, layer, k, v):
        if self.length == 0:
            return super().extend(layer, k, v)
        return (np.concatenate([self.keys[layer, :, :self.length], k], axis=1),
                np.concatenate([self.values[layer, :, :self.length], v], axis=1))

    def advance(self, new):
        if self.length == 0:
            self.length += new


class NewestKeyMissing(KVCache):
    """The cache is appended, but a decode step attends only to the keys stored before it."""

    def extend(self, layer, k, v):
        keys, values = super().extend(layer, k, v)
        return (keys, values) if self.length == 0 else (keys[:, :self.length], values[:, :self.length])


class WrongMaskRow(KVCache):
    """From step 1 on, row 1's mask is row 0's (all real): row 1 attends to its left pads."""

    def attention_mask(self, new_mask, new):
        mask = super().attention_mask(new_mask, new)
        if self.length > 0:
            mask = mask.copy()
            mask[1] = mask[0]
        return mask


class PadsAttended(KVCache):
    """The prompt's pads are attended to (its positions still right): the mask's pads never reach the scores."""

    def attention_mask(self, new_mask, new):
        return np.ones_like(super().attention_mask(new_mask, new))


@pytest.mark.slow
@pytest.mark.parametrize("bug, kind, step, tensor, row", [
    ("position off by one", "plain", 1, "hook_pos_embed", 0),
    (AppendedTwice, "plain", 1, "blocks.0.attn.cache_k", None),
    (NotAppended, "plain", 1, "blocks.0.attn.cache_k", None),
    (NewestKeyMissing, "plain", 1, "blocks.0.attn.hook_attn_scores", None),
    (WrongMaskRow, "padded", 1, "hook_pos_embed", 1),  # refgpt takes positions from the mask: wrong there first
])
def test_a_kv_path_bug_is_named_at_its_step_row_and_tensor(goldens, bug, kind, step, tensor, row):
    g = goldens[kind]
    batch = PROMPT.shape[0] if kind == "padded" else 1
    if bug == "position off by one":
        m = model("float32")
        with m.hooks(position_off_by_one(m)):
            tensors, chosen = decode.run(m, PROMPT[:1], STEPS)
        report = oracle.compare(g, {"tokens": np.concatenate([PROMPT[:1], chosen], 1), **tensors})
    else:
        report = oracle.compare(g, f32_decode(g, bug(CFG, batch, np.float32)))
    t = first(report)
    assert (t.step, t.name) == (step, f"step.{step}.{tensor}"), report.table(after_first=2)
    text = oracle.describe_divergence(t)
    assert text.startswith(f"first divergence: step {step}, {tensor} (")
    if row is not None:
        assert t.first_bad.index[0] == row and f"row {row}, " in text
    if tensor == "hook_pos_embed":  # the step's new position: the prompt's length
        assert t.first_bad.where["pos"] == PROMPT.shape[1] and f"position {PROMPT.shape[1]}," in text
    if bug is AppendedTwice:
        assert "more cached positions" in text and "appended twice" in text
        from doc_pages import DOCS

        page = " ".join((DOCS / "oracle.md").read_text(encoding="utf-8").split())
        assert text.split("first divergence: ")[1] in page  # docs/oracle.md quotes it
    if bug in (NotAppended, NewestKeyMissing):
        assert "fewer" in text


def test_pads_attended_in_the_prompt_pass_are_named_there(goldens):
    g = goldens["padded"]
    m = model("float32")
    tensors, chosen = decode.run(m, PROMPT, STEPS, past=PadsAttended(CFG, 2, np.float32), attention_mask=None)
    report = oracle.compare(g, {"tokens": np.concatenate([PROMPT, chosen], 1), **tensors})
    t = first(report)
    # without the mask the row's positions are wrong first: what a port with no mask at all does
    assert t.name in ("step.0.position_ids", "step.0.hook_pos_embed") and t.first_bad.index[0] == 1


# ---- the same bugs in HF ---------------------------------------------------------------------------------


def _hf(tmp_path):
    torch = pytest.importorskip("torch", reason="needs the 'peers' extra (torch)")
    pytest.importorskip("transformers", reason="needs the 'peers' extra (transformers)")
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(1)
    save_checkpoint(model(), tmp_path, dtype=np.float32)
    return torch, GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager", torch_dtype="float32").eval()


def hf_decode(torch, hf, prompt, mask, steps, bug=None):
    """An HF greedy decoding loop over a DynamicCache, keeping what each step computes under the hf
    decode map's names (name_maps.decode_to_refgpt), with ``bug`` planted."""
    from transformers import DynamicCache

    cache = DynamicCache()
    mask = torch.ones(prompt.shape, dtype=torch.long) if mask is None else torch.as_tensor(mask)
    ids = torch.as_tensor(prompt)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if bug == "pads attended":
        step_mask = torch.ones_like(mask)
    else:
        step_mask = mask
    out, sequence = {}, ids
    with torch.no_grad():
        for S in range(steps):
            run_cache = copy.deepcopy(cache) if bug == "not appended" and S > 0 else cache
            attend = step_mask.clone()
            if bug == "wrong mask row" and S > 0:
                attend[1] = 1
            if bug == "newest key missing" and S > 0:
                attend[:, -1] = 0
            o = hf(input_ids=ids, attention_mask=attend, position_ids=positions, past_key_values=run_cache,
                   use_cache=True, output_hidden_states=True, output_attentions=True)
            if bug == "appended twice" and S > 0:
                for layer in cache.layers:
                    layer.keys = torch.cat([layer.keys, layer.keys[:, :, -1:]], dim=2)
                    layer.values = torch.cat([layer.values, layer.values[:, :, -1:]], dim=2)
                step_mask = torch.cat([step_mask, torch.ones(len(ids), 1, dtype=torch.long)], -1)
            for i, h in enumerate(o.hidden_states):
                out[f"hidden_states.{S}.{i}"] = h.numpy()
            for i, a in enumerate(o.attentions):
                out[f"attentions.{S}.{i}"] = a.numpy()
            out[f"logits.{S}"] = o.logits[:, -1].numpy()
            for L, layer in enumerate(cache.layers):
                out[f"past_key_values.{S}.{L}.key"], out[f"past_key_values.{S}.{L}.value"] = (
                    layer.keys.numpy().copy(), layer.values.numpy().copy())
            chosen = o.logits[:, -1].argmax(-1)[:, None]
            sequence = torch.cat([sequence, chosen], -1)
            ids = chosen
            step_mask = torch.cat([step_mask, torch.ones(len(ids), 1, dtype=torch.long)], -1)
            last = positions[:, -1:] + 1
            positions = last + (1 if bug == "position off by one" and S == 0 else 0)
    out["sequences"] = sequence.numpy()
    return out


@pytest.mark.peer
def test_hf_generate_outputs_pass_under_the_hf_decode_map(goldens, tmp_path):
    torch, hf = _hf(tmp_path)
    for kind, prompt, mask in (("plain", PROMPT[:1], None), ("padded", PROMPT, MASK)):
        with torch.no_grad():
            o = hf.generate(torch.as_tensor(prompt), attention_mask=None if mask is None else torch.as_tensor(mask),
                            max_new_tokens=STEPS, do_sample=False, output_hidden_states=True, output_attentions=True,
                            output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        cand = {"sequences": o.sequences.numpy()}
        for S in range(STEPS):
            cand.update({f"hidden_states.{S}.{i}": h.numpy() for i, h in enumerate(o.hidden_states[S])})
            cand.update({f"attentions.{S}.{i}": a.numpy() for i, a in enumerate(o.attentions[S])})
            cand[f"logits.{S}"] = o.logits[S].numpy()
        for L, layer in enumerate(o.past_key_values.layers):
            cand[f"past_key_values.{L}.key"], cand[f"past_key_values.{L}.value"] = layer.keys.numpy(), layer.values.numpy()
        report = oracle.compare(goldens[kind], cand, name_map="hf")
        assert report.ok, report.table(after_first=2)
        judged = {t.name for t in report.tensors}
        assert {"tokens", "step.0.blocks.1.hook_resid_pre", f"step.{STEPS - 1}.ln_final.out", "step.2.next_logits",
                f"step.{STEPS - 1}.blocks.1.attn.cache_v", "step.3.blocks.0.attn.hook_pattern"} <= judged


@pytest.mark.peer
@pytest.mark.parametrize("bug, kind, step, tensor, row", [
    ("position off by one", "plain", 1, "blocks.0.hook_resid_pre", 0),
    ("appended twice", "plain", 1, "blocks.0.attn.cache_k", None),
    ("not appended", "plain", 1, "blocks.0.attn.cache_k", None),
    ("newest key missing", "plain", 1, "blocks.0.attn.hook_pattern", 0),
    ("wrong mask row", "padded", 1, "blocks.0.attn.hook_pattern", 1),
    ("pads attended", "padded", 0, "blocks.0.attn.hook_pattern", 1),
])
def test_a_bug_in_an_hf_decoding_loop_is_named_at_its_step_row_and_tensor(goldens, tmp_path, bug, kind, step, tensor,
                                                                          row):
    torch, hf = _hf(tmp_path)
    prompt, mask = (PROMPT, MASK) if kind == "padded" else (PROMPT[:1], None)
    clean = oracle.compare(goldens[kind], hf_decode(torch, hf, prompt, mask, STEPS), name_map="hf")
    assert clean.ok, clean.table(after_first=2)
    report = oracle.compare(goldens[kind], hf_decode(torch, hf, prompt, mask, STEPS, bug), name_map="hf")
    t = first(report)
    assert t.name == f"step.{step}.{tensor}", report.table(after_first=2)
    if row is not None:
        assert t.first_bad.index[0] == row


def test_a_near_tie_taken_the_other_way_leaves_the_path_without_a_false_divergence(goldens):
    """A greedy candidate whose logits are right but whose arg-max at step 2 picks the runner-up
    of a (planted) near-tie: told so, the later steps not judged, never "a bug at step 3"."""
    g = goldens["plain"]
    ref = {n: np.array(a) for n, a in g.tensors.items()}
    logits = ref["step.2.logits"][0, -1]
    top, second = np.argsort(-logits)[:2]
    ref["step.2.logits"][0, -1, second] = logits[top] - 1e-9  # the golden's two best now a near-tie
    ref["step.2.log_probs"] = ref["step.2.logits"] - np.log(np.exp(ref["step.2.logits"]).sum(-1, keepdims=True))
    tied = type(g)(ref, dict(g.metadata))
    cand = f32_decode(g)
    m = model("float32")
    cand_chosen = np.array([[int(cand["step.0.chosen"][0]), int(cand["step.1.chosen"][0]), int(second)]])
    tensors, _ = decode.run(m, PROMPT[:1], 3, continuation=cand_chosen)
    tensors["step.2.logits"], tensors["step.2.log_probs"] = ref["step.2.logits"].astype(np.float32), ref["step.2.log_probs"].astype(np.float32)
    report = oracle.compare(tied, tensors)
    t = report.first_divergence
    assert t.name == "step.2.chosen" and t.status == "near tie", report.table(after_first=1)
    assert "near-tie" in report.table() and not any(x.step is not None and x.step > 2 for x in report.tensors)
    assert not report.ok and "forced continuation" in report.too_little[0]
