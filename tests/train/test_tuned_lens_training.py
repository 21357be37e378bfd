"""Training a tuned lens (refgpt/train/tuned_lens.py): refgpt's analytic gradient against torch
autograd (≤ 1e-10 relative in float64), clipping and the schedule against torch and transformers
(SGD: tests/train/test_optim.py), the whole loop against the tuned-lens package's own Train.execute on the same
windows, determinism to the byte, and the errors where the package goes on silently."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from random_models import configs, random_params
from refgpt import Config, Model, RefGPTError
from refgpt.gpt2.activations import log_softmax
from refgpt.train import tuned_lens as T
from refgpt.train.tuned_lens import LensSettings, train_tuned_lens

GRADIENT_TOL = 1e-10  # the bound; measured ≤ 2e-14 over 60 random configs (other summation orders)
TORCH_TOL = 1e-12  # clipping: the same operations in the same order; measured ≤ 1e-16
CFG = Config(d_model=12, n_layers=2, n_heads=3, d_mlp=20, d_vocab=23, n_ctx=8)


def model_of(cfg, seed, b_U=True):
    params = random_params(cfg, seed)
    if b_U:
        params["unembed.b_U"] = 0.3 * np.random.default_rng(seed).standard_normal(cfg.d_vocab)
    return Model(cfg, params)


def rel(a, ref):
    """max|a − ref| / max|ref|."""
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def torch_objective(torch, model, h, log_p, W, b):
    """The package's loss for one translator, written in torch: mean KL(p ‖ lens)."""
    p = model.params
    tW, tb = torch.tensor(W, requires_grad=True), torch.tensor(b, requires_grad=True)
    th = torch.tensor(h)
    u = torch.nn.functional.layer_norm(th + th @ tW.T + tb, (model.cfg.d_model,), torch.tensor(p["ln_final.w"]),
                                       torch.tensor(p["ln_final.b"]), model.cfg.eps)
    z = u @ torch.tensor(p["unembed.W_U"])
    if "unembed.b_U" in p:
        z = z + torch.tensor(p["unembed.b_U"])
    labels = torch.tensor(log_p)
    loss = torch.sum(labels.exp() * (labels - z.log_softmax(-1)), dim=-1).mean()
    loss.backward()
    return loss.item(), tW.grad.numpy(), tb.grad.numpy()


@settings(max_examples=12, deadline=None)
@given(configs(max_layers=2), st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from([0.0, 0.3, 2.0]))
def test_the_analytic_gradient_is_torch_autograds(cfg, seed, b_U, size):
    """Random configs, streams from the model itself, translators from zero (the first step) to large."""
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    model = model_of(cfg, seed % 1000, b_U)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.d_vocab, (2, cfg.n_ctx))
    logits, cache = model.run_with_cache(tokens)
    log_p = log_softmax(logits.reshape(-1, cfg.d_vocab))
    d = cfg.d_model
    for i in range(cfg.n_layers):
        h = cache["resid_pre", i].reshape(-1, d)
        W, b = size / np.sqrt(d) * rng.standard_normal((d, d)), size * rng.standard_normal(d)
        loss, gW, gb = T.lens_loss_and_grads(model, h, log_p, W, b, scale=1.0 / len(h))
        ref_loss, ref_W, ref_b = torch_objective(torch, model, h, log_p, W, b)
        assert abs(loss - ref_loss) <= 1e-12 * max(1.0, ref_loss)
        if d == 1:  # LayerNorm of one feature is the constant b: the gradient is exactly 0 (torch's: rounding)
            assert not np.any(gW) and not np.any(gb)
            continue
        assert rel(gW, ref_W) <= GRADIENT_TOL and rel(gb, ref_b) <= GRADIENT_TOL, (rel(gW, ref_W), rel(gb, ref_b))


