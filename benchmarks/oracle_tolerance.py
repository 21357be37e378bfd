"""Measure the oracle's false-alarm rate on correct ports, and the growth factors they need.

    python benchmarks/oracle_tolerance.py [--models 500] [--c-ports N] [--torch N] [--trained N]
                                          [--gpt2-small N] [--seed 0]

refgpt's profiles (refgpt/oracle/comparison.py) accept a candidate element when

    |candidate − reference| ≤ G·u·(c_X + S_X + |reference|)                          G = 64

its mean signed error when |mean| ≤ B·u·(r_X + RMS(X_ref))·max(1, √(128/n))           B = 4

and a normalised row's factor or shift (softmax rows, log_probs) when it is ≤ G·u·(f_X + 1); c_X,
r_X and f_X are the errors of refgpt's float32 pass and of the sequential port
(refgpt/oracle/sequential.py), the larger, measured by the golden writer. Every tolerance is
linear in its factor, so a compare report gives the smallest G, B and row factor that would have
accepted every tensor (``needed``). This script runs correct ports against float64 goldens and
records those, and how many ports the profiles flag (the false-alarm rate):

* simulated ports, every format, on random models drawn like tests/random_models.py draws them
  (every config knob; weights N(0, s²), s ∈ {0.1, 0.5, 1}; d_model ≥ 2): refgpt in float32/float64
  with every activation also multiplied by (1 + u·r), r uniform in [−1, 1] (a second rounding in
  a pattern unrelated to refgpt's), its backward on weights moved by one rounding each; bfloat16
  and float16: weights and every activation stored in the format, float32 arithmetic between;
* the float32 C port (tests/oracle/c_port/gpt2_port.c) at every build of tests/c_port.py —
  index-order, reversed and 8-lane sums at -O3, -Ofast, fused multiply-adds — forward and
  backward, on random models llm.c can represent;
* HF transformers and TransformerLens in float32, forward and backward;
* all of them on the embedded trained model (random tokens — flat predictions, long similar sums —
  and text), and the C builds and HF at GPT-2 small's full shape (12 layers, 4×64).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "oracle"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # machine.py, dump_hf_tl.py

from random_models import random_params  # noqa: E402
from refgpt import Config, Model  # noqa: E402
from refgpt.oracle import golden  # noqa: E402
from refgpt.gpt2.activations import ACTIVATIONS  # noqa: E402
from refgpt.oracle import comparison  # noqa: E402
from refgpt.oracle.comparison import BIAS_GROWTH, GROWTH, UNIT_ROUNDOFF  # noqa: E402
from refgpt.oracle.gradients import compute_gradients  # noqa: E402


def round_bf16(x):
    """float32 → nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def round_f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


_STORE = {"float64": None, "float32": None, "bfloat16": round_bf16, "float16": round_f16}


def independent_run(cfg: Config, params: dict, tokens, fmt: str, seed: int, backward: bool = False) -> dict[str, np.ndarray]:
    """The golden tensors of a simulated independent implementation in ``fmt`` (module docstring).

    Its gradients (float32 and float64 only) are refgpt's backward pass in that dtype on weights
    moved by one rounding each (×(1 + u·r)): the hooks that perturb the forward do not reach the
    backward, and a second rounding at its inputs is the nearest stand-in for another summation order.
    """
    store, u = _STORE[fmt], UNIT_ROUNDOFF[fmt]
    dtype = "float64" if fmt == "float64" else "float32"
    weights = {k: np.asarray(v, dtype) for k, v in params.items()}
    if store is not None:
        weights = {k: store(v) for k, v in weights.items()}
    rng = np.random.default_rng(seed)

    def perturb(a, name):
        b = (a * (1.0 + u * rng.uniform(-1.0, 1.0, a.shape))).astype(a.dtype)
        return store(b) if store is not None else b

    out = golden.compute(Model(cfg, weights, dtype=dtype), tokens, fwd_hooks=[(lambda n: True, perturb)])
    if backward and store is None:
        moved = {k: perturb(v, k) for k, v in weights.items()}
        out.update(compute_gradients(Model(cfg, moved, dtype=dtype), tokens))
    return out


def needed(report) -> dict[str, tuple[float, str]]:
    """From a compare report (profile tolerances): the smallest growth factor G, bias factor B and
    row-freedom factor that would have accepted every tensor, each with the tensor that needs it.
    Every tolerance is linear in its factor, so G = GROWTH·max(max/tol), B = BIAS_GROWTH·max(bias/tol),
    row = GROWTH·max(|row factor − 1| or |shift| over its bound)."""
    g, b, row = (0.0, ""), (0.0, ""), (0.0, "")
    for t in report.tensors:
        if t.status in ("shape mismatch", "values differ"):
            return {"G": (math.inf, t.name), "B": (math.inf, t.name), "row": (math.inf, t.name)}
        g = max(g, (GROWTH * t.max_over_tol, t.name))
        if t.bias_tolerance:
            b = max(b, (BIAS_GROWTH * abs(t.mean_error) / t.bias_tolerance, t.name))
        if t.row is not None and t.row.bound:
            row = max(row, (GROWTH * t.row.largest / t.row.bound, t.name))
    return {"G": g, "B": b, "row": row}


