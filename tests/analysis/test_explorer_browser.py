"""The explorer page in a real headless Chromium (tests/browser.py), opened from file:// as a user
opens it: it loads with no console message and no network request, clicking a head enlarges it,
hovering a cell shows its tokens and value, the numbers on the page are the model's, the selection
links the views, the steering slider changes them, and the notebook object renders."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import refgpt
from browser import Browser, need_browser
from refgpt.analysis import explorer
from refgpt.analysis.attribution import naive_attribution
from refgpt.analysis.interventions import add_vector, last_token_difference, steering_vector
from refgpt.analysis.lens import TunedLens, logit_lens
from refgpt.analysis.measurements import norm, streams
from refgpt.analysis.plots import printable

pytestmark = pytest.mark.browser  # every test here drives the headless browser

TEXT = "My lord, I am glad to see you well."
COEFFS = [1.0, 10.0, 1e6]


@pytest.fixture(scope="module")
def browser():
    need_browser()
    b = Browser()
    yield b
    b.quit()


@pytest.fixture(scope="module")
def model():
    return refgpt.load_default()


@pytest.fixture(scope="module")
def page(model, tmp_path_factory, browser):
    built = explorer.explore(model, TEXT, target=" lord",  # the tuned view: the shipped lens (the default)
                             steering={"plus": "Love", "minus": "Hate", "layer": 2, "coeffs": COEFFS})
    path = built.save(tmp_path_factory.mktemp("explorer") / "page.html")
    console, requests = browser.open(path)
    return built, path, console, requests


def hover(browser, element, x, y):
    """Move the real mouse to (x, y) px from the element's top-left corner (inside its border)."""
    from selenium.webdriver.common.action_chains import ActionChains

    # WebDriver measures the offset from the centre of the element's part in view: bring all of it in view first
    browser.js("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", element)
    size = browser.js("const b = arguments[0].getBoundingClientRect(); return [b.width, b.height, "
                      "arguments[0].clientLeft, arguments[0].clientTop]", element)
    ActionChains(browser.driver).move_to_element_with_offset(
        element, x + size[2] - size[0] / 2, y + size[3] - size[1] / 2).perform()
    return browser.driver.find_element("id", "tooltip").text


def cell_centre(browser, canvas, row, col):
    left, w, h = (float(browser.js(f"return arguments[0].dataset.{k}", canvas)) for k in ("left", "cellW", "cellH"))
    return left + (col + 0.5) * w, (row + 0.5) * h


def find(browser, css):
    return browser.driver.find_element("css selector", css)


def test_the_page_loads_with_no_console_message_and_no_network_request(page):
    built, path, console, requests = page
    assert console == []
    assert requests == [path.resolve().as_uri()]  # the page itself, nothing else


def test_every_view_is_drawn(browser, page):
    built, *_ = page
    d = built.data
    assert len(browser.driver.find_elements("css selector", "canvas.head")) == len(d["layers"]) * len(d["heads"])
    assert len(browser.driver.find_elements("css selector", "#tokens .tok")) == len(d["tokens"])
    for canvas in ("lens-canvas", "ln-canvas", "attr-canvas", "steer-lens"):
        assert browser.js(f"return document.getElementById('{canvas}').width") > 100, canvas


def test_clicking_a_head_enlarges_it_and_hovering_shows_the_weight_and_tokens(browser, page, model):
    built, *_ = page
    find(browser, 'canvas.head[data-layer="2"][data-head="1"]').click()
    assert browser.js("return document.getElementById('modal').hidden") is False
    assert find(browser, "#modal-title").text.startswith("L2H1 ·")
    assert browser.js("return [refgptExplorer.state.layer, refgptExplorer.state.head]") == [2, 1]
    canvas = find(browser, "#modal-canvas")
    tokens = built.data["tokens"]
    q, k = len(tokens) - 2, 3
    text = hover(browser, canvas, *cell_centre(browser, canvas, q, k))
    _, cache = model.run_with_cache(TEXT)
    weight = cache["blocks.2.attn.hook_pattern"][0, 1, q, k]
    shown = float(text.rsplit(": ", 1)[1])
    assert text.startswith(f"L2H1 · query {q} {printable(tokens[q])} → key {k} {printable(tokens[k])}: ")
    assert abs(shown - weight) <= 0.5e-3 + 0.5e-3  # stored to 1e-3, shown to 3 decimals
    text = hover(browser, canvas, *cell_centre(browser, canvas, 1, 5))
    assert text.endswith("masked (0)")  # a key after its query
    from selenium.webdriver.common.keys import Keys
    find(browser, "body").send_keys(Keys.ESCAPE)
    assert browser.js("return document.getElementById('modal').hidden") is True