def test_a_steps_gradient_sums_micro_batches_and_is_autograds(monkeypatch):
    """lens_step_gradients over 5 windows, split into micro-batches of 2 windows, = autograd of the
    mean KL over all of them, translator by translator, at resid_pre and resid_mid."""
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    model = model_of(CFG, 3)
    monkeypatch.setattr(T, "MICRO_BATCH_LOGITS", 2 * CFG.n_ctx * CFG.d_vocab)
    windows = np.random.default_rng(0).integers(0, CFG.d_vocab, (5, CFG.n_ctx))
    rng = np.random.default_rng(1)
    translators = {i: (0.2 * rng.standard_normal((12, 12)), rng.standard_normal(12)) for i in range(2)}
    for stream in ("resid_pre", "resid_mid"):
        losses, grads = T.lens_step_gradients(model, windows, translators, stream)
        logits, cache = model.run_with_cache(windows)
        log_p = log_softmax(logits.reshape(-1, CFG.d_vocab))
        for i in range(2):
            h = cache[f"blocks.{i}.hook_{stream}"].reshape(-1, 12)
            loss, gW, gb = torch_objective(torch, model, h, log_p, *translators[i])
            assert abs(losses[i] - loss) <= 1e-12 * loss
            assert rel(grads[f"{i}.weight"], gW) <= GRADIENT_TOL and rel(grads[f"{i}.bias"], gb) <= GRADIENT_TOL


def test_clipping_is_clip_grad_norm_and_the_schedule_is_transformers_linear_decay():
    torch = pytest.importorskip("torch", reason="peer test: needs torch (the 'peers' extra)")
    transformers = pytest.importorskip("transformers", reason="peer test: needs transformers (the 'peers' extra)")
    rng = np.random.default_rng(2)
    for size in (0.01, 0.2, 1.0, 30.0):  # below and above the norm 1.0
        grads = {k: size * rng.standard_normal(s) for k, s in (("0.weight", (3, 3)), ("0.bias", (3,)), ("1.weight", (3, 3)))}
        tensors = {k: torch.nn.Parameter(torch.zeros(v.shape, dtype=torch.float64)) for k, v in grads.items()}
        for k, t in tensors.items():
            t.grad = torch.tensor(grads[k])
        norm = torch.nn.utils.clip_grad_norm_(list(tensors.values()), 1.0)
        mine = {k: v.copy() for k, v in grads.items()}
        assert abs(T.clip_gradients(mine, 1.0) - float(norm)) <= TORCH_TOL * float(norm)
        for k in grads:
            assert rel(mine[k], tensors[k].grad.numpy()) <= TORCH_TOL
    N = 7
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule = transformers.get_linear_schedule_with_warmup(opt, 0, N)  # the package's, warm-up 0 for SGD
    for step in range(N):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * T.linear_decay(step, N), rel=1e-15)
        opt.step()
        schedule.step()


@pytest.fixture(scope="module")
def package_pair(tmp_path_factory):
    """(HF GPT-2 float64, the same in refgpt, 8 micro-batches of 2 windows of 16 tokens)."""
    from tuned_lens_peer import require_tuned_lens

    require_tuned_lens(training=True)
    from peers import random_hf_config, random_hf_model, save_hf_layout
    import refgpt

    config = random_hf_config(3, n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=16, tie_word_embeddings=False)
    hf = random_hf_model(config, seed=3, dtype="float64", scale=1.5)
    model = refgpt.load(save_hf_layout(hf, tmp_path_factory.mktemp("model")))
    rng = np.random.default_rng(0)
    return hf, model, [rng.integers(0, 40, (2, 16)) for _ in range(8)]


