"""The explorer page in a real headless Chromium (tests/browser.py), opened from file:// as a user
opens it: it loads with no console message and no network request, clicking a head enlarges it,
hovering a cell shows its tokens and value, the numbers on the page are the model's, the selection
links the views, the steering slider changes them, and the notebook object renders."""

from __future__ import annotations

import json

import numpy as np
import pytest

import refgpt
from browser import Browser, need_browser
from refgpt.analysis import explorer
from refgpt.analysis.interventions import steering_vector
from refgpt.analysis.measurements import norm

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
    assert text.startswith(f"L2H1 · query {q} {json.dumps(tokens[q])} → key {k} {json.dumps(tokens[k])}: ")
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
    assert f"logit lens · stream {streams[s]} · position {pos} {json.dumps(d['tokens'][pos])}" in text
    assert f"top {json.dumps(lens['top_token'][s][pos])} p={lens['top_prob'][s][pos]:.4f}" in text
    assert f"rank {lens['target_rank'][s][pos]}" in text
    before = browser.js("return arguments[0].toDataURL()", canvas)
    find(browser, "#lens-kind-tuned").click()
    text = hover(browser, canvas, *cell_centre(browser, canvas, row, pos))
    tuned = d["lens"]["tuned"]
    assert text.startswith("tuned lens") and f"top {json.dumps(tuned['top_token'][s][pos])}" in text
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
    assert text.startswith(f"ln_final · position 2 {json.dumps(built.data['tokens'][2])}: σ = ")
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
    assert find(browser, "#steer-coeff").text == "C = 1"
    slider.send_keys(Keys.END)  # as a user drags it to the end
    assert find(browser, "#steer-coeff").text == "C = 1000000"
    assert find(browser, "#steer-norms").get_attribute("innerHTML") != first_norms
    assert find(browser, "#steer-clean").text == clean_next  # the clean run does not move
    pos = browser.js("return refgptExplorer.state.pos")
    sv = steering_vector(model, "Love", "Hate", 2, 1e6)
    steered = model.run_with_hooks(model.to_tokens(TEXT), fwd_hooks=sv)[0, pos]
    first = find(browser, "#steer-next .bar-row .name").text
    assert first == json.dumps(model.to_single_str_token(int(np.argmax(steered))))


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
    stored = built.data["pattern"][11][11][200][17] * built.data["pattern_unit"]
    assert text.startswith("L11H11 · query 200") and float(text.rsplit(": ", 1)[1]) == pytest.approx(stored, abs=5e-4)
    from selenium.webdriver.common.keys import Keys
    find(browser, "body").send_keys(Keys.ESCAPE)
    lens = find(browser, "#lens-canvas")
    text = hover(browser, lens, *cell_centre(browser, lens, 0, 255))
    top = built.data["lens"]["logit"]["top_token"][-1][255]
    assert text.startswith("logit lens · stream final_post · position 255") and f"top {json.dumps(top)}" in text
    assert find(browser, "#attr-summary").get_attribute("class") == "ok"
