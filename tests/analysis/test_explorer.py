"""The explorer's data document: every number it holds is the model's, to its stated rounding, and the
page carries it intact (no text in a token can end the data block); the notebook object and the
command write the same page.

The page itself is tested in headless Chromium in test_explorer_browser.py.
"""

from __future__ import annotations

import html
import math
import json
import re

import numpy as np
import pytest

import refgpt
from random_models import random_model
from refgpt import Config, RefGPTError
from refgpt.analysis import explorer
from refgpt.analysis.attribution import attribute
from refgpt.analysis.interventions import steering_vector
from refgpt.analysis.lens import TunedLens, fit_least_squares_translators, logit_lens, tuned_lens
from refgpt.analysis.measurements import norm

TEXT = "My lord, I am glad to see you well."


@pytest.fixture(scope="module")
def model():
    return refgpt.load_default()


@pytest.fixture(scope="module")
def page(model):
    """The embedded model's page with its defaults: the tuned-lens view is the shipped lens's."""
    steering = {"plus": "Love", "minus": "Hate", "layer": 2, "coeffs": [1.0, 10.0, 1e6]}
    return explorer.explore(model, TEXT, target=" lord", steering=steering), TunedLens.load(model)


def document_of(page_html: str) -> dict:
    """The JSON document as a reader of the file finds it: the one script element with its id."""
    found = re.findall(r'<script type="application/json" id="refgpt-data">(.*?)</script>', page_html, re.S)
    assert len(found) == 1
    return json.loads(found[0])


@pytest.mark.slow
def test_the_page_holds_the_document_and_nothing_else_from_outside(page):
    p, _ = page
    text = p.html
    assert document_of(text) == p.data
    assert p.data["schema"] == explorer.SCHEMA
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", text)  # no external resource
    assert "default-src 'none'" in text  # and the browser refuses any the page would try (CSP)


def test_tokens_are_the_input_as_to_str_tokens_gives_them(model, page):
    p, _ = page
    assert p.data["tokens"] == model.to_str_tokens(TEXT)
    assert p.data["token_ids"] == model.to_tokens(TEXT)[0].tolist()
    assert p.data["target"] == {"id": model.to_single_token(" lord"), "token": " lord"}