def test_hovering_a_lens_cell_shows_its_tokens_and_the_switches_redraw_it(browser, page):
    built, *_ = page
    d = built.data
    canvas = find(browser, "#lens-canvas")
    streams = d["lens"]["streams"]
    row, pos = 1, 4  # the second row from the top: the stream before the final one
    s = len(streams) - 1 - row
    text = hover(browser, canvas, *cell_centre(browser, canvas, row, pos))
    lens = d["lens"]["logit"]
    assert f"logit lens · stream {streams[s]} · position {pos} {printable(d['tokens'][pos])}" in text
    assert f"top {printable(lens['top_token'][s][pos])} p={lens['top_prob'][s][pos]:.4f}" in text
    assert f"rank {lens['target_rank'][s][pos]}" in text
    before = browser.js("return arguments[0].toDataURL()", canvas)
    find(browser, "#lens-kind-tuned").click()
    text = hover(browser, canvas, *cell_centre(browser, canvas, row, pos))
    tuned = d["lens"]["tuned"]
    assert text.startswith("tuned lens") and f"top {printable(tuned['top_token'][s][pos])}" in text
    from selenium.webdriver.support.ui import Select
    Select(find(browser, "#lens-metric")).select_by_value("kl")
    assert browser.js("return arguments[0].toDataURL()", canvas) != before
    find(browser, "#lens-kind-logit").click()
    Select(find(browser, "#lens-metric")).select_by_value("top_prob")
    assert browser.js("return arguments[0].toDataURL()", canvas) == before  # the same drawing again


def test_the_layernorm_view_shows_the_caches_statistics(browser, page, model):
    built, *_ = page
    _, cache = model.run_with_cache(TEXT)
    canvas = find(browser, "#ln-canvas")
    rows = 2 * model.cfg.n_layers + 1
    text = hover(browser, canvas, *cell_centre(browser, canvas, 0, 2))  # the top row is ln_final
    assert text.startswith(f"ln_final · position 2 {printable(built.data['tokens'][2])}: σ = ")
    assert float(text.rsplit("= ", 1)[1]) == pytest.approx(cache["ln_final.hook_scale"][0, 2, 0], rel=1e-4)
    from selenium.webdriver.support.ui import Select
    Select(find(browser, "#ln-view")).select_by_value("norm")
    text = hover(browser, canvas, *cell_centre(browser, canvas, 0, 2))
    assert text.startswith("final_post · position 2") and "‖resid‖" in text
    final = norm(cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][0, 2])
    assert float(text.rsplit("= ", 1)[1]) == pytest.approx(final, rel=1e-4)
    Select(find(browser, "#ln-view")).select_by_value("scale")
    assert rows == len(built.data["ln_scale"])


def test_the_attribution_on_the_page_sums_to_the_models_logit_and_follows_the_selection(browser, page, model):
    built, *_ = page
    logits = model(TEXT)[0]  # [pos, d_vocab]
    target = built.data["target"]["id"]
    summary = find(browser, "#attr-summary")
    last = len(built.data["tokens"]) - 1
    assert float(summary.get_attribute("data-logit")) == logits[last, target]
    assert summary.get_attribute("class") == "ok"  # Σ checked on the page
    assert abs(float(summary.get_attribute("data-sum")) - logits[last, target]) <= 1e-9
    find(browser, '#tokens .tok[data-pos="3"]').click()  # one selection for every view
    assert float(summary.get_attribute("data-logit")) == logits[3, target]
    assert summary.get_attribute("class") == "ok"
    assert browser.js("return refgptExplorer.state.pos") == 3
    assert "selected" in find(browser, '#tokens .tok[data-pos="3"]').get_attribute("class")
    find(browser, "#attr-by-head").click()
    top = [li.text.split()[0] for li in browser.driver.find_elements("css selector", "#attr-top li")]
    attribution = built.data["attribution"]
    column = np.array(attribution["values"])[:, 3]
    assert top[0] == attribution["labels"][int(np.argmax(np.abs(column)))]
    find(browser, "#attr-by-layer").click()


def test_the_steering_slider_changes_the_views(browser, page, model):
    built, *_ = page
    from selenium.webdriver.common.keys import Keys

    slider = find(browser, "#steer-slider")
    clean_next = find(browser, "#steer-clean").text
    first_norms = find(browser, "#steer-norms").get_attribute("innerHTML")
    assert find(browser, "#steer-coeff").text.startswith("C = 1 · C·‖Δ‖/‖stream‖ = ")
    slider.send_keys(Keys.END)  # as a user drags it to the end
    assert find(browser, "#steer-coeff").text.startswith("C = 1000000 · ")
    assert find(browser, "#steer-norms").get_attribute("innerHTML") != first_norms
    assert find(browser, "#steer-clean").text == clean_next  # the clean run does not move
    pos = browser.js("return refgptExplorer.state.pos")
    sv = steering_vector(model, "Love", "Hate", 2, 1e6)
    steered = model.run_with_hooks(model.to_tokens(TEXT), fwd_hooks=sv)[0, pos]
    first = find(browser, "#steer-next .bar-row .name").text
    assert first == printable(model.to_single_str_token(int(np.argmax(steered))))