def test_refgpt_trains_what_the_package_trains_on_the_same_windows(package_pair, tmp_path):
    """The package's own Train.execute (its lens, SGD, scheduler, loss, clipping) and refgpt, on a
    float64 GPT-2 and the same windows in the same order, 4 steps, clipped and unclipped ones:
    the same translators to ≤ 1e-12 relative (measured ≤ 1e-15: the same arithmetic summed in
    another order). The package rounds its KL targets to float32 (final_logits.float()): with that
    rounding kept, the translators differ by about u₃₂ = 6e-8 relative (measured 6e-8), which is
    all that rounding does."""
    from tuned_lens_peer import package_train
    from refgpt.files.lens_directory import read_lens

    hf, model, batches = package_pair
    steps, tokens = 4, 64  # 2 micro-batches of 2 windows of 16 tokens per step
    mine = train_tuned_lens(model, iter([np.concatenate(batches[2 * s:2 * s + 2]) for s in range(steps)]),
                            steps=steps, tokens_per_step=tokens)
    assert set(mine.record["clipped"]) == {True, False}  # both branches of clip_grad_norm_ ran
    exact = read_lens(package_train(hf, batches, steps, tokens, tmp_path / "exact", float32_targets=False))
    as_is = read_lens(package_train(hf, batches, steps, tokens, tmp_path / "as-is"))
    assert exact.config["unembed_hash"] == mine.unembed_hash
    for i in range(2):
        for k in range(2):  # weight, bias
            assert rel(mine.translators[i][k], exact.translators[i][k]) <= 1e-12
            assert 1e-9 <= rel(mine.translators[i][k], as_is.translators[i][k]) <= 1e-6


def test_the_package_stops_silently_where_refgpt_refuses(package_pair, tmp_path):
    """tuned-lens #113 (open in 0.2.0): Train.execute zips its step counter with the data loader, so
    a loader that runs dry ends the training early, and the lens is saved as if nothing happened.
    Its Adam warm-up never triggers either: create_scheduler compares an enum with the string "adam"."""
    from tuned_lens.scripts import ingredients
    from tuned_lens_peer import package_train
    import torch

    hf, model, batches = package_pair
    saved = package_train(hf, batches[:4], 4, 64, tmp_path / "short")  # 4 steps asked, data for 2
    assert (saved / "params.pt").is_file()
    with pytest.raises(RefGPTError, match="the data ran out: no windows left for step 3 of 4"):
        train_tuned_lens(model, iter([np.concatenate(batches[2 * s:2 * s + 2]) for s in range(2)]), steps=4,
                         tokens_per_step=64)
    adam = ingredients.Optimizer(optimizer=ingredients.OptimizerOption.ADAM)
    adam.create_scheduler(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]), 100)
    assert adam.warmup_steps == 0  # documented: min(0.2·num_steps, 1000) = 20


def test_training_is_deterministic_to_the_byte_and_lowers_the_kl(tmp_path):
    model = model_of(CFG, 4)
    windows = np.random.default_rng(5).integers(0, CFG.d_vocab, (40, CFG.n_ctx))
    runs = [train_tuned_lens(model, windows, steps=5, tokens_per_step=4 * CFG.n_ctx) for _ in range(2)]
    for k, run in enumerate(runs):
        run.save(tmp_path / f"run{k}")
    for name in ("config.json", "params.pt", "training_log.json"):
        assert (tmp_path / "run0" / name).read_bytes() == (tmp_path / "run1" / name).read_bytes(), name
    kl = np.array(runs[0].record["kl"])
    assert np.all(kl[-1] < kl[0])  # every translator improved on the logit lens (step 1 is at zero)
    other = train_tuned_lens(model, windows, steps=5, tokens_per_step=4 * CFG.n_ctx, seed=7)
    assert not np.array_equal(other.translators[0][0], runs[0].translators[0][0])  # the seed shuffles
    log = json.loads((tmp_path / "run0" / "training_log.json").read_text())
    assert log["settings"]["momentum"] == 0.9 and len(log["kl"]) == 5 and log["lr"][0] == pytest.approx(0.1)
    mid = train_tuned_lens(model, windows, steps=3, tokens_per_step=4 * CFG.n_ctx, stream="resid_mid")
    mid.save(tmp_path / "mid")
    assert json.loads((tmp_path / "mid" / "config.json").read_text())["stream"] == "resid_mid"


