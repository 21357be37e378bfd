"""Figures: the residual stream's size, lens heatmaps, convergence and attribution bars.

matplotlib is optional (``pip install matplotlib``, which works wherever refgpt came from; the
``plot`` extra names it too): it is imported inside each function, never when refgpt is imported,
and its absence is a ``RefGPTError`` with that install command (:func:`require_matplotlib`). Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot, no global state, the
Agg renderer), returned, and written to ``path`` when one is given.

    resid_norm_figure(cache, position=p)     ‖resid‖ per position, one line per layer, log scale:
                                             the spike at an injected position, and how the
                                             blocks (reading LN(x)) barely change it
    lens_figure(lens, labels)                layer × position heatmap, colour = probability,
                                             the top token written in each cell
    convergence_figure(ks, errors)           error against k on log–log axes, with a 1/k guide
    attribution_bars(attribution, pos)       the largest components of one logit, as bars
    naive_figure(naive)                      each piece of one logit by its own σ(c) beside the
                                             cached σ: two sums against the model's logit
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np

from ..files.atomic_write import write_atomically
from ..errors import RefGPTError
from .measurements import norm, stream_labels, streams


#: How to get matplotlib: a command that works from a clone and from PyPI alike (``refgpt[plot]``
#: names the package on PyPI, not the clone a user may be in).
INSTALL_HINT = "pip install matplotlib"


def require_matplotlib():
    """matplotlib's Figure, or a RefGPTError saying how to install it (the CLI calls this before
    it runs a model whose figure it could not draw)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RefGPTError(f"plotting needs matplotlib, an optional dependency: {INSTALL_HINT}") from None
    return Figure


def _figure(width, height):
    Figure = require_matplotlib()
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _finish(fig, path):
    if path is not None:  # the format from the target's suffix, as savefig(path) would choose it
        fmt = Path(path).suffix[1:].lower() or "png"
        write_atomically(path, lambda tmp: fig.savefig(str(tmp), format=fmt))
    return fig


def printable(text: str, width: int = 8) -> str:
    """A token's text as one short, visible label: spaces as ␣, newlines as ⏎, control and
    unprintable characters as \\xNN, cut to ``width`` characters with an ellipsis."""
    out = []
    for ch in text:
        if ch == " ":
            out.append("␣")
        elif ch == "\n":
            out.append("⏎")
        elif ch == "\t":
            out.append("⇥")
        elif unicodedata.category(ch)[0] == "C" or ch == "\ufffd":
            out.append("\\x%02x" % ord(ch) if ord(ch) < 256 else "\\u%04x" % ord(ch))
        else:
            out.append(ch)
    label = "".join(out)
    return label if len(label) <= width else label[:width - 1] + "…"