def test_the_notebook_object_renders_in_its_iframe(browser, page, tmp_path):
    built, *_ = page
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!DOCTYPE html><html><body>{built._repr_html_()}</body></html>", encoding="utf-8")
    browser.driver.get_log("browser")
    browser.driver.get(notebook.resolve().as_uri())
    browser.driver.switch_to.frame(browser.driver.find_element("css selector", "iframe"))
    try:
        browser.wait_for("return document.body && document.body.dataset.ready === '1'")
        assert len(browser.driver.find_elements("css selector", "canvas.head")) == 16
        assert browser.js("return refgptExplorer.data.tokens.length") == len(built.data["tokens"])
    finally:
        browser.driver.switch_to.default_content()
    assert browser.console() == []


@pytest.mark.peer
def test_a_gpt2_small_shaped_page_at_256_tokens_works(browser, tmp_path):
    """GPT-2 small's 12 layers × 12 heads, its 50,257-token vocabulary and tokenizer, at 256 tokens:
    the page holds what the real model's would (144 patterns of 256 queries, 13 lens rows over the
    full vocabulary); d_model is narrowed to 96 so the test builds it in seconds. Its size and load
    time at the real width are measured by benchmarks/bench_explorer.py, not here."""
    from random_models import random_model
    from refgpt import Config, Tokenizer
    from tl_port import TOKENIZER_DIR

    if not (TOKENIZER_DIR / "vocab.json").exists():
        pytest.skip(f"needs GPT-2's tokenizer files in {TOKENIZER_DIR} (set REFGPT_GPT2_TOKENIZER)")
    cfg = Config(d_model=96, n_layers=12, n_heads=12, d_mlp=384, d_vocab=50257, n_ctx=1024)
    model = random_model(cfg, seed=4, scale=0.3)
    model.tokenizer = Tokenizer.from_dir(TOKENIZER_DIR)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.d_vocab, 256)
    built = explorer.explore(model, tokens, steering=None)
    path = built.save(tmp_path / "gpt2_small.html")
    console, requests = browser.open(path)
    assert console == [] and requests == [path.resolve().as_uri()]
    assert len(browser.driver.find_elements("css selector", "canvas.head")) == 144
    find(browser, 'canvas.head[data-layer="11"][data-head="11"]').click()
    assert find(browser, "#modal-title").text.startswith("L11H11 · 256 queries × 256 keys")
    canvas = find(browser, "#modal-canvas")
    text = hover(browser, canvas, *cell_centre(browser, canvas, 200, 17))
    stored = explorer.decode_pattern(built.data["pattern"][11][11], 256)[200][17] * built.data["pattern_unit"]
    assert text.startswith("L11H11 · query 200") and float(text.rsplit(": ", 1)[1]) == pytest.approx(stored, abs=5e-4)
    from selenium.webdriver.common.keys import Keys
    find(browser, "body").send_keys(Keys.ESCAPE)
    lens = find(browser, "#lens-canvas")
    text = hover(browser, lens, *cell_centre(browser, lens, 0, 255))
    top = built.data["lens"]["logit"]["top_token"][-1][255]
    assert text.startswith("logit lens · stream final_post · position 255") and f"top {printable(top)}" in text
    assert find(browser, "#attr-summary").get_attribute("class") == "ok"


def reopened(browser, page):
    """The page fixture's page, opened again (an earlier test may have opened another)."""
    built, path, *_ = page
    assert browser.open(path)[0] == []
    return built



def test_the_naive_twin_shows_both_sums_and_the_sigma_it_used(browser, page, model):
    """Question (1) on the page: at the selected position, each piece by its own σ(c) and by the
    cached σ, with both sums (the page's, summed left to right) equal to naive_attribution's up to
    the two summation orders' rounding, 2·(n − 1)·u·Σ|vᵢ|; the σ named is ln_final's cached one,
    and clicking it shows it in the LayerNorm view."""
    built = reopened(browser, page)
    logits, cache = model.run_with_cache(TEXT)
    target = built.data["target"]["id"]
    find(browser, '#tokens .tok[data-pos="4"]').click()
    assert browser.js("return refgptExplorer.state.pos") == 4
    summary = find(browser, "#naive-summary")
    expected = naive_attribution(cache, target, pos=4, logits=logits)
    u = np.finfo(np.float64).eps / 2
    for kind, values in (("naive", expected.naive), ("exact", expected.exact)):
        allowance = 2 * (len(values) - 1) * u * np.abs(values).sum()
        assert abs(float(summary.get_attribute(f"data-{kind}")) - values.sum()) <= allowance, kind
    assert float(summary.get_attribute("data-sigma")) == cache["ln_final.hook_scale"][0, 4, 0] == expected.scale
    assert summary.text.startswith(f"ln_final σ at position 4 = {expected.scale:.4g}")
    assert abs(expected.naive_sum - expected.logit) > 1.0  # the naive pieces miss the logit …
    assert abs(expected.exact_sum - expected.logit) <= 1e-12 * max(1.0, abs(expected.logit))  # … the cached σ's do not
    bars = browser.driver.find_elements("css selector", "#attr-naive rect")
    assert len(bars) == 2 * (len(expected.labels) + 1)  # naive and exact per piece, and the two sums
    from selenium.webdriver.support.ui import Select
    Select(find(browser, "#ln-view")).select_by_value("mean")
    find(browser, "#naive-sigma").click()
    assert browser.js("return refgptExplorer.state.lnView") == "scale"


