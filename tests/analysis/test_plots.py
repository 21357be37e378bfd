"""Figures are written as PNG files with what they claim to show; refgpt never imports matplotlib
unless a figure is asked for, and without it says how to install it."""

from __future__ import annotations

import subprocess
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from random_models import random_model
from refgpt import Config, RefGPTError
from refgpt.analysis.interventions import add_vector
from refgpt.analysis.lens import logit_lens
from refgpt.analysis.plots import printable

CFG = Config(d_model=12, n_layers=3, n_heads=3, d_mlp=20, d_vocab=23, n_ctx=10)
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6]])
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plots():
    pytest.importorskip("matplotlib", reason="figures need the optional 'plot' extra (matplotlib)")
    from refgpt.analysis import plots

    return plots


@pytest.fixture(scope="module")
def runs():
    model = random_model(CFG, seed=2)
    d = np.random.default_rng(0).standard_normal(CFG.d_model)
    _, clean = model.run_with_cache(TOKENS)
    _, steered = model.run_with_cache(TOKENS, fwd_hooks=add_vector(model, TOKENS, d, 1, [3], coeff=1e4))
    return model, clean, steered


def is_png(path):
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 1000


@pytest.mark.slow
def test_resid_norm_figure_draws_one_line_per_stream_and_block(plots, runs, tmp_path):
    model, clean, steered = runs
    fig = plots.resid_norm_figure(steered, position=3, labels=list("abcdefgh"), clean_cache=clean,
                                  path=tmp_path / "norms.png")
    assert is_png(tmp_path / "norms.png")
    top, bottom = fig.axes[:2]
    assert len(top.get_lines()) == CFG.n_layers + 2  # each stream, and the clean final stream
    assert len(bottom.get_lines()) == CFG.n_layers
    assert top.get_yscale() == "log" and bottom.get_yscale() == "log"
    heights = top.get_lines()[-2].get_ydata()  # the final stream, steered
    assert np.argmax(heights) == 3
    assert [t.get_text() for t in bottom.get_xticklabels()] == list("abcdefgh")


@pytest.mark.slow
def test_lens_figure_writes_the_top_token_in_every_cell(plots, runs, tmp_path):
    model, _, steered = runs
    lens = logit_lens(steered)
    fig = plots.lens_figure(lens, decode=lambda i: f"t{i}", path=tmp_path / "lens.png")
    assert is_png(tmp_path / "lens.png")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == (CFG.n_layers + 1) * TOKENS.shape[1]
    ids = lens.top(1)[0][:, 0, :, 0]
    assert texts == [f"t{i}" for i in ids.reshape(-1)]
    assert np.array_equal(ax.images[0].get_array(), lens.top(1)[1][:, 0, :, 0])
    fig = plots.lens_figure(lens, target=7, position=2, path=tmp_path / "target.png")
    assert np.array_equal(fig.axes[0].images[0].get_array(), lens.prob(7)[:, 0])
    outline = [p for p in fig.axes[0].patches if p.get_x() == 1.5]  # column 2, outlined
    assert len(outline) == 1 and outline[0].get_height() == CFG.n_layers + 1


@pytest.mark.slow
def test_convergence_figure_is_log_log_with_a_one_over_k_guide(plots, tmp_path):
    ks = np.logspace(0, 6, 7)
    fig = plots.convergence_figure(ks, {"err": 3 / ks, "other": 1 / ks}, path=tmp_path / "conv.png")
    assert is_png(tmp_path / "conv.png")
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    guide = ax.get_lines()[-1].get_ydata()
    assert np.allclose(guide * ks, guide[0])  # slope −1


def test_convergence_figure_anchors_no_guide_on_nan(plots):
    ks = np.logspace(0, 3, 4)
    apart = {"early": [1, 0.1, np.nan, np.nan], "late": [np.nan, np.nan, 0.01, 0.001]}  # no k has both
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        lines = plots.convergence_figure(ks, apart).axes[0].get_lines()
        assert len(lines) == 2  # the two curves; a guide anchored on min(NaN) would be all NaN
        one_missing = plots.convergence_figure(ks, {**apart, "all": 1 / ks, "none": np.full(4, np.nan)})
    assert len(one_missing.axes[0].get_lines()) == 4  # an all-NaN line has no k: still no guide


def test_attribution_bars_take_any_object_with_labels_and_values(plots, tmp_path):
    labels = ["embed", "pos_embed", "L0.attn", "L0.mlp", "L1.attn", "ln_final.b"]
    values = np.zeros((6, 2, 4))
    values[:, 1, 2] = [0.5, -3.0, 0.1, 2.0, -0.2, 1.0]
    stand_in = SimpleNamespace(labels=labels, values=values)
    fig = plots.attribution_bars(stand_in, pos=2, batch=1, k=4, path=tmp_path / "bars.png")
    assert is_png(tmp_path / "bars.png")
    ax = fig.axes[0]
    ticks = sorted(ax.get_yticklabels(), key=lambda t: -t.get_position()[1])  # top to bottom
    assert [t.get_text() for t in ticks] == ["pos_embed", "L0.mlp", "ln_final.b", "embed", "rest (2 others)"]
    bars = sorted(ax.patches, key=lambda b: -b.get_y())  # top to bottom
    assert [round(b.get_width(), 6) for b in bars] == [-3.0, 2.0, 1.0, 0.5, -0.1]  # the rest: 0.1 − 0.2
    assert "sum to 0.4" in ax.get_xlabel()  # every component: the bars add up to the whole
    with pytest.raises(RefGPTError, match="values must be"):
        plots.attribution_bars(SimpleNamespace(labels=labels[:3], values=values))


def test_printable_makes_every_token_visible_and_short():
    assert printable(" the") == "␣the"
    assert printable("\n\t") == "⏎⇥"
    assert printable("\x01") == "\\x01"
    assert printable("\ufffd") == "\\ufffd"
    assert printable("abcdefghijkl", width=5) == "abcd…"


def test_refgpt_does_not_import_matplotlib_until_a_figure_is_made():
    code = ("import sys, refgpt, refgpt.analysis.plots, refgpt.analysis.lens, refgpt.analysis.interventions, refgpt.analysis.measurements, "
            "refgpt.cli.steer, refgpt.cli.lens; print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_missing_matplotlib_is_an_error_with_the_install_hint(runs, monkeypatch):
    from refgpt.analysis import plots

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import now raises ImportError
    with pytest.raises(RefGPTError, match=r"pip install matplotlib$"):  # works from a clone and from PyPI
        plots.convergence_figure([1, 10], {"e": [1, 0.1]})


@pytest.mark.parametrize("argv", [["lens", "To be", "--plot", "x.png"],
                                  ["steer", "To be", "--plus", "a", "--minus", "b", "--layer", "1", "--plot", "x.png"]])
def test_a_plot_without_matplotlib_is_refused_before_the_model_runs(refgpt_cli, monkeypatch, tmp_path, argv):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setattr("refgpt.cli._chosen_model.load", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.chdir(tmp_path)
    status, out, err = refgpt_cli.in_process(*argv)
    assert (status, out) == (1, "") and err == "refgpt: error: plotting needs matplotlib, an optional dependency: pip install matplotlib\n"
    assert "refgpt[plot]" not in err and not (tmp_path / "x.png").exists()