def test_the_document_matches_run_with_cache_to_its_stated_rounding(model, page):
    p, _ = page
    d = p.data
    logits, cache = model.run_with_cache(TEXT)
    cfg = model.cfg
    assert d["layers"] == list(range(cfg.n_layers)) and d["heads"] == list(range(cfg.n_heads))
    for L in range(cfg.n_layers):
        pattern = cache[f"blocks.{L}.attn.hook_pattern"][0]  # [head, query, key]
        for h in range(cfg.n_heads):
            rows = explorer.decode_pattern(d["pattern"][L][h], len(d["tokens"]))
            assert [len(r) for r in rows] == list(range(1, pattern.shape[1] + 1))  # keys 0 … query
            for q, row in enumerate(rows):
                # whole thousandths: |stored·unit − weight| ≤ unit/2 (+ the rounding of the product)
                assert np.all(np.abs(np.array(row) * d["pattern_unit"] - pattern[h, q, :q + 1]) <= 0.5e-3 + 1e-15)
    for L in range(cfg.n_layers):
        for ln in ("ln1", "ln2"):
            assert d["ln_scale"][f"blocks.{L}.{ln}"] == cache[f"blocks.{L}.{ln}.hook_scale"][0, :, 0].tolist()
            assert d["ln_mean"][f"blocks.{L}.{ln}"] == cache[f"blocks.{L}.{ln}.hook_mean"][0, :, 0].tolist()
    assert d["ln_scale"]["ln_final"] == cache["ln_final.hook_scale"][0, :, 0].tolist()
    assert len(d["ln_scale"]) == 2 * cfg.n_layers + 1
    norms = dict(zip(d["resid_norm"]["streams"], d["resid_norm"]["values"]))
    assert norms["2_mid"] == norm(cache["blocks.2.hook_resid_mid"][0]).tolist()
    assert norms["final_post"] == norm(cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"][0]).tolist()


@pytest.mark.parametrize("kind", ["logit", "tuned"])
def test_the_lens_views_are_the_lens_modules_numbers(model, page, kind):
    p, translators = page
    lens = p.data["lens"][kind]
    _, cache = model.run_with_cache(TEXT)
    result = logit_lens(cache) if kind == "logit" else tuned_lens(cache, translators)
    ids, probs = result.top(1)  # [stream, batch, pos, 1]
    assert lens["top_id"] == ids[:, 0, :, 0].tolist()
    np.testing.assert_allclose(lens["top_prob"], probs[:, 0, :, 0], rtol=1e-12)
    assert lens["top_token"][-1] == [model.to_single_str_token(int(i)) for i in ids[-1, 0, :, 0]]
    target = p.data["target"]["id"]
    np.testing.assert_allclose(lens["target_prob"], result.prob(target)[:, 0], rtol=1e-12)
    log_p = result.log_probs()[:, 0]  # [stream, pos, d_vocab]
    rank = 1 + (log_p > log_p[..., target:target + 1]).sum(-1)
    assert lens["target_rank"] == rank.tolist()
    assert np.all(np.array(lens["kl"][-1]) == 0.0)  # the final stream is the model's own distribution
    assert np.all(np.array(lens["kl"]) >= 0.0) and np.all(np.array(lens["entropy"]) > 0.0)
    p_all = np.exp(log_p)
    np.testing.assert_allclose(lens["entropy"], -(p_all * log_p).sum(-1), rtol=1e-12)


@pytest.mark.slow
def test_the_tuned_view_is_the_lens_it_is_given_as_refgpt_lens_takes_it(model, page, tmp_path):
    """Default: the shipped lens (named "shipped"); a lens directory, a translator file, a TunedLens
    or {layer: (W, b)} (lens=, or tuned= by its old name) give that lens's numbers; False: none."""
    p, shipped = page
    assert p.data["lens"]["tuned_source"] == "shipped"
    least_squares = fit_least_squares_translators(model.run_with_cache(TEXT + " And so farewell.")[1])
    TunedLens(model, least_squares).save(tmp_path / "lens-dir")
    _, cache = model.run_with_cache(TEXT)
    expected = tuned_lens(cache, least_squares).top(1)[0][:, 0, :, 0].tolist()
    assert expected != p.data["lens"]["tuned"]["top_id"]  # another lens: the test can tell them apart
    for given, source in ((least_squares, "arrays"), (tmp_path / "lens-dir", "lens-dir"),  # its name, not its path
                          (TunedLens.load(model, tmp_path / "lens-dir"), "lens-dir")):
        d = explorer.explore(model, TEXT, lens=given).data["lens"]
        assert d["tuned"]["top_id"] == expected and d["tuned_source"] == source
    assert explorer.explore(model, TEXT, tuned=least_squares).data["lens"]["tuned"]["top_id"] == expected
    off = explorer.explore(model, TEXT, lens=False).data["lens"]
    assert off["tuned"] is None and off["tuned_source"] is None


def test_a_lens_that_does_not_fit_the_page_is_refused_by_name(model, tmp_path):
    d = model.cfg.d_model
    zero = {M: (np.zeros((d, d)), np.zeros(d)) for M in range(model.cfg.n_layers)}
    with pytest.raises(RefGPTError, match="not both"):
        explorer.explore(model, TEXT, lens=zero, tuned=zero)
    TunedLens(model, zero, stream="resid_mid").save(tmp_path / "mid")
    with pytest.raises(RefGPTError, match="reads resid_mid"):
        explorer.explore(model, TEXT, lens=tmp_path / "mid")
    with pytest.raises(RefGPTError, match="no translator for layer 3"):
        explorer.explore(model, TEXT, lens={M: zero[M] for M in range(3)})
    other = random_model(Config(d_model=8, n_layers=2, n_heads=2, d_mlp=8, d_vocab=30, n_ctx=20), seed=3)
    TunedLens(other, {M: (np.zeros((8, 8)), np.zeros(8)) for M in range(2)}).save(tmp_path / "other")
    with pytest.raises(RefGPTError, match="a lens for d_model 8, 2 layers"):
        explorer.explore(model, TEXT, lens=tmp_path / "other")
    with pytest.raises(RefGPTError, match="lens must be"):
        explorer.explore(model, TEXT, lens=3)


def test_the_attribution_sums_to_the_logit_it_names(model, page):
    p, _ = page
    a = p.data["attribution"]
    logits, cache = model.run_with_cache(TEXT)
    target = p.data["target"]["id"]
    assert a["logit"] == logits[0, :, target].tolist()
    values = np.array(a["values"])  # [component, pos]
    assert np.max(np.abs(values.sum(0) - a["logit"])) <= 1e-12 * max(1.0, np.max(np.abs(a["logit"])))
    expected = attribute(cache, target, granularity="head")
    assert a["labels"] == expected.labels
    assert np.array_equal(values, expected.values[:, 0])


def test_the_steering_runs_are_the_steered_model(model, page):
    p, _ = page
    s = p.data["steering"]
    tokens = model.to_tokens(TEXT)
    assert [r["coeff"] for r in s["runs"]] == [1.0, 10.0, 1e6]
    _, clean = model.run_with_cache(tokens)
    assert s["clean"]["resid_norm"][0] == norm(clean["blocks.0.hook_resid_pre"][0]).tolist()
    for run in s["runs"]:
        sv = steering_vector(model, "Love", "Hate", 2, run["coeff"])
        logits, cache = model.run_with_cache(tokens, fwd_hooks=sv)
        names = p.data["resid_norm"]["streams"]
        assert run["resid_norm"][names.index("2_pre")] == norm(cache["blocks.2.hook_resid_pre"][0]).tolist()
        top = np.argmax(logits[0], axis=-1)
        assert [row[0] for row in run["next_token"]] == [model.to_single_str_token(int(t)) for t in top]
        assert all(0.0 <= k for k in run["kl"])
    # Position 0 is <|endoftext|> in both prompts, so the vector's row 0 is 0; row 1 grows with C.
    steered = [run["resid_norm"][names.index("2_pre")] for run in s["runs"]]
    assert steered[0][0] == steered[-1][0] and steered[-1][1] > 1e5 > steered[0][1]


@pytest.mark.slow
def test_text_that_looks_like_markup_stays_data(model):
    hostile = '</script><script>alert(1)</script><!-- {{data}} "'
    p = explorer.explore(model, hostile)
    text = p.html
    assert document_of(text)["tokens"] == model.to_str_tokens(hostile)
    assert text.count("</script>") == 2  # the data block's and the code's, nothing from the text
    assert "<script>alert" not in text  # in the title it is escaped, in the data \\u003c


def test_layers_and_heads_choose_what_the_page_holds(model):
    p = explorer.explore(model, TEXT, layers=[3, 1], heads=[0])
    assert p.data["layers"] == [1, 3] and p.data["heads"] == [0]
    assert len(p.data["pattern"]) == 2 and len(p.data["pattern"][0]) == 1
    _, cache = model.run_with_cache(TEXT)
    row = np.array(explorer.decode_pattern(p.data["pattern"][1][0], len(p.data["tokens"]))[-1]) * 1e-3
    assert np.all(np.abs(row - cache["blocks.3.attn.hook_pattern"][0, 0, -1]) <= 0.5e-3 + 1e-15)
    for bad, what in (([4], "layers"), ([], "layers")):
        with pytest.raises(RefGPTError, match=what):
            explorer.explore(model, TEXT, **{what: bad})
    with pytest.raises(RefGPTError, match="heads"):
        explorer.explore(model, TEXT, heads=[-1])


def test_a_model_without_a_tokenizer_shows_ids():
    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_mlp=8, d_vocab=30, n_ctx=20)
    p = explorer.explore(random_model(cfg, seed=3), [3, 1, 4, 1, 5])
    assert p.data["tokens"] == ["#3", "#1", "#4", "#1", "#5"] and p.data["lens"]["tuned"] is None  # no lens shipped
    assert p.data["steering"] is None and p.data["text"] is None
    with pytest.raises(RefGPTError, match="one sequence"):
        explorer.explore(random_model(cfg, seed=3), [[1, 2], [3, 4]])