def test_tokens_are_visible_as_plots_printable_writes_them(browser, page, model, tmp_path):
    """␣ for a space, ⏎ for a newline, byte escapes: the page's rule is plots.printable's, and the
    token chips and the lens cells use it (the embedded model's favourite prediction is "\\n")."""
    reopened(browser, page)
    tricky = [" the", "\n", "\t", "a\x00b", "\x7f", "\ufffd", "é", "\u200b", "<|endoftext|>", "  x"]
    assert browser.js("return arguments[0].map(refgptExplorer.visible)", tricky) == [printable(t, 10**6) for t in tricky]
    built = explorer.explore(model, "My lord,\nI am here.\n\nThou art")
    path = built.save(tmp_path / "newlines.html")
    assert browser.open(path)[0] == []
    chips = [chip.text for chip in browser.driver.find_elements("css selector", "#tokens .tok")]
    assert chips == [printable(t, 10**6) for t in built.data["tokens"]] and "⏎" in "".join(chips)
    assert "\n" in built.data["tokens"] or any("\n" in t for t in built.data["tokens"])


def test_the_steering_view_draws_every_stream_on_one_axis_for_every_coefficient(browser, page, model):
    """Every stream of the steered run against position, the y-range the same at C = 1 and 10⁶ (the
    extremes over every run), the steered positions shaded (not ActAdd's all-zero first row), and
    the numbers those of the model's runs."""
    built = reopened(browser, page)
    st = built.data["steering"]
    slider = find(browser, "#steer-slider")
    from selenium.webdriver.common.keys import Keys

    slider.send_keys(Keys.HOME)
    svg = find(browser, "#steer-norms-svg")
    first = (svg.get_attribute("data-lo"), svg.get_attribute("data-hi"))
    streams_drawn = browser.driver.find_elements("css selector", "#steer-norms-svg polyline[data-stream]")
    assert [line.get_attribute("data-stream") for line in streams_drawn] == built.data["resid_norm"]["streams"]
    assert st["positions"] == [1, 2] and len(browser.driver.find_elements("css selector", "#steer-norms-svg rect.steered")) == 2
    slider.send_keys(Keys.END)
    svg = find(browser, "#steer-norms-svg")
    assert (svg.get_attribute("data-lo"), svg.get_attribute("data-hi")) == first  # one axis for every coefficient
    every = np.array([st["clean"]["resid_norm"]] + [r["resid_norm"] for r in st["runs"]])
    assert float(first[0]) == every.min() and float(first[1]) == every.max()
    tokens = model.to_tokens(TEXT)
    for run, c in zip(st["runs"], COEFFS, strict=True):
        _, cache = model.run_with_cache(tokens, fwd_hooks=steering_vector(model, "Love", "Hate", 2, c))
        assert run["resid_norm"][-1] == norm(streams(cache)[-1, 0]).tolist()


def test_the_steered_lens_follows_the_lens_switch_and_is_the_tuned_lens_under_steering(browser, page, model):
    """With "tuned" selected the steering view's lens is the shipped TunedLens run under the
    steering vector, and it names itself; with "logit" the logit lens."""
    built = reopened(browser, page)
    st = built.data["steering"]
    lens = TunedLens.load(model)
    tokens = model.to_tokens(TEXT)
    for run, c in zip(st["runs"], COEFFS, strict=True):
        with steering_vector(model, "Love", "Hate", 2, c):
            ids, probs = lens.run(tokens).top(1)  # [stream, batch, pos, 1]
        assert run["tuned_top_token"] == [model.to_str_tokens(row, prepend_bos=False) for row in ids[:, 0, :, 0]]
        np.testing.assert_allclose(run["tuned_top_prob"], probs[:, 0, :, 0], rtol=1e-12)
    find(browser, "#lens-kind-tuned").click()
    assert find(browser, "#steer-lens").get_attribute("data-kind") == "tuned lens"
    assert find(browser, "#steer-lens-title").text.startswith("tuned lens of the steered run")
    find(browser, "#lens-kind-logit").click()
    assert find(browser, "#steer-lens").get_attribute("data-kind") == "logit lens"