def random_case(rng):
    """A config, float32-exact float64 weights and tokens, drawn like tests/random_models.py."""
    while True:
        n_heads = int(rng.integers(1, 5))
        d_head = int(rng.integers(1, max(1, 32 // n_heads) + 1))
        if n_heads * d_head >= 2:
            break
    cfg = Config(d_model=n_heads * d_head, n_layers=int(rng.integers(1, 4)), n_heads=n_heads,
                 d_mlp=int(rng.integers(1, 65)), d_vocab=int(rng.integers(2, 41)), n_ctx=int(rng.integers(2, 13)),
                 eps=float(rng.choice([1e-5, 1e-3, 0.1])), act_fn=str(rng.choice(sorted(ACTIVATIONS))),
                 use_attn_scale=bool(rng.integers(2)), scale_attn_by_inverse_layer_idx=bool(rng.integers(2)),
                 tie_word_embeddings=bool(rng.integers(2)))
    params = random_params(cfg, int(rng.integers(2**31)), float(rng.choice([0.1, 0.5, 1.0])))
    params = {k: v.astype(np.float32).astype(np.float64) for k, v in params.items()}
    tokens = rng.integers(0, cfg.d_vocab, size=(int(rng.integers(1, 4)), int(rng.integers(2, cfg.n_ctx + 1))))
    return cfg, params, tokens


FORMATS = ("float32", "bfloat16", "float16", "float64")


class Tally:
    """Per (port, batch kind): the needed G, B and row factor of every case, and the false alarms."""

    def __init__(self):
        self.rows = {}

    def add(self, port, kind, report, detail=""):
        n = needed(report)
        self.rows.setdefault((port, kind), []).append((n, report.ok, detail))

    def summary(self) -> dict:
        out = {}
        for key, rows in self.rows.items():
            entry = {"cases": len(rows), "false_alarms": sum(not ok for _, ok, _ in rows)}
            entry["false_alarm_rate"] = entry["false_alarms"] / len(rows)
            for factor in ("G", "B", "row"):
                values = np.array([n[factor][0] for n, _, _ in rows])
                worst = max(rows, key=lambda r: r[0][factor][0])
                entry[factor] = {"median": float(np.median(values)), "p99": float(np.quantile(values, 0.99)),
                                 "max": float(values.max()), "max_at": f"{worst[0][factor][1]}{worst[2]}"}
            out[key] = entry
        return out


def report(summary) -> str:
    lines = []
    for (port, kind), r in summary.items():
        parts = [f"{factor} median {r[factor]['median']:.2f}, p99 {r[factor]['p99']:.2f}, max {r[factor]['max']:.2f} "
                 f"({r[factor]['max_at']})" for factor in ("G", "B", "row")]
        lines.append(f"{port:14s} {kind:22s} {r['cases']:5d} cases: flagged {r['false_alarms']} "
                     f"({100 * r['false_alarm_rate']:.2f}%); needed " + "; ".join(parts))
    return "\n".join(lines) + (f"\n(limits: G = {GROWTH}, B = {BIAS_GROWTH}, row = {GROWTH})" if lines else "")


def simulated(tally, kind, cfg, params, tokens, seed, backward=True):
    """The simulated independent ports (module docstring) in every format."""
    model = Model(cfg, params)
    ref = golden.make(model, tokens, backward=backward)
    for fmt in FORMATS:
        cand = independent_run(cfg, params, tokens, fmt, seed=seed, backward=backward)
        tally.add(f"simulated {fmt}", kind, comparison.compare(ref, cand, profile=fmt), f", d_model {cfg.d_model}")


def llmc_case(rng):
    """A random model llm.c can represent (tied, d_mlp = 4·d_model, gelu_new, ε = 1e-5, 1/√d_head),
    float32-exact, with tokens x and targets y."""
    while True:  # d_model ≥ 2: a LayerNorm over one element is exact in any port (module docstring)
        n_heads, d_head = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        if n_heads * d_head >= 2:
            break
    cfg = Config(d_model=n_heads * d_head, n_layers=int(rng.integers(1, 4)), n_heads=n_heads, d_mlp=4 * n_heads * d_head,
                 d_vocab=int(rng.integers(2, 200)), n_ctx=int(rng.integers(2, 17)))
    params = random_params(cfg, int(rng.integers(2**31)), float(rng.choice([0.1, 0.5, 1.0])))
    params = {k: v.astype(np.float32).astype(np.float64) for k, v in params.items()}
    params["unembed.W_U"] = params["embed.W_E"].T
    B, T = int(rng.integers(1, 4)), int(rng.integers(2, cfg.n_ctx + 1))
    x, y = (rng.integers(0, cfg.d_vocab, (B, T)) for _ in range(2))
    return Model(cfg, params), x, y


def ports(tally, kind, model, x, y, builds, torch_ports, d, ref=None):
    """The compiled C builds and (``torch_ports``) HF and TransformerLens in float32 on one batch."""
    import c_port

    ref = golden.make(model, x, targets=y, backward=True) if ref is None else ref
    detail = f", d_model {model.cfg.d_model}"
    if builds:
        inputs = c_port.write_inputs(d, model, x, y)
        for build in builds:
            flags, defines = c_port.BUILDS[build]
            out = c_port.run_port(c_port.build(flags, defines), inputs, d, build)
            tally.add(f"C {build}", kind, comparison.compare(ref, out, name_map="llmc"), detail)
    if torch_ports:
        import torch
        from test_torch_ports import hf_forward_backward, hf_model, tl_forward_backward
        import peers

        hf = hf_model(model, Path(d) / "hf")
        tally.add("HF float32", kind, comparison.compare(ref, hf_forward_backward(torch, hf, x, y), name_map="hf"), detail)
        tl = peers.tl_model_from_hf(hf, "float32")
        tally.add("TL float32", kind, comparison.compare(ref, tl_forward_backward(torch, tl, x, y), name_map="tl"), detail)


def decode_case(rng, steps, llmc_shaped=False):
    """A random model (drawn like ``random_case``, or llm.c-shaped) with room for a prompt of 1–8
    tokens and ``steps`` decoding steps, the prompt [batch, P] (batch 1–3) and, for a batch of more
    than one, a left-padding mask (each row 1–P real tokens; None unpadded)."""
    import dataclasses

    if llmc_shaped:
        model, _, _ = llmc_case(rng)
        cfg, params = model.cfg, dict(model.params)
    else:
        cfg, params, _ = random_case(rng)
    P = int(rng.integers(1, 9))
    cfg = dataclasses.replace(cfg, n_ctx=P + steps)
    params["pos_embed.W_pos"] = random_params(cfg, int(rng.integers(2**31)), 0.5)["pos_embed.W_pos"].astype(
        np.float32).astype(np.float64)  # [n_ctx, d_model]
    if cfg.tie_word_embeddings:  # one matrix, as HF's checkpoint (and llm.c's) holds it
        params["unembed.W_U"] = params["embed.W_E"].T
    B = int(rng.integers(1, 4))
    prompt = rng.integers(0, cfg.d_vocab, (B, P))
    mask = None
    if B > 1 and P > 1:
        mask = np.zeros((B, P), np.int64)
        for b in range(B):
            mask[b, P - int(rng.integers(1, P + 1)):] = 1
        mask[0] = 1
    return Model(cfg, params), prompt, mask


def decoded(tally, kind, model, prompt, mask, steps, builds, d, hf=False, seed=0):
    """A float64 decode golden of ``steps`` greedy steps against independent float32 decodes, each
    greedy on its own (a near-tie taken the other way is counted apart): the simulated port (refgpt
    in float32 with a second rounding at every activation of every step), HF's ``generate`` (with
    ``hf``), and the C builds' llm.c-style generation (unpadded, llm.c-shaped models)."""
    from refgpt.oracle import decode

    ref = decode.make(model, prompt, steps, attention_mask=mask)
    detail = f", d_model {model.cfg.d_model}"
    m32 = Model(model.cfg, dict(model.params), dtype="float32")
    rng = np.random.default_rng(seed)

    def perturb(a, hook):
        return (a * (1.0 + UNIT_ROUNDOFF["float32"] * rng.uniform(-1.0, 1.0, a.shape))).astype(a.dtype)

    with m32.hooks([(lambda n: True, perturb)]):
        tensors, chosen = decode.run(m32, prompt, steps, attention_mask=mask)
    report = comparison.compare(ref, {"tokens": np.concatenate([prompt, chosen], 1), **tensors})
    tie = " (near tie)" if any(t.status == "near tie" for t in report.tensors) else ""
    tally.add("decode simulated" + tie, kind, report, detail)
    if hf:
        import torch
        from dump_hf_tl import hf_generate_candidate
        from test_torch_ports import hf_model

        torch.set_num_threads(1)
        cand = hf_generate_candidate(hf_model(model, Path(d) / "hf-decode"), prompt, steps, mask)
        report = comparison.compare(ref, cand, name_map="hf")
        tie = " (near tie)" if any(t.status == "near tie" for t in report.tensors) else ""
        tally.add("decode HF f32" + tie, kind, report, detail)
    if builds and mask is None:
        import c_port

        inputs = c_port.write_inputs(d, model, prompt, prompt)
        for build in builds:
            flags, defines = c_port.BUILDS[build]
            out = c_port.run_generate(c_port.build(flags, defines), inputs, d, steps, f"gen-{build}")
            tally.add(f"decode C {build}", kind, comparison.compare(ref, out, name_map="llmc"), detail)


def run(models=500, seed=0, trained=0, c_ports=0, torch_models=0, gpt2_small=0, builds=None, progress=None,
        decodes=0, decode_steps=32) -> dict:
    """The calibration (module docstring): ``models`` random models with the simulated ports,
    ``c_ports`` random llm.c-shaped models with the C builds, ``torch_models`` with HF and TL,
    ``trained`` batches of the embedded model (half random tokens, half text) with all of them, and
    ``gpt2_small`` batches at GPT-2 small's full shape (12 layers, 4×64) with the C builds and HF.
    ``progress(summary)`` is called every 50 cases."""
    import tempfile

    import c_port
    import port_cases

    builds = list(c_port.BUILDS) if builds is None else builds
    builds = builds if c_port.compiler() is not None else []
    rng = np.random.default_rng(seed)
    tally, done = Tally(), 0

    def tick():
        nonlocal done
        done += 1
        if progress is not None and done % 50 == 0:
            progress(tally.summary())

    with tempfile.TemporaryDirectory() as d:
        for i in range(trained):
            name = ("trained, random tokens", "trained, text")[i % 2]
            model, x, y = port_cases.case(name, seed=seed * 1000 + i)
            simulated(tally, name, model.cfg, model.params, x, seed=i)
            ports(tally, name, model, x, y, builds, True, d)
            tick()
        for i in range(gpt2_small):
            model, x, y = port_cases.case("GPT-2 small's shape", seed=seed * 1000 + i, shape=(12, 4, 64))
            ports(tally, "GPT-2 small, 12 layers", model, x, y, builds, True, d)
            tick()
        for i in range(models):
            cfg, params, tokens = random_case(rng)
            simulated(tally, "random", cfg, params, tokens, seed=i)
            tick()
        for i in range(c_ports):
            model, x, y = llmc_case(rng)
            ports(tally, "random, llm.c-shaped", model, x, y, builds, i < torch_models, d)
            tick()
        for i in range(decodes):
            llmc_shaped = i % 4 == 3  # every 4th llm.c-shaped, for the C builds' generation loop
            model, prompt, mask = decode_case(rng, decode_steps, llmc_shaped)
            if llmc_shaped:
                mask, prompt = None, prompt[:1]
            decoded(tally, f"random, {decode_steps} steps" + (", llm.c-shaped" if llmc_shaped else ""), model, prompt,
                    mask, decode_steps, builds if llmc_shaped else [], d, hf=i % 8 == 1, seed=i)
            tick()
    return tally.summary()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Measure the oracle's false-alarm rate and the growth factors a "
                                "correct port needs: simulated ports, the C port's builds, HF and TransformerLens.")
    p.add_argument("--models", type=int, default=500, help="random models with the simulated ports (every format)")
    p.add_argument("--c-ports", type=int, default=0, help="random llm.c-shaped models with the C port's builds")
    p.add_argument("--torch", type=int, default=0, help="… of which this many also with HF and TL in float32")
    p.add_argument("--trained", type=int, default=0, help="batches of the embedded trained model, every port")
    p.add_argument("--gpt2-small", type=int, default=0, help="batches at GPT-2 small's full shape (slow)")
    p.add_argument("--decode", type=int, default=0, help="random models with float32 decodes against a float64 decode golden")
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--builds", help="comma-separated C builds (default: all of tests/c_port.py's BUILDS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true", help="print the results so far every 50 cases")
    p.add_argument("--results", metavar="NAME", help="also write the report into benchmarks/RESULTS.md's section NAME")
    args = p.parse_args(argv)
    t0 = time.time()
    import machine

    where = machine.describe(machine.machine())

    def progress(summary):
        print(f"-- after {time.time() - t0:.0f} s\n{report(summary)}", flush=True)

    summary = run(args.models, args.seed, args.trained, args.c_ports, args.torch, args.gpt2_small,
                  args.builds.split(",") if args.builds else None, progress if args.progress else None,
                  args.decode, args.decode_steps)
    text = report(summary)
    print(text)
    print(f"({time.time() - t0:.0f} s)")
    if args.results:
        command = "python benchmarks/oracle_tolerance.py " + " ".join(argv if argv is not None else sys.argv[1:])
        machine.update_section(args.results, f"### {args.results}: the oracle's false-alarm calibration\n\n{where}.\n\n"
                               f"```\n$ nice {command}\n{text}\n({time.time() - t0:.0f} s)\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
