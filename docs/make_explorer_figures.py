"""Screenshots of every view of the explorer page for docs/explorer.md and docs/primer.md.

    python docs/make_explorer_figures.py          # needs chromium, chromium-driver and selenium
    python docs/make_explorer_figures.py sae      # only the SAE view (explorer_sae.png)

The page is the one ``refgpt explore`` writes for the embedded model, with its shipped tuned lens and an
ActAdd steering vector and the SAE shipped for it; it is opened from file:// in headless Chromium (tests/browser.py) and each
section is photographed after the clicks and hovers a reader would make.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import refgpt  # noqa: E402
import refgpt.sae  # noqa: E402
from browser import Browser  # noqa: E402
from refgpt.files.default_model import default_sae_path  # noqa: E402
from refgpt.sae import load_sae  # noqa: E402

FIGURES = REPO / "docs" / "figures"
TEXT = "I hate you because you never listen to me, my lord."
STEERING = {"plus": "Love", "minus": "Hate", "layer": 2, "coeffs": [1.0, 5.0, 50.0, 1e6]}


def shoot(browser, css, name):
    element = browser.driver.find_element("css selector", css)
    browser.js("arguments[0].scrollIntoView()", element)
    time.sleep(0.2)
    element.screenshot(str(FIGURES / name))
    print("wrote", FIGURES / name)


def hover(browser, css, row, col):
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = browser.driver.find_element("css selector", css)
    left, w, h = (float(browser.js(f"return arguments[0].dataset.{k}", canvas)) for k in ("left", "cellW", "cellH"))
    box = browser.js("const b = arguments[0].getBoundingClientRect(); return [b.width, b.height]", canvas)
    ActionChains(browser.driver).move_to_element_with_offset(
        canvas, left + (col + 0.5) * w - box[0] / 2, (row + 0.5) * h - box[1] / 2).perform()


def main(only=None):
    model = refgpt.load_default()
    page = refgpt.sae.explore(model, TEXT, load_sae(default_sae_path()),  # with the shipped tuned lens
                              target=" lord", steering=STEERING, prepend_bos=True)
    FIGURES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = page.save(Path(tmp) / "page.html")
        browser = Browser(width=1200, height=1400)
        try:
            console, _ = browser.open(path)
            assert console == [], console
            if only == "sae":
                return shoot_sae(browser)
            shoot(browser, "header", "explorer_header.png")
            browser.driver.find_element("css selector", '#tokens .tok[data-pos="6"]').click()
            shoot(browser, "#attention", "explorer_attention.png")
            browser.driver.find_element("css selector", 'canvas.head[data-layer="1"][data-head="2"]').click()
            hover(browser, "#modal-canvas", 9, 4)
            shoot(browser, "#modal-box", "explorer_attention_head.png")
            browser.js("document.getElementById('modal-close').click()")
            browser.driver.find_element("id", "lens-kind-tuned").click()
            hover(browser, "#lens-canvas", 2, 6)
            shoot(browser, "#lens", "explorer_lens.png")
            shoot(browser, "#layernorm", "explorer_layernorm.png")
            browser.driver.find_element("id", "attr-by-head").click()
            browser.js("refgptExplorer.select({part: 'L3.mlp'})")  # as a click on its bar: the tokens it pushes
            shoot(browser, "#attribution", "explorer_attribution.png")
            browser.driver.find_element("css selector", '#tokens .tok[data-pos="2"]').click()  # a steered position
            browser.js("const s = document.getElementById('steer-slider'); s.value = 2; s.dispatchEvent(new Event('input'))")
            browser.js("document.getElementById('steer-reads').hidden = true")
            shoot(browser, "#steering", "explorer_steering.png")  # C = 50: every stream, the tuned lens, the KL to C = 10⁶
            browser.js("document.getElementById('steer-reads').hidden = false; refgptExplorer.select({layer: 3, head: 1})")
            shoot(browser, "#steer-reads", "explorer_steering_reads.png")  # what attention reads: ln1 out, the patterns
            shoot_sae(browser)
        finally:
            browser.quit()


def shoot_sae(browser):
    """The SAE view at the last position, by head; of the position's three largest features the one
    active at the most positions, chosen by clicking its line."""
    browser.driver.find_element("id", "attr-by-head").click()
    last = browser.js("return refgptExplorer.data.tokens.length") - 1
    browser.driver.find_element("css selector", f'#tokens .tok[data-pos="{last}"]').click()
    busiest = browser.js("const F = refgptExplorer.data.sae, here = F.positions[arguments[0]].features.slice(0, 3); "
                         "return here.reduce((a, f) => F.features[f].activation.length > F.features[a].activation.length "
                         "? f : a)", last)
    browser.driver.find_element("css selector", f'#sae-list li[data-feature="{busiest}"]').click()
    shoot(browser, "#sae", "explorer_sae.png")


if __name__ == "__main__":
    main(*sys.argv[1:2])
