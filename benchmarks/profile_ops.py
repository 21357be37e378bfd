"""Where the time of a forward pass goes: refgpt's ops next to torch's, op class by op class.

    python benchmarks/profile_ops.py            # GPT-2 small, T = 1024, float32 and float64
    OPENBLAS_NUM_THREADS=1 REFGPT_BENCH_THREADS=1 REFGPT_PROFILE_CLOCK=cpu python benchmarks/profile_ops.py
                                                # one thread, CPU time: fair on a busy machine

Each op class is timed in isolation on the shapes and weights of GPT-2 small's forward pass at
T = 1024 (batch 1), refgpt calling its own functions (``layer_norm``, ``affine``, ``softmax``,
``gelu_new``, the attention helpers) exactly as its forward does, torch the kernels HF's GPT2 runs
(``F.layer_norm``, ``addmm`` of the fused Conv1D weights, ``scaled_dot_product_attention``, the
``gelu_new`` formula, ``F.linear`` for the tied unembedding). Each op runs its rounds for refgpt,
then for torch (``op_medians``: alternating every ~50 ms call lets the other library's spinning
threads take a core), median kept; the whole forwards alternate (``paired_medians``), as
benchmarks/bench_forward.py times them. Run it on a quiet machine. Per-forward times are the
per-call time × calls per forward; "rest" is the measured forward minus the sum (hooks, Python,
residual adds, what the isolated timings miss). The last row times every matrix product of
refgpt's forward alone, in its order (``products_alone``), beside torch's whole forward: the
ratio refgpt would reach if LayerNorm, softmax, GELU, the adds and Python cost nothing.

Writes the "profile-wall" (or "profile-cpu") section of RESULTS.md and results_profile_*.json,
with the BLAS kernel.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_forward  # noqa: E402
from machine import describe, machine, update_section  # noqa: E402

import refgpt  # noqa: E402
from refgpt.gpt2 import attention as attn_mod  # noqa: E402
from refgpt.gpt2.layernorm import layer_norm  # noqa: E402
from refgpt.gpt2.linear import affine  # noqa: E402


#: The clock: wall time, or with REFGPT_PROFILE_CLOCK=cpu the process's CPU time, which on an
#: oversubscribed machine still measures the work done, provided both sides run one thread
#: (OPENBLAS_NUM_THREADS=1 REFGPT_BENCH_THREADS=1): a waiting BLAS thread spins and would count.
CLOCK = os.environ.get("REFGPT_PROFILE_CLOCK", "wall")
_now = time.process_time if CLOCK == "cpu" else time.perf_counter


def paired_medians(ours, theirs, rounds):
    """bench_forward's paired timing, on this script's clock (REFGPT_PROFILE_CLOCK)."""
    return bench_forward.paired_medians(ours, theirs, rounds, clock=_now)


def op_medians(ours, theirs, rounds, settle=0.2):
    """Median seconds of ``ours``, then of ``theirs``, each run ``rounds`` times in a row after a
    warm-up and a pause of ``settle`` seconds. Not alternated call by call as whole forwards are:
    after a call OpenBLAS's threads, and after torch's its OpenMP threads, spin for a while, and on
    a 2-core machine that spinning takes a core from the other library's next op of ~50 ms (measured:
    alternated, torch's isolated products read 2× slower than inside its own forward)."""
    out = []
    for fn in (ours, theirs):
        fn()
        time.sleep(settle)
        times = []
        for _ in range(rounds):
            t = _now()
            fn()
            times.append(_now() - t)
        out.append(sorted(times)[len(times) // 2])
    return tuple(out)


def op_table(model, hf, dtype, T=1024, rounds=7):
    """[(op class, calls per forward, refgpt s per call, torch s per call)] plus the whole forward."""
    import torch
    import torch.nn.functional as F

    cfg = model.cfg
    d, H, dh, V, L = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab, cfg.n_layers
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, T, d)).astype(dtype)  # [batch, pos, d_model]
    h = rng.standard_normal((1, T, 4 * d)).astype(dtype)  # [batch, pos, d_mlp]
    tx, th = torch.from_numpy(x), torch.from_numpy(h)
    ln, aw, mw = model.block_weights(0)
    block = hf.transformer.h[0]
    c_attn_w, c_attn_b = block.attn.c_attn.weight.detach(), block.attn.c_attn.bias.detach()
    c_proj_w, c_proj_b = block.attn.c_proj.weight.detach(), block.attn.c_proj.bias.detach()
    fc_w, fc_b = block.mlp.c_fc.weight.detach(), block.mlp.c_fc.bias.detach()
    fcp_w, fcp_b = block.mlp.c_proj.weight.detach(), block.mlp.c_proj.bias.detach()
    ln_w, ln_b = block.ln_1.weight.detach(), block.ln_1.bias.detach()
    wte = hf.transformer.wte.weight.detach()

    q = rng.standard_normal((1, T, H, dh)).astype(dtype)  # [batch, pos, head, d_head]
    qh = np.ascontiguousarray(q.transpose(0, 2, 1, 3))  # [batch, head, pos, d_head]
    tq = torch.from_numpy(qh)
    block_space = np.empty(attn_mod.block_scores_size(qh, qh), dtype)  # one block's scores, as the pass keeps it
    scale = cfg.score_scale(0)
    c = math.sqrt(2.0 / math.pi)

    def refgpt_qkv():
        if "W_QKV" in aw:
            return affine(x, aw["W_QKV"], aw["b_QKV"])
        return [affine(x, aw[f"W_{k}"], aw[f"b_{k}"]) for k in "QKV"]

    def refgpt_heads():  # the copies attention makes to put heads first
        s = (q * scale).transpose(0, 2, 1, 3)
        return s, np.ascontiguousarray(q.transpose(0, 2, 1, 3)), np.ascontiguousarray(q.transpose(0, 2, 1, 3))

    def refgpt_scores_full():
        scores = qh @ qh.transpose(0, 1, 3, 2)  # [batch, head, query, key]
        scores += attn_mod.causal_score_mask(T, 0, scores.dtype)
        return scores

    scores = refgpt_scores_full()
    tscores = torch.from_numpy(scores.copy())
    pattern = attn_mod.softmax(scores)  # [batch, head, query, key]
    tpattern = torch.from_numpy(pattern)

    def torch_gelu():  # HF's NewGELUActivation
        return 0.5 * th * (1.0 + torch.tanh(c * (th + 0.044715 * torch.pow(th, 3.0))))

    ops = [
        ("LayerNorm", 2 * L + 1, lambda: layer_norm(x, ln["ln1.w"], ln["ln1.b"], cfg.eps),
         lambda: F.layer_norm(tx, (d,), ln_w, ln_b, cfg.eps)),
        ("QKV GEMM", L, refgpt_qkv, lambda: torch.addmm(c_attn_b, tx.view(T, d), c_attn_w)),
        ("head split copies", L, refgpt_heads, lambda: torch.from_numpy(q).view(1, T, H, dh).transpose(1, 2)),
        ("attention: products + mask + softmax (causal, blocked)", L,
         lambda: attn_mod.attend_in_blocks(qh, qh, qh, space=block_space),  # the scratch the forward reuses
         lambda: F.scaled_dot_product_attention(tq, tq, tq, is_causal=True)),
        ("  of which scores q·kᵀ (full square)", L, lambda: qh @ qh.transpose(0, 1, 3, 2),
         lambda: tq @ tq.transpose(-1, -2)),
        ("  of which softmax (full square)", L, lambda: attn_mod.softmax(scores),
         lambda: torch.softmax(tscores, -1)),
        ("  of which pattern·v (full square)", L, lambda: pattern @ qh, lambda: tpattern @ tq),
        ("out GEMM", L, lambda: affine(x.reshape(1, T, -1), aw["W_O"], aw["b_O"]),
         lambda: torch.addmm(c_proj_b, tx.view(T, d), c_proj_w)),
        ("MLP in GEMM", L, lambda: affine(x, mw["W_in"], mw["b_in"]), lambda: torch.addmm(fc_b, tx.view(T, d), fc_w)),
        ("GELU", L, lambda: model._act(h), torch_gelu),
        ("MLP out GEMM", L, lambda: affine(h, mw["W_out"], mw["b_out"]), lambda: torch.addmm(fcp_b, th.view(T, -1), fcp_w)),
        ("residual adds", 2 * L, lambda: x + x, lambda: tx + tx),
        ("unembed GEMM", 1, lambda: x @ model.params["unembed.W_U"], lambda: F.linear(tx, wte)),
        ("embedding gather", 1, lambda: model.params["embed.W_E"][np.arange(T)], lambda: wte[torch.arange(T)]),
    ]
    rows = []
    with torch.no_grad():
        for name, calls, ours, theirs in ops:
            a, b = op_medians(ours, theirs, rounds)
            rows.append({"op": name, "calls": calls, "refgpt_ms": 1e3 * a * calls, "torch_ms": 1e3 * b * calls})
            print(f"{dtype} {name:>55}: refgpt {rows[-1]['refgpt_ms']:8.1f} ms  torch {rows[-1]['torch_ms']:8.1f} ms", flush=True)
        tokens = rng.integers(0, V, (1, T))
        tt = torch.from_numpy(tokens)
        a, b = paired_medians(lambda: model(tokens), lambda: hf(tt), max(3, rounds // 2))
        products = products_alone(model, dtype, T)
        p, b2 = paired_medians(products, lambda: hf(tt), max(3, rounds // 2))
        print(f"{dtype} {'products alone':>55}: refgpt {1e3 * p:8.1f} ms  torch's forward {1e3 * b2:8.1f} ms", flush=True)
    counted = [r for r in rows if not r["op"].startswith("  ")]
    rest = {"op": "rest (hooks, Python, what isolated timings miss)", "calls": 1,
            "refgpt_ms": 1e3 * a - sum(r["refgpt_ms"] for r in counted),
            "torch_ms": 1e3 * b - sum(r["torch_ms"] for r in counted)}
    return rows + [rest], {"refgpt_ms": 1e3 * a, "torch_ms": 1e3 * b,
                           "products_ms": 1e3 * p, "products_torch_ms": 1e3 * b2}


def products_alone(model, dtype, T):
    """A function that makes every matrix product refgpt's forward makes over T positions, in the
    forward's order and into buffers of the forward's shapes, and nothing else: no bias, no
    LayerNorm, softmax, GELU, copy or hook. Its time, beside torch's whole forward, is the
    refgpt/torch ratio the forward would reach if all of its other work were free."""
    cfg = model.cfg
    d, H, dh, L = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_layers
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, T, d)).astype(dtype)  # [batch, pos, d_model]
    h = rng.standard_normal((1, T, cfg.d_mlp)).astype(dtype)  # [batch, pos, d_mlp]
    qkv = np.empty((1, T, 3 * H * dh), dtype)  # [batch, pos, 3·head·d_head]
    qh, kh, vh = (rng.standard_normal((1, H, T, dh)).astype(dtype) for _ in range(3))  # [batch, head, pos, d_head]
    z = np.empty((1, T, H, dh), dtype)  # [batch, pos, head, d_head], written head-first as attention writes it
    zh = z.transpose(0, 2, 1, 3)  # [batch, head, pos, d_head], a view
    out = np.empty((1, T, d), dtype)  # [batch, pos, d_model]
    logits = np.empty((1, T, cfg.d_vocab), dtype)  # [batch, pos, d_vocab]
    space = np.empty(attn_mod.block_scores_size(qh, kh), dtype)  # one block's scores
    rows = attn_mod.ROWS
    blocks = [model.block_weights(layer) for layer in range(L)]  # (ln, attn, mlp) weights per block
    W_QKV = [attn_mod.fused_qkv(aw)[0] for _, aw, _ in blocks]  # [d_model, 3·head·d_head] per block, as attention multiplies

    def run():
        for layer, (_, aw, mw) in enumerate(blocks):
            np.matmul(x, W_QKV[layer], out=qkv)  # [batch, pos, 3·head·d_head]
            for i in range(0, T, rows):  # attend_in_blocks's two products per block of queries
                seen = min(i + rows, T)
                q = qh[:, :, i:i + rows]  # [batch, head, rows, d_head]
                scores = space[:q.shape[2] * seen * H].reshape(1, H, q.shape[2], seen)  # [batch, head, rows, seen]
                np.matmul(q, kh[:, :, :seen].transpose(0, 1, 3, 2), out=scores)
                np.matmul(scores, vh[:, :, :seen], out=zh[:, :, i:i + rows])  # [batch, head, rows, d_head]
            np.matmul(z.reshape(1, T, -1), aw["W_O"], out=out)  # [batch, pos, d_model]
            np.matmul(x, mw["W_in"], out=h)  # [batch, pos, d_mlp]
            np.matmul(h, mw["W_out"], out=out)  # [batch, pos, d_model]
        np.matmul(x, model.params["unembed.W_U"], out=logits)  # [batch, pos, d_vocab]

    return run


def run(T=1024, dtypes=("float32", "float64"), rounds=7):
    import torch

    sys.path.insert(0, str(HERE))
    from bench_forward import make_checkpoint

    threads = int(os.environ.get("REFGPT_BENCH_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(threads)
    if CLOCK == "cpu" and (threads != 1 or os.environ.get("OPENBLAS_NUM_THREADS") != "1"):
        raise SystemExit("REFGPT_PROFILE_CLOCK=cpu needs OPENBLAS_NUM_THREADS=1 REFGPT_BENCH_THREADS=1")
    out = {"machine": machine(), "T": T, "threads": threads, "clock": CLOCK, "torch": torch.__version__,
           "numpy": np.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_checkpoint(tmp)
        for dtype in dtypes:
            model = refgpt.load(tmp, dtype=dtype)
            hf = hf.to(getattr(torch, dtype))
            rows, total = op_table(model, hf, dtype, T, rounds)
            out[dtype] = {"ops": rows, "forward": total}
    return out


def markdown(r) -> str:
    lines = [f"## Per-op profile: GPT-2 small, batch 1, T = {r['T']}", "",
             f"`python benchmarks/profile_ops.py` on {describe(r['machine'])}; torch {r['torch']}, numpy "
             f"{r['numpy']}, {r['threads']} thread(s) for both, clock: "
             f"{'process CPU time (one thread each: the work done, whatever else the machine runs)' if r.get('clock') == 'cpu' else 'wall time'}. "
             "Each op timed alone on the forward's shapes, "
             "each op refgpt's rounds then torch's (whole forwards alternating), median of rounds; ms per forward = per call × calls. "
             "Indented rows split the attention row (over the full square: the products and softmax it is made of, sized as for the whole sequence) "
             "and are not added to the total.", "",
             "| op class | calls | f32 refgpt ms | f32 torch ms | f32 ratio | f64 refgpt ms | f64 torch ms | f64 ratio |",
             "|---|---|---|---|---|---|---|---|"]
    f32, f64 = r.get("float32"), r.get("float64")
    for i, row in enumerate((f32 or f64)["ops"]):
        cells = []
        for part in (f32, f64):
            if part is None:
                cells += ["", "", ""]
                continue
            o = part["ops"][i]
            ratio = o["refgpt_ms"] / o["torch_ms"] if o["torch_ms"] > 0.05 else float("nan")
            cells += [f"{o['refgpt_ms']:.1f}", f"{o['torch_ms']:.1f}", f"{ratio:.2f}"]
        lines.append(f"| {row['op']} | {row['calls']} | " + " | ".join(cells) + " |")
    cells = []
    for part in (f32, f64):
        fw = part["forward"] if part else None
        cells += [f"{fw['refgpt_ms']:.0f}", f"{fw['torch_ms']:.0f}", f"{fw['refgpt_ms'] / fw['torch_ms']:.2f}"] if fw else ["", "", ""]
    lines.append("| **whole forward** | 1 | " + " | ".join(cells) + " |")
    cells = []
    for part in (f32, f64):
        fw = part["forward"] if part else None
        if fw and "products_ms" in fw:
            cells += [f"{fw['products_ms']:.0f}", f"{fw['products_torch_ms']:.0f}",
                      f"{fw['products_ms'] / fw['products_torch_ms']:.2f}"]
        else:
            cells += ["", "", ""]
    lines.append("| refgpt's products alone, beside torch's whole forward (the ratio if nothing else cost) | 1 | "
                 + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    result = run(rounds=int(os.environ.get("REFGPT_PROFILE_ROUNDS", 7)))
    text = markdown(result)
    print(text)
    (HERE / f"results_profile_{CLOCK}.json").write_text(json.dumps(result, indent=1, default=str))
    update_section(f"profile-{CLOCK}", text)