def test_the_notebook_object_renders_the_same_page_in_an_iframe(page):
    p, _ = page
    shown = p._repr_html_()
    srcdoc = re.fullmatch(r'<iframe srcdoc="(.*)" title="refgpt explorer" style="[^"]*"></iframe>', shown, re.S)
    assert srcdoc and html.unescape(srcdoc.group(1)) == p.html
    assert '"' not in srcdoc.group(1)  # the attribute cannot end early


def test_save_writes_the_page(page, tmp_path):
    p, _ = page
    path = p.save(tmp_path / "page.html")
    assert path.read_text(encoding="utf-8") == p.html


@pytest.mark.slow
def test_the_command_writes_the_page(refgpt_cli, tmp_path, model):
    out = tmp_path / "page.html"
    done = refgpt_cli.in_process("explore", TEXT, "--target", " lord", "-o", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out}: {len(model.to_tokens(TEXT, prepend_bos=False)[0])} tokens")
    data = document_of(out.read_text(encoding="utf-8"))
    assert data == explorer.explore(model, model.to_tokens(TEXT, prepend_bos=False)[0], target=" lord").data
    steered = refgpt_cli.in_process("explore", TEXT, "--plus", "Love", "--minus", "Hate", "--layer", "1",
                                    "--coeff", "2", "--coeff", "20", "-o", out)
    assert steered.returncode == 0, steered.stderr
    assert [r["coeff"] for r in document_of(out.read_text(encoding="utf-8"))["steering"]["runs"]] == [2.0, 20.0]


