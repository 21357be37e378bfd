"""TransformerLens 4's TransformerBridge, the release ``pip install transformer-lens`` gives today, as a
second peer: on the same random GPT-2, every activation it caches agrees with refgpt's.

The bridge runs as a TL 4 user runs it — ``boot_transformers(directory)``, ``enable_compatibility_mode()``
(HookedTransformer's processing, done by TL 4 in float32), ``run_with_cache`` — in its own process
with TransformerLens 4 first on the path (tests/tl_torch/tl4.py, bridge_dump.py). refgpt is the
float64 reference: a golden of the same checkpoint, processed the same way by refgpt in float64
(refgpt/oracle/golden.py, which measures each tensor's float32 conditioning c_X). The bridge's
float32 cache is judged by the oracle's float32 profile (refgpt/oracle/comparison.py): per tensor
|Δ| ≤ G·u·(c_X + S_X) + G·u·|ref|, u = 2⁻²⁴, G = 64 — a bound derived from float32's unit
roundoff and measured conditioning, the one any correct float32 port must meet, not a tolerance
chosen to pass.

"Every cached activation by hook name": the bridge caches 493 names for a 12-layer GPT-2, TL's
names and its own component hooks (``blocks.L.hook_in``, ``attn.q.hook_out``, ``mlp.in.hook_out``,
``ln1.hook_out`` …). ``tl_bridge.BRIDGE_NAMES`` (refgpt/runtimes/tl_bridge.py) says which refgpt tensor each of its names is (the test fails
on a name it does not know); every one is compared. The token ids (``embed.hook_in``) and
positions (``pos_embed.hook_in``) are compared exactly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import peers as P

torch, transformers, transformer_lens = P.require_peers()

import tl4  # noqa: E402
import tl_port  # noqa: E402
from refgpt.runtimes import tl_bridge  # noqa: E402

HERE = Path(__file__).resolve().parent

refgpt_name = tl_bridge.refgpt_name  # the bridge's names → refgpt's: one home, refgpt/runtimes/tl_bridge.py


def test_the_bridge_agrees_on_every_cached_activation(tl4_dir, tmp_path):
    from refgpt import oracle
    from refgpt.oracle import golden
    from refgpt.tl import processing
    import refgpt

    directory, _ = tl_port.gpt2_checkpoint(tmp_path / "gpt2", seed=21, n_layers=3, n_embd=24, n_head=3, n_positions=64)
    model = refgpt.load(directory)
    texts = ["The bridge is the second peer: every activation, by name.", "A second row of the same length!!"]
    tokens = model.to_tokens(texts[0])
    np.save(tmp_path / "tokens.npy", tokens)
    dump = tmp_path / "bridge.npz"
    done = subprocess.run([sys.executable, str(HERE / "bridge_dump.py"), str(directory), str(tmp_path / "tokens.npy"),
                           str(dump)], env=tl4.environment(tl4_dir), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    bridge = dict(np.load(dump))
    logits = bridge.pop("__logits__")
    bridge.pop("__version__")
    assert len(bridge) > 20 * model.cfg.n_layers  # its own names and TL's

    processed = processing.process(model, True)  # what enable_compatibility_mode() does, in float64
    reference = golden.make(processed, tokens)
    n = model.cfg.n_layers
    assert np.array_equal(bridge.pop("embed.hook_in"), tokens)
    assert np.array_equal(bridge.pop("pos_embed.hook_in"), np.arange(tokens.shape[1])[None])
    unknown = sorted(k for k in bridge if refgpt_name(k, n) not in reference.tensors)
    assert unknown == [], f"bridge names this test does not know: {unknown[:8]}"
    groups = {}  # bridge names that are the same refgpt tensor go into different candidates
    for name, value in {**bridge, "__logits__": logits}.items():
        target = refgpt_name(name, n)
        slot = next(i for i in range(100) if target not in groups.setdefault(i, {}))
        groups[slot][target] = (name, value)
    compared, worst, largest = 0, 0.0, 0.0
    for candidate in groups.values():
        report = oracle.compare(reference, {k: v for k, (_, v) in candidate.items()}, profile="float32")
        names = {t.name: candidate[t.name][0] for t in report.tensors}
        bad = [f"{names[t.name]} (= {t.name}): {t.max_over_tol:.2f}× its float32 bound" for t in report.tensors if not t.ok]
        assert not bad, "\n".join(bad) + "\n" + report.table()
        compared += len(report.tensors)
        worst = max(worst, max(t.max_over_tol for t in report.tensors))
        largest = max(largest, max(t.max_rel for t in report.tensors))
    assert compared == len(bridge) + 1  # every cached activation, and the logits
    assert largest > 1e-9  # (the bridge really ran in float32: it is not refgpt's float64 to rounding)
    P.record_error("TL 4 bridge (float32): max |Δ| / float32 bound", worst)
    P.record_error("TL 4 bridge (float32): max relative error", largest)
    assert report.logits is None or report.logits.top1_agreement == 1.0
