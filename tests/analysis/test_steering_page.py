"""docs/steering.md quotes what docs/make_steering_figures.py prints, and §7's thresholds hold.

The script runs on the embedded model (small: the whole page's numbers take seconds), without
its figures; every row it prints must be on the page as quoted (tests/doc_pages.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from doc_pages import DOCS, doc_script
from refgpt.errors import RefGPTError


@pytest.fixture(scope="module")
def script_and_page():
    return doc_script("make_steering_figures.py", "steering.md")


@pytest.mark.slow
def test_every_number_on_the_steering_page_comes_from_the_script(script_and_page):
    script, page = script_and_page
    rows = script.numbers(figures=False)
    assert script.check(rows, page) == []
    tags = set(re.findall(r"\((S\d+)\b", page))
    assert tags == {name for name, (kind, _) in rows.items() if kind != "line"}


def test_the_whole_model_is_finite_and_at_its_limit_at_the_thresholds(script_and_page):
    """§7: with the page's unit d, k = 10³⁰⁰, the ‖·‖₁ edge and the largest finite k (1.8·10³⁰⁸) in
    float64, and k = 10³⁵ and the ‖·‖₁ edge (‖k·d‖₁ = 0.99·max) in float32, give finite logits and
    the limit model's top tokens at and after p; a k whose k·d the dtype cannot hold is refused."""
    script, _ = script_and_page
    s64, s32 = script.Setting("float64"), script.Setting("float32")
    for k in (1e300, float(np.finfo(np.float64).max), script.l1_edge(s64)):
        assert script.finite_and_limit(s64, k), k
    for k in (1e35, script.l1_edge(s32)):
        assert script.finite_and_limit(s32, k), k
    with pytest.raises(RefGPTError, match="overflows float32"):
        script.finite_and_limit(s32, 1e40)


@pytest.mark.parametrize("script_name, page_name", [("make_steering_figures.py", "steering.md"),
                                                    ("make_decomposition_numbers.py", "decomposition.md")])
def test_every_figure_on_a_page_is_drawn_by_its_script(script_name, page_name):
    """A figure the page shows exists in docs/figures and is one its script writes (so running the
    script re-makes it)."""
    script, page = doc_script(script_name, page_name)
    source = (DOCS / script_name).read_text(encoding="utf-8")
    figures = re.findall(r"!\[[^\]]*\]\(figures/([^)]+\.png)\)", page)
    assert figures
    for name in figures:
        assert (DOCS / "figures" / name).is_file(), name
        assert name in source, f"{name} is not written by docs/{script_name}"


@pytest.mark.slow
def test_the_pages_reproduce_command_prints_its_table_row(refgpt_cli):
    """The `refgpt steer … --coeff 100 --generate 15` line the page gives prints the continuations
    of the table's unsteered and c = 10² rows."""
    page = (DOCS / "steering.md").read_text(encoding="utf-8")
    command = next(line.strip() for line in page.splitlines() if line.strip().startswith("refgpt steer"))
    args = re.findall(r'"[^"]*"|\S+', command)[1:]
    out = refgpt_cli(*[a.strip('"') for a in args], "--json")
    assert out.returncode == 0, out.stderr
    generated = json.loads(out.stdout)["generate"]
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| ") and line.endswith("` |")}  # the ActAdd table
    assert f"`{generated['unsteered']['continuation']!r}`" in rows["0 (unsteered)"]
    assert f"`{generated['steered']['continuation']!r}`" in rows["10²"]


@pytest.mark.slow
def test_the_seed_s_two_figures_are_the_page_s_two_commands(script_and_page, tmp_path):
    """The page prints SEED_COMMANDS as they are; run as the command line runs them, they steer
    position 20 only, with the vector the Python API makes (last_token_difference), and write
    both figures (the script writes docs/figures/ the same way)."""
    script, page = script_and_page
    lines = {line.strip() for line in page.splitlines()}
    assert set(script.SEED_COMMANDS.values()) <= lines
    answers = script.seed_figures(tmp_path)
    import refgpt
    from refgpt.analysis.interventions import last_token_difference

    model = refgpt.load_default()
    difference, plus, minus = last_token_difference(model, "Love", "Hate", 1)
    for name, answer in answers.items():
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert answer["steered_positions"] == [20] and answer["layer"] == 1
        assert answer["vector_norm"] == [float(np.linalg.norm(answer["coeffs"][-1] * difference))]
        assert [t["id"] for t in answer["plus"]] == [int(plus[-1])] and [t["id"] for t in answer["minus"]] == [int(minus[-1])]
        assert all(p["kl"] == 0.0 for p in answer["positions"][:20])  # causal: nothing before position 20 moves
    assert answers["steering_seed_norms.png"]["coeffs"] == [1.0, 1e6]
    assert answers["steering_seed_tuned_lens.png"]["coeffs"] == [1.0, 100.0, 1e6] and \
        answers["steering_seed_tuned_lens.png"]["lens"] == "tuned"


@pytest.mark.slow
def test_the_seed_s_tuned_lens_has_settled_by_c_100(script_and_page):
    """The caption: between c = 100 and c = 10⁶ one cell of the tuned-lens figure (the shipped lens
    under add_vector at position 20) changes its top token, stream 2_pre at position 20, and from
    c = 10³ on none does; at c = 1 cells at other positions do too."""
    script, _ = script_and_page
    import refgpt
    from refgpt.analysis.interventions import add_vector, last_token_difference
    from refgpt.analysis.lens import TunedLens

    model = refgpt.load_default()
    lens = TunedLens.load(model)
    tokens = model.to_tokens(script.SEED_TEXT, prepend_bos=True)[0]
    difference, _, _ = last_token_difference(model, "Love", "Hate", 1)
    tops = {}
    for c in (1.0, 100.0, 1e3, 1e6):
        with add_vector(model, tokens, difference, 1, [20], coeff=c):
            tops[c] = lens.run(tokens).top(1)[0][:, 0, :, 0]  # [stream, pos]
    assert np.argwhere(tops[100.0] != tops[1e6]).tolist() == [[2, 20]]  # stream 2_pre, position 20
    assert np.array_equal(tops[1e3], tops[1e6])
    assert any(pos != 20 for _, pos in np.argwhere(tops[1.0] != tops[1e6]))