def test_what_runs_out_or_goes_wrong_is_an_error_naming_it():
    model = model_of(CFG, 6)
    windows = np.random.default_rng(5).integers(0, CFG.d_vocab, (10, CFG.n_ctx))
    cases = [
        (lambda: train_tuned_lens(model, windows, steps=4, tokens_per_step=3 * CFG.n_ctx),
         r"the data cannot supply the budget: 4 steps × 3 windows of 8 tokens need 12 windows \(96 tokens\), but the "
         r"data has 10 \(80 tokens\)"),
        (lambda: train_tuned_lens(model, windows, steps=1, tokens_per_step=20), "not a whole number of 8-token windows"),
        (lambda: train_tuned_lens(model, iter([windows[:2]] * 3), steps=4, tokens_per_step=2 * CFG.n_ctx),
         r"the data ran out: no windows left for step 4 of 4 \(the data gave 3 steps' worth\)"),
        (lambda: train_tuned_lens(model, iter([]), steps=1), "the data ran out before step 1"),
        (lambda: train_tuned_lens(model, iter([windows[:2], windows[:3]]), steps=2, tokens_per_step=2 * CFG.n_ctx),
         r"step 2's windows are int64 \[3, 8\], expected token ids \[2, 8\]"),
        (lambda: train_tuned_lens(model, windows + CFG.d_vocab, steps=1, tokens_per_step=8), "outside the vocabulary"),
        (lambda: train_tuned_lens(model, windows, steps=0), "steps must be a whole number ≥ 1"),
        (lambda: train_tuned_lens(model, windows, momentum=1.0), r"momentum must be in \[0, 1\)"),
        (lambda: train_tuned_lens(model, windows, stream="resid_post"), "stream must be one of"),
        (lambda: train_tuned_lens(model, windows, dtype="float32"), "the model computes in float64"),
        (lambda: train_tuned_lens(model, windows.astype(float)), "windows must be token ids"),
    ]
    for action, message in cases:
        with pytest.raises(RefGPTError, match=message):
            action()
    with np.errstate(all="ignore"), pytest.raises(RefGPTError, match=r"step 2: translator 0's weight is no longer finite"):
        train_tuned_lens(model, windows, steps=3, tokens_per_step=CFG.n_ctx, lr_scale=1e307)  # tuned-lens #123


def test_a_non_finite_loss_or_gradient_stops_training(monkeypatch):
    model = model_of(CFG, 6)
    windows = np.random.default_rng(5).integers(0, CFG.d_vocab, (10, CFG.n_ctx))
    real = T.lens_step_gradients

    def poisoned(what):
        def step(*args):
            losses, grads = real(*args)
            if what == "loss":
                losses[1] = np.nan
            else:
                grads["0.bias"][0] = np.inf
            return losses, grads
        return step

    monkeypatch.setattr(T, "lens_step_gradients", poisoned("loss"))
    with pytest.raises(RefGPTError, match=r"step 1: translator 1's loss is nan"):
        train_tuned_lens(model, windows, steps=2, tokens_per_step=CFG.n_ctx)
    monkeypatch.setattr(T, "lens_step_gradients", poisoned("grad"))
    with pytest.raises(RefGPTError, match=r"step 1: the gradient's norm is inf"):
        train_tuned_lens(model, windows, steps=2, tokens_per_step=CFG.n_ctx)


def test_float32_training_on_request():
    model = Model(CFG, random_params(CFG, 7), dtype="float32")
    windows = np.random.default_rng(5).integers(0, CFG.d_vocab, (8, CFG.n_ctx))
    lens = train_tuned_lens(model, windows, steps=2, tokens_per_step=2 * CFG.n_ctx, dtype="float32")
    assert lens.translators[0][0].dtype == np.float32