@pytest.mark.slow
def test_the_command_takes_the_tuned_lens_as_refgpt_lens_does(refgpt_cli, tmp_path, model):
    """The shipped lens by default on the embedded model, --lens DIR (or --translators) otherwise,
    --no-tuned for none; on another model without --lens the page has no tuned view."""
    tokens = model.to_tokens(TEXT, prepend_bos=False)[0]
    out = tmp_path / "page.html"
    done = refgpt_cli.in_process("explore", TEXT, "-o", out)
    assert done.returncode == 0 and "tuned lens: shipped" in done.stdout, done.stderr
    assert document_of(out.read_text(encoding="utf-8"))["lens"] == explorer.explore(model, tokens).data["lens"]
    least_squares = fit_least_squares_translators(model.run_with_cache(TEXT)[1])
    TunedLens(model, least_squares).save(tmp_path / "lens-dir")
    for option in ("--lens", "--translators"):
        done = refgpt_cli.in_process("explore", TEXT, option, tmp_path / "lens-dir", "-o", out, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["tuned_lens"] == "lens-dir"  # as the page names it: no path
        assert (document_of(out.read_text(encoding="utf-8"))["lens"]["tuned"]
                == explorer.explore(model, tokens, lens=least_squares).data["lens"]["tuned"])
    done = refgpt_cli.in_process("explore", TEXT, "--no-tuned", "-o", out)
    assert done.returncode == 0 and "tuned lens: none" in done.stdout
    assert document_of(out.read_text(encoding="utf-8"))["lens"]["tuned"] is None
    other = tmp_path / "other-model"
    params = random_model(model.cfg, seed=3).params  # the embedded model's shape and tokenizer, other weights
    retrained = refgpt.Model(model.cfg, {**params, "unembed.W_U": params["embed.W_E"].T})
    retrained.tokenizer = model.tokenizer
    refgpt.save(retrained, other)
    done = refgpt_cli.in_process("explore", TEXT, "--model", other, "-o", out)
    assert done.returncode == 0 and "tuned lens: none" in done.stdout, done.stderr


@pytest.mark.parametrize("args, message", [
    (["--plus", "Love", "--layer", "1"], "steering needs all of --plus, --minus and --layer"),
    (["--coeff", "3"], "--coeff and --positions go with --plus, --minus and --layer"),
    (["--layers", "1,x"], "is not a list like 0,3,5-7"),
    (["--no-tuned", "--lens", "x"], "--no-tuned shows no tuned lens"),
])
def test_the_command_refuses_incomplete_options(refgpt_cli, tmp_path, args, message):
    done = refgpt_cli.in_process("explore", TEXT, "-o", tmp_path / "p.html", *args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.html").exists()


def test_a_layer_outside_the_model_is_one_line(refgpt_cli, tmp_path):
    done = refgpt_cli.in_process("explore", TEXT, "-o", tmp_path / "p.html", "--layers", "9")
    assert done.returncode == 1 and done.stderr.startswith("refgpt: error: explore: layers must be")


def test_the_primers_layernorm_picture_says_what_the_model_does(model):
    """docs/primer.md, beside the LayerNorm figure: σ grows 15–35× across block 0's MLP, then stays
    within a factor of 2 at each position (the figure's text, docs/make_explorer_figures.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs"))
    from make_explorer_figures import TEXT as FIGURE_TEXT

    d = explorer.explore(model, FIGURE_TEXT, prepend_bos=True).data["ln_scale"]
    jump = np.array(d["blocks.1.ln1"]) / np.array(d["blocks.0.ln2"])
    assert np.all((15 < jump) & (jump < 35))
    later = np.array([d[f"blocks.{L}.{ln}"] for L in range(1, 4) for ln in ("ln1", "ln2")] + [d["ln_final"]])
    assert np.all(later.max(0) / later.min(0) < 2)


def test_the_pattern_strings_round_trip_every_weight_and_are_one_character_below_0_062():
    """pattern_string writes each thousandth 0 … 1000 so that decode_pattern reads it back, one
    character below 62 and two from 62 on, and refuses a string of the wrong length."""
    n = 45  # 45·46/2 = 1035 weights: every value 0 … 1000 once, then some
    values = np.concatenate([np.arange(1001), np.zeros(34, np.int64)])
    pattern = np.zeros((n, n))
    pattern[np.tril_indices(n)] = values * 1e-3
    text = explorer.pattern_string(pattern)
    assert len(text) == 1035 + (1001 - 62)
    rows = explorer.decode_pattern(text, n)
    assert np.concatenate(rows).tolist() == values.tolist()
    assert not set(text) & set('"\\<')  # nothing JSON escapes, nor the page's \\u003c for <
    with pytest.raises(RefGPTError, match="holds 1035 weights"):
        explorer.decode_pattern(text + "0", n)


# ---- the SAE view (refgpt/sae/page.py) ------------------------------------------------------------

EPS = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def sae_page(model):
    import refgpt.sae
    from refgpt.files.default_model import default_sae_path
    from refgpt.sae import load_sae

    sae = load_sae(default_sae_path())
    return refgpt.sae.explore(model, TEXT, sae, target=" lord", lens=False), sae


@pytest.mark.slow
def test_the_sae_view_is_attribute_features_and_feature_logits(model, sae_page):
    """Every SAE number on the page is attribute_features's (head granularity) or feature_logits's,
    bit for bit; per position the page keeps the active features of largest |contribution| and sums
    the others in "rest", so what it holds sums to the model's logit (≤ 1e-12 relative)."""
    from refgpt.sae.attribution import attribute_features, feature_logits
    from refgpt.sae.page import FEATURES_SHOWN, LOGITS_SHOWN

    p, sae = sae_page
    d, target = p.data["sae"], p.data["target"]["id"]
    logits, cache = model.run_with_cache(TEXT)  # [1, pos, d_vocab]
    a = attribute_features(cache, sae, target, granularity="head", logits=logits)
    f = a.features[0]  # [pos, d_sae]
    first = a.labels.index("F0")
    assert a.labels[first:first + sae.d_sae] == [f"F{i}" for i in range(sae.d_sae)]
    c = a.values[first:first + sae.d_sae, 0].T  # [pos, d_sae] each feature's contribution
    assert d["hook"] == sae.hook_name_out and d["d_sae"] == sae.d_sae and d["source"] == "shipped"
    assert set(d["labels"]) == {label for label in a.labels if not label.startswith("F")}
    for label, values in zip(d["labels"], d["values"], strict=True):
        assert values == a[label][0].tolist()
    named = set()
    for j, here in enumerate(d["positions"]):
        active = np.flatnonzero(f[j])  # [l0]
        shown = here["features"]
        named.update(shown)
        assert d["l0"][j] == len(active) and here["n_rest"] == len(active) - len(shown)
        assert len(shown) == min(FEATURES_SHOWN, len(active)) and set(shown) <= set(active.tolist())
        contribution = c[j, shown]  # [shown]
        assert here["contribution"] == contribution.tolist()
        others = c[j, sorted(set(active.tolist()) - set(shown))]  # [rest]
        assert np.all(np.diff(np.abs(contribution)) <= 0)  # largest |contribution| first
        assert np.all(np.abs(others) <= np.abs(contribution).min(initial=np.inf))
        assert np.all(c[j, f[j] == 0] == 0)  # an inactive feature writes exactly nothing: "rest" misses nothing
        # rest: a sum of len(others) numbers in another order; |Δ| ≤ 2·n·ε·Σ|term| (Higham's γ_n, twice)
        assert abs(here["rest"] - math.fsum(others)) <= 2 * len(others) * EPS * np.abs(others).sum()
        held = [v[j] for v in d["values"]] + here["contribution"] + [here["rest"]]
        logit = logits[0, j, target]
        assert p.data["attribution"]["logit"][j] == logit
        assert abs(math.fsum(held) - logit) <= 1e-12 * abs(logit)
    assert {int(i) for i in d["features"]} == named
    ids = sorted(named)
    every = feature_logits(model, sae, ids)  # [feature, d_vocab]
    u = model.params["ln_final.w"][:, None] * model.params["unembed.W_U"]  # [d_model, d_vocab]
    strings = model.to_str_tokens(np.arange(model.cfg.d_vocab), prepend_bos=False)
    for k, i in enumerate(ids):
        info = d["features"][str(i)]
        assert info["activation"] == [[int(q), f[q, i]] for q in np.flatnonzero(f[:, i])]
        for side, order in (("top", np.argsort(-every[k], kind="stable")), ("bottom", np.argsort(every[k], kind="stable"))):
            assert info[side]["ids"] == order[:LOGITS_SHOWN].tolist()  # the extremes, in order
            assert info[side]["values"] == every[k, info[side]["ids"]].tolist()
            assert all(d["token_strings"][str(t)] == strings[t] for t in info[side]["ids"])
        if k < 3:  # one feature at a time gives the same numbers, to the rounding of a d_model-term dot
            # product (γ_d·Σ|term| each way, Higham): the batched [feature, d_model] @ [d_model, d_vocab]
            # may add in another order
            bound = 2 * model.cfg.d_model * EPS * (np.abs(sae.W_dec[i]) @ np.abs(u - u.mean(0)))  # [d_vocab]
            assert np.all(np.abs(feature_logits(model, sae, i) - every[k]) <= bound)
    assert ids  # the shipped SAE is active on this text


def test_the_sae_view_is_only_there_when_asked_and_wants_an_sae(model):
    page = explorer.explore(model, "To be", lens=False, layers=[0], heads=[0])
    assert page.data["sae"] is None
    with pytest.raises(RefGPTError, match=r"refgpt\.sae\.explore\(model, text, sae"):
        explorer.explore(model, "To be", lens=False, sae="weights/default_sae")


@pytest.mark.slow
def test_the_command_writes_the_sae_view(refgpt_cli, tmp_path, model, sae_page):
    p, _ = sae_page
    out = tmp_path / "page.html"
    done = refgpt_cli.in_process("explore", TEXT, "--target", " lord", "--bos", "--no-tuned", "--sae", "default",
                                 "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sae"] == "blocks.2.hook_resid_pre"
    assert document_of(out.read_text(encoding="utf-8"))["sae"] == p.data["sae"]
    missing = refgpt_cli.in_process("explore", TEXT, "--sae", tmp_path / "nowhere", "-o", out)
    assert missing.returncode == 1 and missing.stderr.startswith("refgpt: error:") and "nowhere" in missing.stderr


def test_docs_state_what_the_sae_view_keeps():
    from doc_pages import DOCS
    from refgpt.sae.page import FEATURES_SHOWN, LOGITS_SHOWN

    text = " ".join((DOCS / "explorer.md").read_text(encoding="utf-8").split())
    assert f"the **{FEATURES_SHOWN} active features of largest |contribution|**" in text
    assert f"the {LOGITS_SHOWN} tokens it promotes and the {LOGITS_SHOWN} it suppresses" in text
    assert f"`features_shown` ({FEATURES_SHOWN}), `logits_shown` ({LOGITS_SHOWN})" in text


def test_the_lens_hovers_top_ten_are_the_lens_modules_to_four_digits(model, page):
    """Each lens cell's ten most likely tokens, in order, as the lens module ranks them; their
    probabilities rounded to TOP10_DIGITS significant digits (|stored − p| ≤ 5·10⁻⁴·p)."""
    p, translators = page
    _, cache = model.run_with_cache(TEXT)
    for kind, result in (("logit", logit_lens(cache)), ("tuned", tuned_lens(cache, translators))):
        lens = p.data["lens"][kind]
        ids, probs = result.top(10)  # [stream, batch, pos, 10]
        assert lens["top10_token"] == [[model.to_str_tokens(cell, prepend_bos=False) for cell in row]
                                       for row in ids[:, 0]]
        stored = np.array(lens["top10_prob"])  # [stream, pos, 10]
        assert np.all(np.abs(stored - probs[:, 0]) <= 0.5 * 10.0 ** (1 - explorer.TOP10_DIGITS) * probs[:, 0])
        assert [[cell[0] for cell in row] for row in lens["top10_token"]] == lens["top_token"]


def test_the_actual_next_token_attribution_is_attribute_with_each_positions_next_token(model, page):
    p, _ = page
    actual = p.data["attribution"]["actual"]
    logits, cache = model.run_with_cache(TEXT)
    tokens = model.to_tokens(TEXT)[0]
    assert actual["ids"] == tokens[1:].tolist()
    expected = attribute(cache, np.append(tokens[1:], 0)[None], granularity="layer")
    assert actual["labels"] == expected.labels
    assert np.array_equal(np.array(actual["values"]), expected.values[:, 0, :-1])
    assert actual["logit"] == logits[0, np.arange(len(tokens) - 1), tokens[1:]].tolist()
    values = np.array(actual["values"])  # [component, pos − 1]
    assert np.max(np.abs(values.sum(0) - actual["logit"])) <= 1e-12 * max(1.0, np.max(np.abs(actual["logit"])))


def test_what_a_part_pushes_is_its_attribution_for_every_token(model, page):
    """A part's pushes are its attribution with each listed token as the target (by layer and by
    head, rounded to TOP10_DIGITS digits); the first token up is the part's largest over the whole
    vocabulary, computed here from another route (hook_mlp_out − b_out, hook_embed)."""
    p, _ = page
    pushes = p.data["attribution"]["pushes"]
    _, cache = model.run_with_cache(TEXT)
    n_pos = len(p.data["tokens"])
    assert pushes["positions"] == list(range(n_pos))  # the embedded model's page fits every position
    rel = 0.5 * 10.0 ** (1 - explorer.TOP10_DIGITS)
    j = n_pos - 1
    for label in ("embed", "L0H1", "L1H2.b_V", "L2.attn", "L2.b_O", "L3.mlp", "ln_final.b"):
        k = pushes["labels"].index(label)
        ids = pushes["up_ids"][k][j] + pushes["down_ids"][k][j]
        stored = np.array(pushes["up"][k][j] + pushes["down"][k][j])
        granularity = "head" if re.match(r"L\d+H", label) or label in ("embed", "ln_final.b") else "layer"
        exact = []
        for t in ids:
            a = attribute(cache, int(t), granularity=granularity)
            exact.append(a.values[a.labels.index(label), 0, j])
        assert np.all(np.abs(stored - exact) <= rel * np.abs(exact) + 1e-300), label
        assert all(u >= d for u, d in zip(pushes["up"][k][j], pushes["up"][k][j][1:])), label
    p_ = model.params
    sigma = cache["ln_final.hook_scale"][0, j, 0]
    for label, write in (("L3.mlp", cache["blocks.3.hook_mlp_out"][0, j] - p_["blocks.3.mlp.b_out"]),
                         ("embed", cache["hook_embed"][0, j])):
        row = (p_["ln_final.w"] * (write - write.mean()) / sigma) @ p_["unembed.W_U"]  # [d_vocab]
        k = pushes["labels"].index(label)
        assert pushes["up_ids"][k][j][0] == int(np.argmax(row)) and pushes["down_ids"][k][j][0] == int(np.argmin(row))


def test_the_steered_runs_ln1_and_attention_are_the_models(model, page):
    """What block 2's attention reads at the steered positions, γ ⊙ (x − mean)/σ + β from the steered
    cache, and the steered patterns of layers 2 and 3 (stored in thousandths), their largest total
    variation from the largest coefficient's, and the relative changes of ln1's output and of the stream."""
    p, _ = page
    s = p.data["steering"]
    tokens = model.to_tokens(TEXT)
    assert s["pattern_layers"] == [2, 3]
    caches = [model.run_with_cache(tokens, fwd_hooks=steering_vector(model, "Love", "Hate", 2, r["coeff"]))[1]
              for r in s["runs"]]
    w, b = model.params["blocks.2.ln1.w"], model.params["blocks.2.ln1.b"]
    ln1 = [c["blocks.2.ln1.hook_normalized"][0, s["positions"]] * w + b for c in caches]  # [steered, d_model] each
    x = [c["blocks.2.hook_resid_pre"][0, s["positions"]] for c in caches]
    n = len(tokens[0])
    for r, c, out, stream in zip(s["runs"], caches, ln1, x, strict=True):
        assert np.array_equal(np.array(r["ln1_out"]), out)
        assert r["ln1_change"] == (norm(out - ln1[-1]) / norm(ln1[-1])).tolist()
        assert r["resid_change"] == (norm(stream - x[-1]) / norm(x[-1])).tolist()
        for li, L in enumerate(s["pattern_layers"]):
            A, A_max = c[f"blocks.{L}.attn.hook_pattern"][0], caches[-1][f"blocks.{L}.attn.hook_pattern"][0]
            assert r["pattern_tv"][li] == (0.5 * np.abs(A - A_max).sum(-1).max(-1)).tolist()
            for h in range(model.cfg.n_heads):
                stored = np.array([row + [0] * (n - len(row)) for row in explorer.decode_pattern(r["pattern"][li][h], n)])
                assert np.max(np.abs(stored * explorer.PATTERN_UNIT - A[h])) <= 0.5e-3 + 1e-15
    assert np.array_equal(np.array(s["clean"]["ln1_out"]),
                          model.run_with_cache(tokens)[1]["blocks.2.ln1.hook_normalized"][0, s["positions"]] * w + b)


@pytest.mark.slow  # three pages
def test_the_pushes_and_their_budget_do_not_depend_on_the_block_size(model, monkeypatch):
    """Read out PUSH_ROWS parts at a time or all at once: the same lists; a budget of one position's rows keeps the last."""
    whole = explorer.explore(model, "To be, or not to", lens=False).data["attribution"]["pushes"]
    monkeypatch.setattr(explorer, "PUSH_ROWS", 7)  # blocks that split the parts, the constant in the last
    assert explorer.explore(model, "To be, or not to", lens=False).data["attribution"]["pushes"] == whole
    cfg = model.cfg
    monkeypatch.setattr(explorer, "PUSH_BUDGET", 1.0)  # less than one position's rows: the last position still
    assert explorer.explore(model, "To be, or not to", lens=False).data["attribution"]["pushes"]["positions"] == \
        [len(whole["up_ids"][0]) - 1] and cfg.n_layers == 4


@pytest.mark.parametrize("n, k", [(50257, 10), (8192, 8), (20, 10), (10, 10), (6, 3), (100, 8)])
def test_top_k_is_a_stable_sort_of_each_row_cut_to_k(n, k):
    """The lens hovers' and the pushes' selection: the k largest of each row, largest first, ties to the
    lower index, as np.argsort(-x, kind="stable") orders them; a row with NaNs is sorted in full."""
    rng = np.random.default_rng(n + k)
    x = rng.standard_normal((7, n))
    x[0, 3] = x[0, 5] = x[0].max() + 1  # a tie at the top
    x[1] = np.round(x[1])  # many ties, at the k-th too
    ids, values = explorer._top_k(x, k)
    expected = np.argsort(-x, axis=-1, kind="stable")[:, :k]
    assert np.array_equal(ids, expected) and np.array_equal(values, np.take_along_axis(x, expected, -1))
    x[2, ::2] = np.nan
    assert np.array_equal(explorer._top_k(x, k)[0], np.argsort(-x, axis=-1, kind="stable")[:, :k])