def token_labels(model, ids) -> list[str]:
    """Printable labels for token ids with the model's tokenizer, or the ids themselves."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if model.tokenizer is None:
        return [str(i) for i in ids]
    special = {v: k for k, v in model.tokenizer.special_tokens.items()}
    return [printable("<eot>" if i in special else model.to_string([i])) for i in ids]


def _panels(runs, what):
    """``runs`` as a list of (title or None, run): one run alone, or a dict {title: run}."""
    if isinstance(runs, dict):
        if not runs:
            raise RefGPTError(f"{what}: no runs to draw")
        return list(runs.items())
    return [(None, runs)]


def _marked(position):
    return [] if position is None else [int(j) for j in np.atleast_1d(position)]


def resid_norm_figure(cache, position=None, batch: int = 0, labels=None, clean_cache=None, path=None, title=None):
    """Two panels over positions, log y. Top: ‖resid‖, one line per stream (entering each block,
    and the final one). Bottom: what each block adds relative to the stream it reads,
    ‖resid_{M+1} − resid_M‖ / ‖resid_M‖ — tiny where the stream is huge.

    ``cache`` is one run's cache, or a dict {panel title: cache} (e.g. one per steering
    coefficient): then one column each, every top panel on one y-axis and every bottom one on
    another, so that sizes compare across columns. ``position`` (one or a list) marks injected
    positions; ``labels`` names the positions (tokens); ``clean_cache`` draws the unsteered run's
    final-stream norms as a dashed reference in every column.
    """
    marked = _marked(position)
    panels = _panels(cache, "resid_norm_figure")
    n_pos = streams(panels[0][1]).shape[2]
    width = max(6.0, 0.45 * n_pos + 2.5) if len(panels) == 1 else len(panels) * max(4.5, 0.3 * n_pos + 1.5) + 1.5
    fig = _figure(width, 6.6)
    axes = fig.subplots(2, len(panels), sharex=True, sharey="row", height_ratios=[3, 2], squeeze=False)
    clean = None if clean_cache is None else norm(streams(clean_cache)[:, batch])  # [stream, pos]
    peak = []
    for column, (heading, run) in enumerate(panels):
        top, bottom = axes[0, column], axes[1, column]
        x_all = streams(run)[:, batch]  # [stream, pos, d_model]
        norms = norm(x_all)  # [stream, pos], in float64
        pre = x_all[:-1]  # [block, pos, d_model] the stream each block reads
        post = np.stack([run[f"blocks.{M}.hook_resid_post"][batch] for M in range(len(pre))])  # [block, pos, d_model]
        change = norm(post.astype(np.float64) - pre) / norms[:-1]  # [block, pos] attn_out + mlp_out, relative
        n_stream = len(norms)
        colours = _colours(n_stream)
        names = stream_labels(n_stream - 1)
        x = np.arange(n_pos)
        for M in range(n_stream):
            top.plot(x, norms[M], marker="o", ms=3.5, lw=1.4, color=colours[M], label=f"stream {names[M]}")
        for M in range(n_stream - 1):
            bottom.plot(x, change[M], marker="o", ms=3, lw=1.2, color=colours[M], label=f"block {M}")
        if clean is not None:
            top.plot(x, clean[-1], ls="--", color="0.4", lw=1.2, label="final stream, no injection")
        for ax in (top, bottom):
            ax.set_yscale("log")
            ax.grid(True, which="major", alpha=0.3)
            for j in marked:
                ax.axvspan(j - 0.4, j + 0.4, color="tab:red", alpha=0.12, lw=0)
        if marked:
            j = max(marked, key=lambda i: norms[:, i].max())
            peak.append((top, j, norms[:, j].max()))
        if heading is not None:
            top.set_title(heading, fontsize=10)
        bottom.set_xlabel("position")
        bottom.set_xticks(x, labels if labels is not None else [str(i) for i in x], fontsize=8,
                          rotation=0 if labels is None else 45)
    axes[0, -1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes[1, -1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    if peak:
        low, high = axes[0, 0].get_ylim()
        axes[0, 0].set_ylim(low, high * 4)  # room for the label under the title (the row shares it)
        for ax, j, y in peak:
            ax.annotate("injected", (j, y), xytext=(0, 6), textcoords="offset points", ha="center",
                        color="tab:red", fontsize=9)
    axes[0, 0].set_ylabel("‖residual stream‖₂")
    axes[1, 0].set_ylabel("‖block's output‖ / ‖stream‖")
    title = title or "Residual-stream norm by position and layer"
    if len(panels) > 1:
        fig.suptitle(title, fontsize=11)
    else:
        axes[0, 0].set_title(title, fontsize=11)
    return _finish(fig, path)


def lens_figure(lens, labels=None, decode=None, batch: int = 0, target=None, position=None, path=None, title=None):
    """Heatmap of a ``LensResult``: rows = streams, columns = positions, colour = probability.

    Each cell shows the top token (``decode(id) -> str``, default the id). With ``target`` (an id
    or ids [batch, pos]) the colour is the target's probability instead of the top token's.
    ``position`` (one or a list) outlines those columns in red (injected positions). ``lens`` may
    be a dict {panel title: LensResult} (e.g. one per steering coefficient): one panel each, one
    above the other, all on one colour scale with one colour bar.
    """
    panels = _panels(lens, "lens_figure")
    cells = []
    for _, result in panels:
        ids, top_p = result.top(1)
        ids, top_p = ids[:, batch, :, 0], top_p[:, batch, :, 0]  # [stream, pos]
        cells.append((ids, top_p if target is None else result.prob(target)[:, batch]))  # [stream, pos] each
    n_stream, n_pos = cells[0][0].shape
    vmax = max(max(float(colour.max()) for _, colour in cells), 1e-12)
    decode = decode or str
    fig = _figure(max(5.0, 0.62 * n_pos + 2.6), len(panels) * max(3.0, 0.42 * n_stream + 1.6))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (heading, result), (ids, colour) in zip(axes, panels, cells, strict=True):
        image = ax.imshow(colour, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        for M in range(n_stream):
            for j in range(n_pos):
                shade = image.cmap(image.norm(colour[M, j]))
                ink = "black" if 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] > 0.5 else "white"
                ax.text(j, M, decode(int(ids[M, j])), ha="center", va="center", fontsize=9, color=ink)
        for j in _marked(position):
            from matplotlib.patches import Rectangle

            ax.add_patch(Rectangle((j - 0.5, -0.5), 1, n_stream, fill=False, edgecolor="tab:red", lw=2.2))
        ax.set_yticks(range(n_stream), result.labels, fontsize=8)
        ax.set_xticks(range(n_pos), labels if labels is not None else [str(j) for j in range(n_pos)],
                      fontsize=8, rotation=0 if labels is None else 45)
        ax.set_ylabel("stream read by the lens")
        if heading is not None:
            ax.set_title(heading, fontsize=10)
    axes[-1].set_xlabel("input position (the cell predicts the next token)")
    bar = fig.colorbar(image, ax=list(axes), shrink=0.9 if len(axes) == 1 else 0.6)
    bar.set_label("probability of the top token" if target is None else "probability of the target", fontsize=9)
    title = title or panels[0][1].kind
    if len(panels) > 1:
        fig.suptitle(title, fontsize=11)
    else:
        axes[0].set_title(title, fontsize=11)
    return _finish(fig, path)


def convergence_figure(ks, errors: dict, path=None, title=None, ylabel="error",
                       xlabel="coefficient k of the injected vector", guide_power=1, symbol="k"):
    """Errors against k on log–log axes, one line per entry of ``errors`` (label → [len(ks)]),
    with a dotted 1/k^guide_power guide just below the lowest line at the first k where every
    line has a value (no guide for ``guide_power=None``, nor when no k has a value on every line:
    it would be anchored on a NaN). NaN entries are left out of a line."""
    ks = np.asarray(ks, dtype=np.float64)
    fig = _figure(7.4, 4.8)
    ax = fig.add_subplot()
    colours = _colours(len(errors))
    table = np.array([np.asarray(err, dtype=np.float64) for err in errors.values()])  # [line, k]
    for label, err, colour in zip(errors, table, colours, strict=True):
        ax.loglog(ks, err, marker="o", ms=4, lw=1.5, color=colour, label=label)
    complete = np.flatnonzero(np.all(np.isfinite(table), axis=0))  # [k'] the k every line has
    if guide_power is not None and len(complete):
        first = int(complete[0])
        anchor = 0.3 * float(np.min(table[:, first]))
        guide = anchor * (ks[first] / ks) ** guide_power  # [k]
        power = "" if guide_power == 1 else f"$^{{{guide_power:g}}}$"  # a superscript, as 1/c² on the pages
        ax.loglog(ks[first:], guide[first:], ls=":", color="0.3", lw=1.4,
                  label=f"guide ∝ 1/{symbol}{power} (slope −{guide_power:g})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title or "Distance to the k → ∞ limit", fontsize=10)
    return _finish(fig, path)


def attribution_bars(attribution, pos: int = -1, batch: int = 0, k: int = 12, path=None, title=None):
    """Horizontal bars of the ``k`` largest |contributions| at one position, then a grey "rest"
    bar (the sum of the other components, labelled with how many), so that the bars sum to the
    logit.

    ``attribution`` needs ``labels`` [component] and ``values`` [component, batch, pos] (e.g.
    ``refgpt.attribute``'s result); positive bars push the logit up, negative down.
    """
    labels, values = list(attribution.labels), np.asarray(attribution.values)
    if values.ndim != 3 or values.shape[0] != len(labels):
        raise RefGPTError(f"attribution: values must be [component={len(labels)}, batch, pos], "
                          f"found {list(values.shape)}")
    column = values[:, batch, pos]  # [component]
    order = np.argsort(-np.abs(column), kind="stable")[:k]
    others = np.setdiff1d(np.arange(len(column)), order)  # [component − k]
    names = [labels[i] for i in order]
    bars = list(column[order])
    if len(others):
        names.append(f"rest ({len(others)} others)")
        bars.append(float(column[others].sum()))
    colours = ["tab:blue" if v >= 0 else "tab:red" for v in bars]
    if len(others):
        colours[-1] = "0.6"
    fig = _figure(6.4, max(2.5, 0.32 * len(bars) + 1.3))
    ax = fig.add_subplot()
    rows = np.arange(len(bars))[::-1]  # the largest at the top, "rest" at the bottom
    ax.barh(rows, bars, color=colours)
    ax.set_yticks(rows, names, fontsize=8)
    ax.axvline(0.0, color="0.3", lw=0.8)
    ax.set_xlabel(f"contribution to the logit (the {len(bars)} bars sum to {sum(bars):.4g})")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title or f"Top {len(order)} contributions at position {pos}", fontsize=11)
    return _finish(fig, path)


def naive_figure(naive, path=None, title=None, token=None):
    """Question (1) as a picture: for each piece of the final stream (a ``NaiveAttribution``), its
    contribution with its own scale σ(c) (naive) beside the one through ln_final's cached σ
    (exact), then both sums, and the model's logit as a vertical line: the exact bars sum to
    it, the naive ones do not. ``token`` (text) names the target in the axis label."""
    labels = list(naive.labels) + ["sum"]
    rows = np.arange(len(labels))[::-1]  # the first piece at the top, the sums at the bottom
    naive_bars = np.append(naive.naive, naive.naive_sum)  # [piece + 1]
    exact_bars = np.append(naive.exact, naive.exact_sum)  # [piece + 1]
    fig = _figure(7.4, max(3.2, 0.36 * len(labels) + 1.6))
    ax = fig.add_subplot()
    h = 0.38
    ax.barh(rows + h / 2, naive_bars, height=h, color="tab:orange",
            label=f"naive: each piece by its own σ(c); sum {naive.naive_sum:+.3f}")
    ax.barh(rows - h / 2, exact_bars, height=h, color="tab:blue",
            label=f"exact: every piece by ln_final's σ = {naive.scale:.3f}; sum {naive.exact_sum:+.3f}")
    ax.axvline(naive.logit, color="black", lw=1.3, ls="--", label=f"the model's logit {naive.logit:+.3f}")
    ax.axvline(0.0, color="0.3", lw=0.8)
    ax.axhline(rows[-1] + 0.5, color="0.5", lw=0.8)
    ax.set_yticks(rows, labels, fontsize=8)
    what = "logit" if token is None else f"logit of {printable(token, 12)!r}"
    ax.set_xlabel(f"contribution to the {what} at position {naive.position}")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title or f"ln_final σ at position {naive.position} = {naive.scale:.3f}: "
                          "the pieces sum to the logit only through it", fontsize=10)
    return _finish(fig, path)


def _colours(n):
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.9 * i / max(1, n - 1)) for i in range(n)]