def test_text_windows_are_the_packages_chunks():
    """<|endoftext|> before each text, windows of T, the last partial one dropped; tokens per byte
    of the joined text (each separator counted as its 13 characters, as the package joins them)."""
    import refgpt

    tok = refgpt.load_default().tokenizer
    windows, nats_to_bpb = T.text_windows(tok, ["To be, or not to be", "that is the question"], 4)
    ids = [tok.eot_token, *tok.encode("To be, or not to be"), tok.eot_token, *tok.encode("that is the question")]
    assert windows.tolist() == np.array(ids[:len(ids) // 4 * 4]).reshape(-1, 4).tolist()
    assert nats_to_bpb == pytest.approx(len(ids) / (19 + 20 + 2 * 13) / np.log(2))
    with pytest.raises(RefGPTError, match="no texts"):
        T.text_windows(tok, [], 4)


def test_refgpt_train_lens_and_eval_lens_help_examples_run_as_printed(refgpt_cli, tmp_path, monkeypatch):
    """`refgpt train-lens --help` and `refgpt eval-lens --help` end with examples that run as printed
    (tests/cli_examples.py), in a directory holding only the text a user brings (and, for eval-lens,
    a lens directory: here the one train-lens wrote)."""
    from cli_examples import run_line
    from refgpt.cli.eval_lens import EXAMPLES as EVAL_EXAMPLES
    from refgpt.cli.train_lens import EXAMPLES as TRAIN_EXAMPLES

    text = (__import__("pathlib").Path(__file__).parents[1] / "data" / "macbeth_act1.txt").read_text()[:6000]
    (tmp_path / "macbeth.txt").write_text(text)
    monkeypatch.chdir(tmp_path)
    for name, examples in (("train-lens", TRAIN_EXAMPLES), ("eval-lens", EVAL_EXAMPLES)):
        shown = refgpt_cli.in_process(name, "--help").stdout
        assert shown.startswith(f"usage: refgpt {name}") and shown.endswith(
            "examples:\n" + "".join(f"  {line}\n" for line in examples))
    trained, mid = (run_line(refgpt_cli, line, monkeypatch)[0] for line in TRAIN_EXAMPLES)
    assert trained.stderr.count("lens step") == 2 and "lens step 2/2" in trained.stderr and "KL per translator" in trained.stderr
    assert {p.name for p in (tmp_path / "my-lens").iterdir()} == {"config.json", "params.pt", "training_log.json"}
    config = json.loads((tmp_path / "my-lens" / "config.json").read_text())
    assert config["base_model_name_or_path"] == "refgpt.weights/default" and config["num_hidden_layers"] == 4
    assert json.loads(mid.stdout)["stream"] == "resid_mid"
    (tmp_path / "lens-dir").symlink_to(tmp_path / "my-lens")
    shipped, mine = (run_line(refgpt_cli, line, monkeypatch)[0] for line in EVAL_EXAMPLES)
    assert "nats per token" in shipped.stdout and "bits per byte" in shipped.stdout and "default_lens" in shipped.stdout
    answer = json.loads(mine.stdout)
    assert answer["windows"] == 8 and answer["layers"] == ["0_pre", "1_pre", "2_pre", "3_pre"]
    assert set(answer["nats"]["lenses"]) == {"logit", "tuned"} and "bits_per_byte" in answer


def test_refgpt_lens_train_and_eval_errors_are_one_line(refgpt_cli, tmp_path):
    text = tmp_path / "act1.txt"
    text.write_text((__import__("pathlib").Path(__file__).parents[1] / "data" / "macbeth_act1.txt").read_text()[:3000])
    too_much = refgpt_cli.in_process("train-lens", "--text", text, "-o", tmp_path / "x", "--steps", "500")
    assert too_much.returncode == 1 and "the data cannot supply the budget" in too_much.stderr
    assert too_much.stderr.count("\n") == 2 and not (tmp_path / "x").exists()  # the announcement, then one error line
    missing = refgpt_cli.in_process("train-lens", "--text", tmp_path / "none.txt", "-o", tmp_path / "x")
    assert missing.returncode == 1 and "--text" in missing.stderr and "not found" in missing.stderr
    usage = refgpt_cli.in_process("train-lens", "--text", text)
    assert usage.returncode == 2 and "-o/--output" in usage.stderr
    bos = refgpt_cli.in_process("train-lens", "--text", text, "-o", tmp_path / "x", "--bos")
    assert bos.returncode == 2 and "takes no --bos" in bos.stderr
    short = refgpt_cli.in_process("eval-lens", "--text", text, "--max-tokens", "5")
    assert short.returncode == 2 and "less than one window" in short.stderr