def test_a_page_steered_at_position_20_is_add_vector_there(browser, model, tmp_path):
    """explore --positions 20 as steer --positions 20: the prompts' last-token difference added at
    position 20 only; norms per stream and position at C = 1 and 10⁶ are the model's, on one axis."""
    text = "My lord, I have a letter from the king, and he doth bid me tell you that he will come to you anon"
    built = explorer.explore(model, text, prepend_bos=True, steering={"plus": "Love", "minus": "Hate", "layer": 1,
                                                                       "coeffs": [1.0, 1e6], "positions": [20]})
    st = built.data["steering"]
    assert st["positions"] == [20] and st["at_first_positions"] is False
    tokens = model.to_tokens(text)
    difference, _, _ = last_token_difference(model, "Love", "Hate", 1)
    for run, c in zip(st["runs"], [1.0, 1e6], strict=True):
        _, cache = model.run_with_cache(tokens, fwd_hooks=add_vector(model, tokens, difference, 1, [20], coeff=c))
        assert run["resid_norm"][-1] == norm(streams(cache)[-1, 0]).tolist()
        assert all(k == 0.0 for k in run["kl"][:20])
    # the KL map: KL(logit lens at C ‖ logit lens at the largest C), zero for the largest itself
    assert np.all(np.array(st["runs"][-1]["logit_kl_to_largest"]) == 0.0)
    lenses = []
    for c in (1.0, 1e6):
        _, cache = model.run_with_cache(tokens, fwd_hooks=add_vector(model, tokens, difference, 1, [20], coeff=c))
        lenses.append(logit_lens(cache).log_probs()[:, 0])  # [stream, pos, d_vocab]
    expected = (np.exp(lenses[0]) * (lenses[0] - lenses[1])).sum(-1)  # [stream, pos]
    # the page reads 32 positions at a time, this [pos] at once: a BLAS may round a row's product
    # differently in the two shapes (measured: equal here, OpenBLAS SkylakeX); the allowance is a few
    # ulps of logits of size ~10 carried into a KL whose nonzero entries are ≥ 0.2 (measured)
    np.testing.assert_allclose(st["runs"][0]["logit_kl_to_largest"], np.maximum(expected, 0.0), rtol=1e-9, atol=1e-13)
    assert np.all(np.array(st["runs"][0]["logit_kl_to_largest"])[:, :20] == 0.0)  # nothing before position 20 moves
    path = built.save(tmp_path / "p20.html")
    assert browser.open(path)[0] == []
    assert browser.js("return document.getElementById('steer-kl-map').width") > 100  # the KL map is drawn
    assert len(browser.driver.find_elements("css selector", "#steer-norms-svg rect.steered")) == 1
    assert "position 20 (shaded)" in find(browser, "#steer-body .legend").text
    assert "/" not in built.data["model"]["source"] and built.data["model"]["source"] == "embedded"


def test_the_selection_lives_in_the_url_fragment(browser, page):
    """A selection writes the fragment; a page opened with it shows that view (a bad value is ignored)."""
    built = reopened(browser, page)
    find(browser, '#tokens .tok[data-pos="5"]').click()
    fragment = browser.js("return location.hash")
    assert "pos=5" in fragment
    _, path, *_ = page
    browser.driver.get(path.resolve().as_uri() + "#pos=3&layer=1&head=2&lensKind=tuned&lnView=norm&steer=99")
    browser.wait_for("return document.body && document.body.dataset.ready === '1'")
    state = browser.js("return refgptExplorer.state")
    assert [state["pos"], state["layer"], state["head"], state["lensKind"], state["lnView"], state["steer"]] == \
        [3, 1, 2, "tuned", "norm", 0]  # steer=99 is no run of this page: ignored
    assert browser.js("return document.getElementById('lens-kind-tuned').checked") is True
    assert browser.console() == []
    assert len(built.data["tokens"]) > 5


def test_the_heat_maps_have_colour_bars_with_their_ranges(browser, page):
    built = reopened(browser, page)
    assert find(browser, "#lens-canvas-bar").get_attribute("data-lo") == "0"
    assert find(browser, "#lens-canvas-bar").get_attribute("data-hi") == "1"
    bar = find(browser, "#ln-canvas-bar")
    sigmas = [v for row in built.data["ln_scale"].values() for v in row]
    assert float(bar.get_attribute("data-lo")) == min(sigmas) and float(bar.get_attribute("data-hi")) == max(sigmas)


def test_the_token_strip_is_painted_with_a_head_s_attention_or_each_token_s_log_prob(browser, page, model):
    """The selected head's attention from the selected position paints the tokens (a hovered head
    previews its own); the other paint is log p(token | the tokens before), the model's."""
    built = reopened(browser, page)
    browser.js("refgptExplorer.select({layer: 2, head: 1, pos: 5})")
    chips = browser.driver.find_elements("css selector", "#tokens .tok")
    logits, cache = model.run_with_cache(TEXT)
    pattern = cache["blocks.2.attn.hook_pattern"][0, 1, 5]  # [key]
    values = [chip.get_attribute("data-value") for chip in chips]
    assert all(v == "" for v in values[6:])  # keys after the query: masked
    assert np.all(np.abs(np.array(values[:6], dtype=float) - pattern[:6]) <= 0.5e-3 + 1e-15)  # stored in thousandths
    assert find(browser, "#paint-legend").text.startswith("L2H1's attention from position 5")
    from selenium.webdriver.common.action_chains import ActionChains
    ActionChains(browser.driver).move_to_element(find(browser, 'canvas.head[data-layer="0"][data-head="3"]')).perform()
    assert find(browser, "#paint-legend").text.startswith("L0H3's attention from position 5")
    ActionChains(browser.driver).move_to_element(find(browser, "#selection")).perform()
    assert find(browser, "#paint-legend").text.startswith("L2H1's attention")
    from selenium.webdriver.support.ui import Select
    Select(find(browser, "#paint")).select_by_value("logprob")
    tokens = model.to_tokens(TEXT)[0]
    log_p = logits[0] - np.log(np.exp(logits[0] - logits[0].max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits[0].max(-1, keepdims=True)
    expected = log_p[np.arange(len(tokens) - 1), tokens[1:]]
    shown = [chip.get_attribute("data-value") for chip in chips]
    assert shown[0] == "" and np.allclose(np.array(shown[1:], dtype=float), expected, rtol=1e-12, atol=0)
    assert built.data["next_logprob"][1:] == pytest.approx(expected.tolist(), rel=1e-12)
    Select(find(browser, "#paint")).select_by_value("attention")


@pytest.fixture(scope="module")
def sae_page(model, tmp_path_factory, browser):
    from refgpt.files.default_model import default_sae_path
    from refgpt.sae import explore as sae_explore, load_sae

    built = sae_explore(model, TEXT, load_sae(default_sae_path()), target=" lord", lens=False)
    path = built.save(tmp_path_factory.mktemp("explorer-sae") / "page.html")
    console, requests = browser.open(path)
    return built, path, console, requests


@pytest.mark.slow
def test_the_sae_view_draws_the_waterfall_by_feature_and_a_features_logits_and_activations(browser, sae_page, model,
                                                                                           tmp_path):
    """The waterfall's bars are the page's rows, features and b_dec / sae_error, summed on the page to the
    model's logit (✓); clicking a feature shows its activation over the tokens as the page shows them
    and its top ± logits, as the page's document holds them (test_explorer.py checks those against
    attribute_features and feature_logits)."""
    built, path, console, requests = sae_page
    assert console == [] and requests == [path.resolve().as_uri()]
    d, logits = built.data["sae"], model(TEXT)[0]  # [pos, d_vocab]
    target = built.data["target"]["id"]
    for pos in (len(built.data["tokens"]) - 1, 4):
        find(browser, f'#tokens .tok[data-pos="{pos}"]').click()
        summary = find(browser, "#sae-summary")
        assert summary.get_attribute("class") == "ok"
        assert float(summary.get_attribute("data-logit")) == logits[pos, target]
        assert abs(float(summary.get_attribute("data-sum")) - logits[pos, target]) <= 1e-12 * abs(logits[pos, target])
        here = d["positions"][pos]
        bars = json.loads(find(browser, "#sae-canvas").get_attribute("data-labels"))
        assert [b for b in bars if b.startswith("F")] == [f"F{i}" for i in here["features"]]
        assert bars[-3:] == ["b_dec", "sae_error", "logit"]
        assert "L3.mlp" in bars and "L1.attn" not in bars  # the hook, blocks.2.hook_resid_pre, covers layers 0 and 1
        lines = browser.driver.find_elements("css selector", "#sae-list li")
        assert [int(li.get_attribute("data-feature")) for li in lines] == here["features"]
        for li, i in zip(lines, here["features"], strict=True):  # the activation there, from the feature's own list
            assert li.text.split()[2] == f'{dict(map(tuple, d["features"][str(i)]["activation"]))[pos]:.3f}'
    feature = here["features"][1]
    lines[1].click()
    assert browser.js("return refgptExplorer.state.feature") == feature
    chosen = browser.driver.find_elements("css selector", "#sae-list li.chosen")
    assert [int(li.get_attribute("data-feature")) for li in chosen] == [feature]
    info = d["features"][str(feature)]
    strip = browser.driver.find_elements("css selector", "#sae-strip .tok")
    assert [s.text for s in strip] == [printable(t, 10**6) for t in built.data["tokens"]]  # as the token strip writes them
    activation = dict(map(tuple, info["activation"]))
    assert [float(s.get_attribute("data-value")) for s in strip] == [activation.get(q, 0.0)
                                                                     for q in range(len(strip))]
    for side in ("top", "bottom"):
        rows = browser.driver.find_elements("css selector", f"#sae-{side} .bar-row")
        assert [int(r.get_attribute("data-id")) for r in rows] == info[side]["ids"]
        assert [float(r.get_attribute("data-value")) for r in rows] == info[side]["values"]
        assert [r.find_element("css selector", ".name").text for r in rows] == \
            [printable(d["token_strings"][str(t)]) for t in info[side]["ids"]]
    assert f"F{feature}" in find(browser, "#sae-feature-title").text
    assert "feature=" + str(feature) in browser.js("return location.hash")
    find(browser, "#sae").screenshot(str(tmp_path / "sae.png"))  # the view renders (docs/figures/explorer_sae.png)
    assert (tmp_path / "sae.png").stat().st_size > 10_000


def test_a_page_without_an_sae_says_how_to_get_one(browser, page):
    browser.open(page[1])
    assert "--sae" in find(browser, "#sae-body").text


def test_the_steering_view_shows_that_only_the_normalised_x_moves(browser, page, model):
    """ln1's output at a steered position and the steered run's attention, as the page shows them,
    are the model's under the steering vector. As C grows the stream entering block 2 keeps
    changing (‖x(C) − x(C')‖/‖x(C')‖ ≥ (1 − C/C')/(1 + ‖s‖/(C'‖d‖)), s the unsteered stream, d the
    vector's row, C' the largest coefficient) while ln1's output settles: with x = s + C·d centred,
    ‖unit(x_c) − unit(d_c)‖ ≤ 2‖s_c‖/(C‖d_c‖), and ε moves the scale by at most n·ε/(2‖x_c‖²), so
    ‖ln1(C) − ln1(C')‖ ≤ max|γ|·√n·[2‖s_c‖/‖d_c‖·(1/C + 1/C') + n·ε/(2‖x_c‖²) + n·ε/(2‖x'_c‖²)]."""
    built = reopened(browser, page)
    st = built.data["steering"]
    tokens = model.to_tokens(TEXT)
    from selenium.webdriver.common.keys import Keys

    _, clean = model.run_with_cache(tokens)
    caches = [model.run_with_cache(tokens, fwd_hooks=steering_vector(model, "Love", "Hate", 2, c))[1] for c in COEFFS]
    w, b, eps = model.params["blocks.2.ln1.w"], model.params["blocks.2.ln1.b"], model.cfg.eps
    n = model.cfg.d_model
    q = st["positions"][0]
    browser.js(f"refgptExplorer.select({{pos: {q}, layer: 3, head: 1}})")
    slider = find(browser, "#steer-slider")
    slider.send_keys(Keys.HOME)
    centred = lambda v: v - v.mean()  # noqa: E731
    s_c = centred(clean["blocks.2.hook_resid_pre"][0, q])
    x_largest = caches[-1]["blocks.2.hook_resid_pre"][0, q]
    ln1_largest = caches[-1]["blocks.2.ln1.hook_normalized"][0, q] * w + b
    for i, (c, cache) in enumerate(zip(COEFFS, caches, strict=True)):
        summary = find(browser, "#steer-ln1-summary")
        assert int(summary.get_attribute("data-pos")) == q
        x = cache["blocks.2.hook_resid_pre"][0, q]
        ln1 = cache["blocks.2.ln1.hook_normalized"][0, q] * w + b
        resid_change, ln1_change = norm(x - x_largest) / norm(x_largest), norm(ln1 - ln1_largest) / norm(ln1_largest)
        assert float(summary.get_attribute("data-resid")) == resid_change
        assert float(summary.get_attribute("data-ln1")) == ln1_change
        assert f"C = {c:g}".replace("1e+06", "1000000") in summary.text
        d_c = centred(x - clean["blocks.2.hook_resid_pre"][0, q]) / c  # the vector's row, centred
        if c != COEFFS[-1]:
            largest = COEFFS[-1]
            lower = (1 - c / largest) / (1 + norm(s_c) / (largest * norm(d_c)))
            assert resid_change >= lower > 0.9  # the stream moves …
            upper = np.abs(w).max() * np.sqrt(n) * (2 * norm(s_c) / norm(d_c) * (1 / c + 1 / largest)
                                                    + n * eps / (2 * norm(centred(x)) ** 2)
                                                    + n * eps / (2 * norm(centred(x_largest)) ** 2))
            assert norm(ln1 - ln1_largest) <= upper  # … what attention reads settles
        assert len(browser.driver.find_elements("css selector", "#steer-ln1-svg polyline")) == 3
        canvas = find(browser, "#steer-attn")
        text = hover(browser, canvas, *cell_centre(browser, canvas, 7, 1))
        steered, unsteered = cache["blocks.3.attn.hook_pattern"][0, 1, 7, 1], clean["blocks.3.attn.hook_pattern"][0, 1, 7, 1]
        shown = re.search(r"C = [^:]+: ([\d.]+) · no vector: ([\d.]+)", text)
        assert text.startswith("L3H1 · query 7") and shown, text
        assert abs(float(shown[1]) - steered) <= 1e-3 and abs(float(shown[2]) - unsteered) <= 1e-3  # thousandths, 3 decimals
        tv = find(browser, "#steer-attn-tv")
        text = hover(browser, tv, *cell_centre(browser, tv, 1, 1))  # row L3, column H1
        A, A_max = cache["blocks.3.attn.hook_pattern"][0, 1], caches[-1]["blocks.3.attn.hook_pattern"][0, 1]
        assert text.startswith("L3H1, C = ") and float(text.rsplit("= ", 1)[1]) == pytest.approx(
            0.5 * np.abs(A - A_max).sum(-1).max(), rel=1e-3, abs=1e-15)  # shown to 4 significant digits
        slider.send_keys(Keys.RIGHT)
    assert st["runs"][1]["ln1_change"][0] < 0.2 < 0.99 < st["runs"][1]["resid_change"][0]  # measured: 0.115 and 0.99999
    browser.js("refgptExplorer.select({layer: 1})")
    assert "before the vector" in find(browser, "#steer-attn-head").text


def test_the_lens_hover_lists_the_top_ten_tokens_visibly(browser, page):
    built = reopened(browser, page)
    d = built.data
    canvas = find(browser, "#lens-canvas")
    s = len(d["lens"]["streams"]) - 1
    text = hover(browser, canvas, *cell_centre(browser, canvas, 0, 10))  # the final stream, position 10
    lens = d["lens"]["logit"]
    lines = text.split("top 10:")[1].strip().split("\n")
    assert [line.split()[1] for line in lines] == [printable(t, 10**6) for t in lens["top10_token"][s][10]]
    assert [float(line.split()[2]) for line in lines] == pytest.approx(lens["top10_prob"][s][10], rel=5e-4)
    assert "⏎" in text  # the embedded model's favourite prediction, visible


def test_the_actual_next_token_target_and_a_clicked_bars_pushes(browser, page, model):
    """The "actual next token" target sums to the logit of the token that follows (✓ on the page);
    clicking a bar lists the tokens that part pushes up and down, as the document holds them
    (test_explorer.py checks those against attribute), written visibly."""
    built = reopened(browser, page)
    a = built.data["attribution"]
    logits = model(TEXT)[0]  # [pos, d_vocab]
    tokens = model.to_tokens(TEXT)[0]
    find(browser, "#attr-target-actual").click()
    browser.js("refgptExplorer.select({pos: 5})")
    summary = find(browser, "#attr-summary")
    assert summary.get_attribute("class") == "ok"
    assert float(summary.get_attribute("data-logit")) == logits[5, tokens[6]]
    assert summary.get_attribute("data-token") == built.data["tokens"][6]
    browser.js(f"refgptExplorer.select({{pos: {len(tokens) - 1}}})")
    assert "no next token" in summary.text
    browser.js("refgptExplorer.select({pos: 5})")
    canvas = find(browser, "#attr-canvas")
    labels = json.loads(canvas.get_attribute("data-labels"))
    pad, bar = (float(browser.js(f"return arguments[0].dataset.{k}", canvas)) for k in ("padL", "barW"))
    i = labels.index("L3.mlp")
    hover(browser, canvas, pad + (i + 0.5) * bar, 100)
    from selenium.webdriver.common.action_chains import ActionChains
    ActionChains(browser.driver).click().perform()
    assert browser.js("return refgptExplorer.state.part") == "L3.mlp"
    pushes, k = a["pushes"], a["pushes"]["labels"].index("L3.mlp")
    for side in ("up", "down"):
        rows = browser.driver.find_elements("css selector", f"#attr-push-{side} .bar-row")
        assert [int(r.get_attribute("data-id")) for r in rows] == pushes[f"{side}_ids"][k][5]
        assert [float(r.get_attribute("data-value")) for r in rows] == pushes[side][k][5]
        assert [r.find_element("css selector", ".name").text for r in rows] == \
            [printable(pushes["token_strings"][str(t)], 10**6) for t in pushes[f"{side}_ids"][k][5]]
    assert find(browser, "#attr-push-title").text.startswith('L3.mlp at position 5 ␣am, read through ln_final')
    assert "part=L3.mlp" in browser.js("return location.hash")
    find(browser, "#attr-target-page").click()


def test_axis_labels_are_thinned_by_collision_and_kept_when_they_fit(browser, page, model, tmp_path):
    """Rotated 45°, labels one line (11 px) high overprint when their anchors are closer than
    11 / sin 45° ≈ 15.6 px: on a long page the drawn ones are at least that far apart; on a short
    page every column keeps its label, and every row."""
    built = reopened(browser, page)
    gap = 11 / np.sin(np.pi / 4)
    for canvas_id in ("lens-canvas", "ln-canvas"):
        canvas = find(browser, f"#{canvas_id}")
        assert json.loads(canvas.get_attribute("data-col-labels")) == list(range(len(built.data["tokens"])))
    long = explorer.explore(model, " ".join([TEXT] * 9), lens=False)
    path = long.save(tmp_path / "long.html")
    assert browser.open(path)[0] == []
    n = len(long.data["tokens"])
    for canvas_id in ("lens-canvas", "ln-canvas"):
        canvas = find(browser, f"#{canvas_id}")
        drawn = json.loads(canvas.get_attribute("data-col-labels"))
        cell = float(browser.js("return arguments[0].dataset.cellW", canvas))
        assert drawn[0] == 0 and 1 < len(drawn) < n, (canvas_id, n, cell)
        assert min(np.diff(drawn)) * cell >= gap - 1e-9 and max(np.diff(drawn)) * cell < gap + cell
        rows = json.loads(canvas.get_attribute("data-row-labels"))
        height = float(browser.js("return arguments[0].dataset.cellH", canvas))
        assert min(np.diff(rows)) * height >= 11 - 1e-9
