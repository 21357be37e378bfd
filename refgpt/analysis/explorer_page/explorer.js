// refgpt explorer: draws the views of one forward pass from the page's JSON document
// (#refgpt-data, schema in docs/explorer.md). Plain DOM, canvas and SVG; no library, no network.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("refgpt-data").textContent);
  const P = D.tokens.length;
  const state = { pos: P - 1, layer: D.steering ? D.steering.layer : D.layers[0], head: D.heads[0], lensKind: "logit", lensMetric: "top_prob",
                  lnView: "scale", attrBy: "layer", steer: 0, paint: "attention", feature: -1,
                  attrTarget: "page", part: "" };  // attrTarget "actual": the token that comes next; part: a clicked bar  // feature −1: the selected position's largest
  const $ = (id) => document.getElementById(id);
  const tip = $("tooltip");
  const show = (s) => visible(s);  // every token on the page is written one way: visible, below
  // A token as one visible label, as refgpt.analysis.plots.printable writes it: ␣ for a space, ⏎ for a
  // newline, ⇥ for a tab, \xNN (\uNNNN) for a control or unprintable character (tests check both agree).
  const visible = (t) => [...t].map((ch) => ch === " " ? "\u2423" : ch === "\n" ? "\u23ce" : ch === "\t" ? "\u21e5"
    : /[\p{C}\uFFFD]/u.test(ch) ? (ch.codePointAt(0) < 256 ? "\\x" + ch.codePointAt(0).toString(16).padStart(2, "0")
                                                           : "\\u" + ch.codePointAt(0).toString(16).padStart(4, "0"))
    : ch).join("");
  const fmt = (x, d = 4) => (x === null || x === undefined) ? "–" : Number(x).toFixed(d);
  const sci = (x) => Math.abs(x) >= 1e-3 && Math.abs(x) < 1e4 ? Number(x).toFixed(4) : Number(x).toExponential(3);

  // ---- colour ramps: white → blue for [0, 1]; blue ← white → red for [-1, 1] ----------------
  function ramp(t) {
    t = Math.max(0, Math.min(1, t));
    return [Math.round(255 - 247 * t), Math.round(255 - 207 * t), Math.round(255 - 148 * t)];
  }
  function diverging(t) {
    t = Math.max(-1, Math.min(1, t));
    return t >= 0 ? [255, Math.round(255 - 190 * t), Math.round(255 - 190 * t)]
                  : [Math.round(255 + 190 * t), Math.round(255 + 150 * t), 255];
  }
  const css = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;

  // A colour bar under a heat map: the colours from lo to hi (colourAt(t), t in [0, 1]) with both ends' values.
  function colourBar(canvas, colourAt, lo, hi, what) {  // lo, hi: numbers (kept exact in data-lo/-hi) or text
    const label = (v) => typeof v === "number" ? sci(v) : v;
    let box = document.getElementById(canvas.id + "-bar");
    if (!box) {
      box = document.createElement("div");
      box.id = canvas.id + "-bar";
      box.className = "colour-bar";
      canvas.after(box);
    }
    const stops = Array.from({ length: 11 }, (_, i) => `<stop offset="${i / 10}" stop-color="${css(colourAt(i / 10))}"/>`).join("");
    box.innerHTML = `<svg width="420" height="30"><defs><linearGradient id="${canvas.id}-gradient">${stops}</linearGradient></defs>` +
      `<rect x="70" y="2" width="280" height="10" fill="url(#${canvas.id}-gradient)" stroke="#999"/>` +
      `<text x="66" y="11" text-anchor="end">${label(lo)}</text><text x="354" y="11">${label(hi)}</text>` +
      `<text x="70" y="26">${what}</text></svg>`;
    box.dataset.lo = lo; box.dataset.hi = hi;
  }

  // Labels thinned by collision: of labels anchored at pixel positions xs (in order), the ones to draw,
  // greedily from the first, each at least `gap` px past the last drawn. Text LINE px high rotated by
  // an angle a from the axis needs LINE / sin a between anchors; unrotated rows need LINE.
  const LINE = 11;
  const gapAt = (degrees) => LINE / Math.sin(degrees * Math.PI / 180);
  function thin(xs, gap) {
    const keep = [];
    let last = -Infinity;
    xs.forEach((x, i) => { if (x - last >= gap - 1e-9) { keep.push(i); last = x; } });
    return keep;
  }

  function tooltip(event, text) {
    if (text === null) { tip.hidden = true; return; }
    tip.textContent = text;
    tip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(event.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }

  // A heat map on a canvas: rows × cols cells of cellW × cellH px, colour(r, c) → [r, g, b], with
  // optional row labels on the left and column labels below; hover(r, c) → tooltip text, click(r, c).
  function heatmap(canvas, o) {
    const left = o.rowLabel ? (o.left || 64) : 0, bottom = o.colLabel ? 40 : 0;
    const W = Math.round(o.cols * o.cellW), H = Math.round(o.rows * o.cellH);  // cells may be < 1 px: then averaged
    canvas.width = left + W;
    canvas.height = H + bottom;
    canvas.dataset.left = left;
    canvas.dataset.cellW = o.cellW; canvas.dataset.cellH = o.cellH;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    const image = ctx.createImageData(o.cols, o.rows);
    for (let r = 0; r < o.rows; r++) {
      for (let c = 0; c < o.cols; c++) {
        const rgb = o.colour(r, c), i = 4 * (r * o.cols + c);
        image.data[i] = rgb[0]; image.data[i + 1] = rgb[1]; image.data[i + 2] = rgb[2]; image.data[i + 3] = 255;
      }
    }
    const cells = document.createElement("canvas");
    cells.width = o.cols; cells.height = o.rows;
    cells.getContext("2d").putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = o.cellW < 1 || o.cellH < 1;
    ctx.imageSmoothingQuality = "high";
    ctx.drawImage(cells, left, 0, W, H);
    ctx.font = "10px ui-monospace, Menlo, monospace";
    ctx.textBaseline = "middle";
    if (o.label) {  // text in cells wide enough for it
      for (let r = 0; r < o.rows; r++) {
        for (let c = 0; c < o.cols; c++) {
          const text = o.label(r, c), rgb = o.colour(r, c);
          ctx.fillStyle = (rgb[0] + rgb[1] + rgb[2]) / 3 < 128 ? "#fff" : "#111";
          ctx.fillText(text.slice(0, Math.floor(o.cellW / 6)), left + c * o.cellW + 2, r * o.cellH + o.cellH / 2);
        }
      }
    }
    ctx.fillStyle = "#444";
    if (o.rowLabel) {  // labels thinned by collision: they never overprint
      ctx.textAlign = "right";
      const drawn = thin(Array.from({ length: o.rows }, (_, r) => r * o.cellH), LINE);
      for (const r of drawn) ctx.fillText(o.rowLabel(r).slice(0, Math.floor(left / 6.2)), left - 4, r * o.cellH + o.cellH / 2);
      ctx.textAlign = "left";
      canvas.dataset.rowLabels = JSON.stringify(drawn);
    }
    if (o.colLabel) {  // rotated 45°: thinned by collision
      const drawn = thin(Array.from({ length: o.cols }, (_, c) => c * o.cellW), gapAt(45));
      canvas.dataset.colLabels = JSON.stringify(drawn);
      ctx.save();
      for (const c of drawn) {
        ctx.save();
        ctx.translate(left + c * o.cellW + o.cellW / 2, H + 4);
        ctx.rotate(Math.PI / 4);
        ctx.fillText(o.colLabel(c).slice(0, 8), 0, 0);
        ctx.restore();
      }
      ctx.restore();
    }
    const cell = (e) => {
      const box = canvas.getBoundingClientRect();  // the border box: the drawing starts inside the border
      const x = (e.clientX - box.left - canvas.clientLeft) * canvas.width / canvas.clientWidth - left;
      const y = (e.clientY - box.top - canvas.clientTop) * canvas.height / canvas.clientHeight;
      const c = Math.floor(x / o.cellW), r = Math.floor(y / o.cellH);
      return x >= 0 && r >= 0 && r < o.rows && c >= 0 && c < o.cols ? [r, c] : null;
    };
    canvas.onmousemove = (e) => { const rc = cell(e); tooltip(e, rc && o.hover ? o.hover(rc[0], rc[1]) : null); };
    canvas.onmouseleave = (e) => tooltip(e, null);
    canvas.onclick = (e) => { const rc = cell(e); if (rc && o.click) o.click(rc[0], rc[1]); };
  }
  const tokenLabel = (p) => `${p} ${visible(D.tokens[p])}`;

  function outline(canvas, x, y, w, h, colour) {  // x measured from the cells' left edge
    const ctx = canvas.getContext("2d");
    x += Number(canvas.dataset.left || 0);
    ctx.strokeStyle = colour || "#e65100";
    ctx.lineWidth = 2;
    ctx.strokeRect(x + 1, y + 1, w - 2, h - 2);
  }

  // ---- the selection ----------------------------------------------------------------------
  const views = [];
  const SHARED = ["pos", "layer", "head", "lensKind", "lensMetric", "lnView", "attrBy", "steer", "paint", "feature",
                  "attrTarget", "part"];
  function select(changes) {
    Object.assign(state, changes);
    for (const view of views) view();
    try {  // the selection lives in the URL fragment, so a view can be shared (not possible in a srcdoc iframe)
      history.replaceState(null, "", "#" + SHARED.map((k) => `${k}=${encodeURIComponent(state[k])}`).join("&"));
    } catch (e) { /* no URL to write to */ }
  }
  function fromFragment() {  // the fragment's selection, each value checked; anything else is ignored
    const given = new URLSearchParams(location.hash.slice(1)), out = {};
    const whole = (k, lo, hi) => { const v = Number(given.get(k)); if (given.has(k) && Number.isInteger(v) && v >= lo && v <= hi) out[k] = v; };
    const oneOf = (k, options) => { if (options.includes(given.get(k))) out[k] = given.get(k); };
    whole("pos", 0, P - 1);
    whole("layer", 0, D.model.n_layers - 1);
    whole("head", 0, D.model.n_heads - 1);
    whole("steer", 0, D.steering ? D.steering.runs.length - 1 : 0);
    whole("feature", -1, D.sae ? D.sae.d_sae - 1 : -1);
    oneOf("lensKind", D.lens.tuned ? ["logit", "tuned"] : ["logit"]);
    oneOf("lensMetric", ["top_prob", "entropy", "kl", "target_rank"]);
    oneOf("lnView", ["scale", "mean", "norm"]);
    oneOf("attrBy", ["layer", "head"]);
    oneOf("paint", ["attention", "logprob"]);
    oneOf("attrTarget", D.attribution.actual ? ["page", "actual"] : ["page"]);
    oneOf("part", D.attribution.pushes.labels);
    return out;
  }

  // ---- header and tokens --------------------------------------------------------------------
  const m = D.model;
  $("summary").textContent = `${P} tokens · ${m.n_layers} layers × ${m.n_heads} heads · d_model ${m.d_model} · ` +
    `${m.dtype} · target ${show(D.target.token)} (id ${D.target.id})` + (m.source ? ` · ${m.source}` : "");
  const tokenBox = $("tokens");
  D.tokens.forEach((t, i) => {
    const span = document.createElement("span");
    span.className = "tok";
    span.textContent = visible(t);
    span.title = `position ${i}, id ${D.token_ids[i]}, ${show(t)}`;
    span.dataset.pos = i;
    span.onclick = () => select({ pos: i });
    tokenBox.appendChild(span);
  });
  $("paint").onchange = () => select({ paint: $("paint").value });
  // Paint the token strip: the attention of one head (the selected one, or the one hovered) from the
  // selected query position to every key, or each token's log-probability (red: unlikely).
  function paint(layer, head) {
    const li = D.layers.indexOf(layer), hi = D.heads.indexOf(head);
    const byAttention = state.paint !== "logprob";
    for (const span of tokenBox.children) {
      const k = Number(span.dataset.pos);
      let colour = null;
      if (byAttention && li >= 0 && hi >= 0 && k <= state.pos) colour = attnColour(weight(li, hi, state.pos, k));
      if (!byAttention && D.next_logprob[k] !== null) colour = diverging(Math.min(1, -D.next_logprob[k] / 10));
      span.style.background = colour ? css(colour) : "";
      span.dataset.value = byAttention ? (colour ? weight(li, hi, state.pos, k) : "") : (D.next_logprob[k] ?? "");
    }
    $("paint-legend").textContent = byAttention
      ? (li >= 0 && hi >= 0 ? `L${layer}H${head}'s attention from position ${state.pos} ${show(D.tokens[state.pos])} ` +
         "(white 0 → blue 1, √ scale); hover a token for its weight" : `head L${layer}H${head} is not in this page`)
      : "log p(token | the tokens before it): white 0 → red −10 nats or less; hover a token for its value";
  }
  views.push(() => {
    paint(state.layer, state.head);
    for (const span of tokenBox.children) {
      const k = Number(span.dataset.pos), lp = D.next_logprob[k];
      span.title = `position ${k}, id ${D.token_ids[k]}, ${show(D.tokens[k])}` +
        (lp === null ? "" : `\nlog p(this token | the tokens before) = ${lp.toFixed(4)}`) +
        (state.paint !== "logprob" && span.dataset.value !== "" ? `\nattention from ${state.pos}: ${Number(span.dataset.value).toFixed(3)}` : "");
    }
  });
  views.push(() => {
    for (const span of tokenBox.children) span.classList.toggle("selected", Number(span.dataset.pos) === state.pos);
    $("selection").textContent = `selected: position ${state.pos} ${show(D.tokens[state.pos])} · layer ${state.layer}` +
      ` · head ${state.head}`;
  });

  // ---- attention ----------------------------------------------------------------------------
  const attnColour = (w) => ramp(Math.sqrt(w));  // √: the small weights of long rows stay visible
  // Each head's pattern is one string (refgpt.analysis.explorer.pattern_string): its weights in whole
  // thousandths, row by row, a digit each below 62, else a prefix character and a digit.
  const DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", PREFIXES = "!#$%&()*+,-./:;=";
  function decodePattern(text) {
    const out = new Uint16Array(P * (P + 1) / 2);
    for (let i = 0, n = 0; i < text.length; n++) {
      const p = PREFIXES.indexOf(text[i]);
      out[n] = p < 0 ? DIGITS.indexOf(text[i++]) : 62 * (1 + p) + DIGITS.indexOf(text[i + 1]);
      if (p >= 0) i += 2;
    }
    return out;
  }
  const patterns = D.pattern.map((heads) => heads.map(decodePattern));
  const weight = (li, hi, q, k) => k <= q ? patterns[li][hi][q * (q + 1) / 2 + k] * D.pattern_unit : 0;
  const patternText = (li, hi, q, k) =>
    `L${D.layers[li]}H${D.heads[hi]} · query ${q} ${show(D.tokens[q])} → key ${k} ${show(D.tokens[k])}: ` +
    (k <= q ? fmt(weight(li, hi, q, k), 3) : "masked (0)");
  const grid = $("heads");
  const small = Math.max(36, Math.min(96, Math.floor(980 / D.heads.length) - 8));
  grid.style.gridTemplateColumns = `40px repeat(${D.heads.length}, ${small + 4}px)`;
  grid.appendChild(document.createElement("div"));
  for (const h of D.heads) {
    const col = document.createElement("div");
    col.className = "col"; col.textContent = `H${h}`;
    grid.appendChild(col);
  }
  const headCanvases = [];
  D.layers.forEach((L, li) => {
    const label = document.createElement("div");
    label.className = "label"; label.textContent = `L${L}`;
    grid.appendChild(label);
    D.heads.forEach((h, hi) => {
      const canvas = document.createElement("canvas");
      canvas.className = "head";
      canvas.dataset.layer = L; canvas.dataset.head = h;
      canvas.title = `L${L}H${h}: click to enlarge`;
      canvas.addEventListener("mouseenter", () => paint(L, h));  // preview this head on the token strip
      canvas.addEventListener("mouseleave", () => paint(state.layer, state.head));
      grid.appendChild(canvas);
      const cell = Math.min(small / P, 8);
      heatmap(canvas, { rows: P, cols: P, cellW: cell, cellH: cell, colour: (q, k) => attnColour(weight(li, hi, q, k)),
                        hover: (q, k) => patternText(li, hi, q, k),
                        click: () => { select({ layer: L, head: h }); enlarge(li, hi); } });
      headCanvases.push(canvas);
    });
  });
  views.push(() => {
    for (const c of headCanvases) {
      c.classList.toggle("selected", Number(c.dataset.layer) === state.layer && Number(c.dataset.head) === state.head);
    }
  });

  let enlarged = null;
  function enlarge(li, hi) {
    enlarged = [li, hi];
    $("modal").hidden = false;
    drawEnlarged();
  }
  function drawEnlarged() {
    if (!enlarged) return;
    const [li, hi] = enlarged;
    const cell = Math.max(1, Math.floor(Math.min(720, window.innerHeight * 0.8) / P));  // whole pixels per weight
    const canvas = $("modal-canvas");
    $("modal-title").textContent = `L${D.layers[li]}H${D.heads[hi]} · ${P} queries × ${P} keys · ` +
      `the selected query (position ${state.pos}) is outlined`;
    const labels = tokenLabel;  // thinned where the cells are small: the axes stay at any length
    heatmap(canvas, { rows: P, cols: P, cellW: cell, cellH: cell, colour: (q, k) => attnColour(weight(li, hi, q, k)),
                      hover: (q, k) => patternText(li, hi, q, k), click: (q) => select({ pos: q }),
                      rowLabel: labels, colLabel: labels, left: 120 });
    outline(canvas, 0, state.pos * cell, P * cell, cell);
  }
  function closeModal() { $("modal").hidden = true; enlarged = null; tip.hidden = true; }
  $("modal-close").onclick = closeModal;
  $("modal").onclick = (e) => { if (e.target === $("modal")) closeModal(); };
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeModal(); });
  views.push(drawEnlarged);

  // ---- lenses -------------------------------------------------------------------------------
  const S = D.lens.streams.length;
  const streamLayer = (s) => Math.min(s, m.n_layers - 1);  // stream s enters block s; the last is the output
  if (!D.lens.tuned) {
    $("lens-kind-tuned").disabled = true;
    $("lens-kind-tuned").parentElement.title = "no tuned lens in this page (refgpt explore --lens DIR)";
  }
  for (const input of document.getElementsByName("lens-kind")) {
    input.onchange = () => select({ lensKind: input.value });
  }
  $("lens-metric").onchange = () => select({ lensMetric: $("lens-metric").value });
  const logVocab = Math.log(m.d_vocab);
  function lensColour(lens, metric, s, p) {
    const v = lens[metric][s][p];
    if (metric === "top_prob") return ramp(v);
    if (metric === "entropy") return ramp(v / logVocab);
    if (metric === "kl") return ramp(Math.min(1, v / 10));
    return ramp(1 - Math.log(v) / Math.log(m.d_vocab));  // rank 1 darkest
  }
  function lensText(kind, lens, s, p) {
    return `${kind} lens · stream ${D.lens.streams[s]} · position ${p} ${show(D.tokens[p])}\n` +
      `top ${show(lens.top_token[s][p])} p=${fmt(lens.top_prob[s][p])}\n` +
      `entropy ${fmt(lens.entropy[s][p], 3)} nats · KL(final ‖ lens) ${fmt(lens.kl[s][p], 3)} nats\n` +
      `target ${show(D.target.token)}: rank ${lens.target_rank[s][p]}, p=${fmt(lens.target_prob[s][p])}\n` +
      `top ${lens.top10_token[s][p].length}:` + lens.top10_token[s][p].map((t, k) =>
        `\n${String(k + 1).padStart(3)}. ${visible(t).padEnd(14)} ${Number(lens.top10_prob[s][p][k]).toPrecision(4)}`).join("");
  }
  function drawLens(canvas, lens, kind, metric) {
    const cellW = Math.max(3, Math.min(48, Math.floor(1000 / P)));
    const rows = S, cellH = cellW >= 28 ? 18 : Math.max(8, Math.min(18, Math.floor(360 / S)));
    const r2s = (r) => S - 1 - r;  // the final stream on top
    heatmap(canvas, { rows, cols: P, cellW, cellH, colour: (r, p) => lensColour(lens, metric, r2s(r), p),
                      hover: (r, p) => lensText(kind, lens, r2s(r), p),
                      click: (r, p) => select({ pos: p, layer: streamLayer(r2s(r)) }),
                      label: cellW >= 28 ? (r, p) => visible(lens.top_token[r2s(r)][p]) : null,
                      rowLabel: (r) => D.lens.streams[r2s(r)], colLabel: tokenLabel });
    outline(canvas, state.pos * cellW, 0, cellW, rows * cellH);
  }
  views.push(() => {
    const kind = state.lensKind === "tuned" && D.lens.tuned ? "tuned" : "logit";
    drawLens($("lens-canvas"), D.lens[kind], kind, state.lensMetric);
    const bars = {
      top_prob: [(t) => ramp(t), "0", "1", "the top token's probability"],
      entropy: [(t) => ramp(t), "0", `${logVocab.toFixed(2)} = ln d_vocab`, "entropy (nats)"],
      kl: [(t) => ramp(t), "0", "≥ 10", "KL(final ‖ lens) (nats)"],
      target_rank: [(t) => ramp(1 - t), "rank 1", `rank ${m.d_vocab}`, "rank of the target (log scale)"],
    }[state.lensMetric];
    colourBar($("lens-canvas"), ...bars);
  });

  // ---- LayerNorm ----------------------------------------------------------------------------
  $("ln-view").onchange = () => select({ lnView: $("ln-view").value });
  function lnRows() {
    if (state.lnView === "norm") return { names: D.resid_norm.streams, values: D.resid_norm.values, what: "‖resid‖" };
    const table = state.lnView === "scale" ? D.ln_scale : D.ln_mean;
    const names = Object.keys(table);
    return { names, values: names.map((n) => table[n]), what: state.lnView === "scale" ? "σ" : "mean" };
  }
  views.push(() => {
    const { names, values, what } = lnRows();
    const flat = values.flat();
    const lo = Math.min(...flat), hi = Math.max(...flat), big = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    const logLo = Math.log(Math.max(lo, 1e-300)), logHi = Math.log(Math.max(hi, 1e-300));
    const colour = what === "mean" ? (v) => diverging(v / big)
      : (v) => ramp(logHi > logLo ? (Math.log(Math.max(v, 1e-300)) - logLo) / (logHi - logLo) : 0.5);
    const cellW = Math.max(3, Math.min(48, Math.floor(1000 / P)));
    const rows = names.length, cellH = Math.max(6, Math.min(16, Math.floor(420 / rows)));
    const r2i = (r) => rows - 1 - r;  // the last LayerNorm on top
    heatmap($("ln-canvas"), { rows, cols: P, cellW, cellH, colour: (r, p) => colour(values[r2i(r)][p]),
      hover: (r, p) => `${names[r2i(r)]} · position ${p} ${show(D.tokens[p])}: ${what} = ${sci(values[r2i(r)][p])}`,
      click: (r, p) => select({ pos: p }), rowLabel: (r) => names[r2i(r)], colLabel: tokenLabel, left: 100 });
    outline($("ln-canvas"), state.pos * cellW, 0, cellW, rows * cellH);
    if (what === "mean") colourBar($("ln-canvas"), (t) => diverging(2 * t - 1), -big, big, "mean (0 white)");
    else colourBar($("ln-canvas"), (t) => ramp(t), lo, hi, `${what} (log scale)`);
    profile($("ln-profile"), names, values.map((row) => row[state.pos]), `${what} at position ${state.pos} ` +
            `${show(D.tokens[state.pos])}, bottom to top`, what !== "mean");
  });

  // A line through one value per name (an SVG polyline), log scale when asked.
  function profile(box, names, ys, title, log) {
    const W = 900, H = 200, pad = 40;
    const f = log ? (v) => Math.log10(Math.max(v, 1e-300)) : (v) => v;
    const vs = ys.map(f), lo = Math.min(...vs), hi = Math.max(...vs), span = hi - lo || 1;
    const x = (i) => pad + i * (W - 2 * pad) / Math.max(1, names.length - 1);
    const y = (v) => H - 80 - (f(v) - lo) / span * (H - 100);
    const points = ys.map((v, i) => `${x(i)},${y(v)}`).join(" ");
    box.innerHTML = `<svg width="${W}" height="${H}" role="img" aria-label="${title}">` +
      `<text x="${pad}" y="12">${title}</text>` +
      `<polyline points="${points}" fill="none" stroke="#1f5fa8" stroke-width="1.5"/>` +
      ys.map((v, i) => `<circle cx="${x(i)}" cy="${y(v)}" r="2.5" fill="#1f5fa8"><title>${names[i]}: ${sci(v)}</title></circle>`).join("") +
      thin(names.map((_, i) => x(i)), gapAt(45)).map((i) => `<text transform="translate(${x(i) - 3},${H - 72}) rotate(45)">${names[i]}</text>`).join("") +
      `<text x="2" y="${y(ys[vs.indexOf(hi)])}">${sci(ys[vs.indexOf(hi)])}</text>` +
      `<text x="2" y="${y(ys[vs.indexOf(lo)])}">${sci(ys[vs.indexOf(lo)])}</text></svg>`;
  }

  // ---- attribution --------------------------------------------------------------------------
  const A = D.attribution;
  for (const input of document.getElementsByName("attr-by")) {
    input.onchange = () => select({ attrBy: input.value });
  }
  const layerOf = (label) => {  // "L3H5", "L3H5.b_V" → "L3.attn" / "L3.b_V"; "L3.b_O" … as they are
    const head = /^L(\d+)H\d+(\.b_V)?$/.exec(label);
    return head ? `L${head[1]}.${head[2] ? "b_V" : "attn"}` : label;
  };
  function components(labels = A.labels, values = A.values) {  // [label, value at the selected position], by layer or head
    const parts = new Map();
    labels.forEach((label, i) => {
      const key = state.attrBy === "head" ? label : layerOf(label);
      parts.set(key, (parts.get(key) || 0) + values[i][state.pos]);
    });
    return [...parts.entries()];
  }
  $("attr-target-name").textContent = show(D.target.token);
  for (const input of document.getElementsByName("attr-target")) input.onchange = () => select({ attrTarget: input.value });
  if (!A.actual) $("attr-target-actual").disabled = true;
  views.push(() => {
    const actual = state.attrTarget === "actual" && A.actual;  // the actual next token: stored by layer, no entry at the end
    const summary = $("attr-summary");
    if (actual && state.pos === P - 1) {
      summary.textContent = `the last position has no next token: select an earlier one, or the target ${show(D.target.token)}`;
      summary.className = ""; summary.dataset.sum = summary.dataset.logit = "";
      waterfall($("attr-canvas"), [], 0);
      $("attr-top").innerHTML = "";
      return;
    }
    const labels = actual ? A.actual.labels : A.labels, values = actual ? A.actual.values : A.values;
    const parts = components(labels, values), token = actual ? D.tokens[state.pos + 1] : D.target.token;
    let sum = 0;
    for (const v of values) sum += v[state.pos];  // every component, summed here on the page
    const logit = (actual ? A.actual.logit : A.logit)[state.pos], error = Math.abs(sum - logit);
    summary.textContent = `logit of ${actual ? "the next token, " : ""}${show(token)} at position ${state.pos} ` +
      `${show(D.tokens[state.pos])}: ${logit.toPrecision(10)}; Σ of ${labels.length} components = ${sum.toPrecision(10)} ` +
      `(|Σ − logit| = ${error.toExponential(2)})` + (actual && state.attrBy === "head" ? " · the next token's split is stored by layer" : "");
    summary.dataset.sum = sum; summary.dataset.logit = logit; summary.dataset.token = token;
    const ok = error <= 1e-9 * Math.max(1, Math.abs(logit));
    summary.className = ok ? "ok" : "bad";
    waterfall($("attr-canvas"), parts, logit, state.part || undefined, (label) => select({ part: label }));
    const top = [...parts].sort((a, b) => Math.abs(b[1]) - Math.abs(a[1])).slice(0, 12);
    $("attr-top").innerHTML = "";
    for (const [label, v] of top) {
      const li = document.createElement("li");
      li.textContent = `${label.padEnd(12)} ${v >= 0 ? "+" : ""}${v.toFixed(4)}`;
      $("attr-top").appendChild(li);
    }
  });

  // What the clicked part writes, read through ln_final's cached σ: the tokens it pushes up and down.
  const Pu = A.pushes;
  views.push(() => {
    const box = $("attr-push"), label = state.part, i = Pu.positions.indexOf(state.pos), k = Pu.labels.indexOf(label);
    box.innerHTML = "";
    const title = document.createElement("p");
    title.id = "attr-push-title";
    box.appendChild(title);
    if (!label || k < 0) { title.textContent = "click a bar to list the tokens that part pushes up and down"; return; }
    if (i < 0) {
      title.textContent = `${label}: the page keeps what the parts push at positions ${Pu.positions[0]} … ` +
        `${Pu.positions[Pu.positions.length - 1]} only (its budget); select one of them`;
      return;
    }
    title.textContent = `${label} at position ${state.pos} ${show(D.tokens[state.pos])}, read through ln_final's cached ` +
      `σ = ${D.ln_scale.ln_final[state.pos].toPrecision(4)}: the logits it adds, (w ⊙ (c − mean c)/σ)·W_U, largest and smallest`;
    const grid = document.createElement("div");
    grid.className = "steer-grid";
    for (const [side, ids, vals, colour] of [["up", Pu.up_ids, Pu.up, "#2e7d32"], ["down", Pu.down_ids, Pu.down, "#c62828"]]) {
      const column = document.createElement("div");
      column.id = `attr-push-${side}`;
      column.className = "bars";
      column.innerHTML = `<b>pushes ${side}</b>`;
      const big = Math.max(...Pu.up[k][i].map(Math.abs), ...Pu.down[k][i].map(Math.abs)) || 1;
      ids[k][i].forEach((id, j) => {
        const row = document.createElement("div"), v = vals[k][i][j];
        row.className = "bar-row";
        row.innerHTML = `<span class="name"></span><span class="bar" style="width:${Math.round(Math.abs(v) / big * 120)}px;` +
          `background:${colour}"></span><span class="p">${v >= 0 ? "+" : ""}${v.toPrecision(4)}</span>`;
        row.firstChild.textContent = visible(Pu.token_strings[String(id)]);
        row.dataset.id = id; row.dataset.value = v;
        column.appendChild(row);
      });
      grid.appendChild(column);
    }
    box.appendChild(grid);
  });

  // ---- question (1): the naive twin of the waterfall (docs/decomposition.md §1) -------------------
  const N = A.naive;
  views.push(() => {
    const p = state.pos, sigma = D.ln_scale.ln_final[p], logit = A.logit[p];
    const naive = N.naive.map((row) => row[p]), exact = N.exact.map((row) => row[p]);
    const naiveSum = naive.reduce((a, b) => a + b, 0), exactSum = exact.reduce((a, b) => a + b, 0);
    const summary = $("naive-summary");
    summary.innerHTML = "";
    const link = document.createElement("a");
    link.id = "naive-sigma";
    link.textContent = `ln_final σ at position ${p} = ${sigma.toPrecision(4)}`;
    link.title = "the cached scale: show it in the LayerNorm view";
    link.onclick = () => { $("ln-view").value = "scale"; select({ lnView: "scale" }); $("layernorm").scrollIntoView(); };
    summary.append(link, ` · each piece by its own σ(c): Σ = ${naiveSum.toPrecision(6)} · every piece by the cached σ: ` +
      `Σ = ${exactSum.toPrecision(6)} · the model's logit ${logit.toPrecision(6)}`);
    summary.dataset.naive = naiveSum; summary.dataset.exact = exactSum; summary.dataset.sigma = sigma;
    twin($("attr-naive"), N.labels, naive, exact, naiveSum, exactSum, logit, p);
  });

  // Two bars per piece (naive orange, exact blue), then the two sums, and the logit as a dashed line.
  function twin(box, labels, naive, exact, naiveSum, exactSum, logit, p) {
    const names = [...labels, "sum"], a = [...naive, naiveSum], b = [...exact, exactSum];
    const W = 1000, H = 250, padL = 56, padB = 64, n = names.length, slot = (W - padL) / n;
    const lo = Math.min(0, logit, ...a, ...b), hi = Math.max(0, logit, ...a, ...b), span = (hi - lo) || 1;
    const y = (v) => 10 + (hi - v) / span * (H - padB - 10);
    const bar = (i, k, v, colour, what) => {
      const x = padL + i * slot + slot * (0.12 + 0.38 * k), top = Math.min(y(0), y(v));
      return `<rect x="${x.toFixed(1)}" y="${top.toFixed(1)}" width="${(slot * 0.36).toFixed(1)}" ` +
        `height="${Math.max(1, Math.abs(y(v) - y(0))).toFixed(1)}" fill="${colour}" data-piece="${names[i]}" data-kind="${what}">` +
        `<title>${names[i]} at position ${p}, ${what}: ${v >= 0 ? "+" : ""}${v.toPrecision(8)}` +
        (i < labels.length && N.own_scale[i] ? `\nown σ(c) = ${N.own_scale[i][p].toPrecision(4)}` : "") + `</title></rect>`;
    };
    const ticks = [lo, 0, hi].filter((v, i) => i !== 1 || (y(0) - y(hi) > 12 && y(lo) - y(0) > 12)).map((v) => `<text x="${padL - 4}" y="${y(v) + 4}" text-anchor="end">${v.toFixed(2)}</text>` +
      `<line x1="${padL}" x2="${W}" y1="${y(v)}" y2="${y(v)}" stroke="#ddd"/>`).join("");
    box.innerHTML = `<svg width="${W}" height="${H}" role="img" aria-label="naive and exact pieces">${ticks}` +
      names.map((_, i) => bar(i, 0, a[i], "#ef8a17", "naive, own σ(c)") + bar(i, 1, b[i], "#1f77b4", "exact, cached σ")).join("") +
      `<line x1="${padL}" x2="${W}" y1="${y(logit)}" y2="${y(logit)}" stroke="#000" stroke-dasharray="5,4"/>` +
      `<text x="${W - 4}" y="${y(logit) - 4}" text-anchor="end">the model's logit ${logit.toFixed(3)}</text>` +
      `<line x1="${padL + (n - 1) * slot}" x2="${padL + (n - 1) * slot}" y1="6" y2="${H - padB}" stroke="#999"/>` +
      names.map((name, i) => `<text transform="translate(${(padL + (i + 0.4) * slot).toFixed(1)},${H - padB + 12}) rotate(35)">` +
        `${name}</text>`).join("") + `</svg>`;
  }

  // ---- SAE features: the same logit with the SAE's activation split by feature (refgpt/sae/page.py) ----
  const F = D.sae;
  if (!F) {
    $("sae-body").textContent = "No SAE in this page (refgpt explore TEXT --sae DIR|default).";
    $("nav-sae").title = "no SAE in this page";
  } else {
    $("sae-body").innerHTML = `<p class="legend" id="sae-about"></p><p id="sae-summary"></p><canvas id="sae-canvas"></canvas>` +
      `<div class="steer-grid"><div><h3>features active at the selected position, largest |contribution| first ` +
      `(click one)</h3><ol id="sae-list"></ol></div><div><h3 id="sae-feature-title"></h3>` +
      `<div id="sae-strip"></div><p class="legend" id="sae-strip-legend"></p><div class="steer-grid">` +
      `<div><b>promotes</b><div id="sae-top" class="bars"></div></div>` +
      `<div><b>suppresses</b><div id="sae-bottom" class="bars"></div></div></div>` +
      `<p class="legend">each token's logit per unit of the feature's activation, times ln_final's σ ` +
      `(feature_logits: W_dec[i]·P(w ⊙ W_U))</p></div></div>`;
    $("sae-about").textContent = `${F.architecture} SAE ${F.source ? `(${F.source}) ` : ""}at ${F.hook}, ${F.d_sae} ` +
      `features: its features, b_dec and error row sae_error replace the components its hook covers; the rest is as ` +
      `above. The page keeps, per position, the ${F.features_shown} active features of largest |contribution|; ` +
      `the others' sum is one bar, "other features". Click a feature's bar or its line to show it.`;
    const SAE_ROWS = ["b_dec", "sae_mean", "W_skip", "sae_error"];  // after the features, in this order
    const featureOf = (label) => /^F\d+$/.test(label) ? Number(label.slice(1)) : null;
    function saeParts(p) {  // the upstream components (by layer or head), the features, then the SAE's own rows
      const here = F.positions[p];
      const upstream = F.labels.map((l, i) => [l, i]).filter(([l]) => !SAE_ROWS.includes(l));
      const parts = components(upstream.map(([l]) => l), upstream.map(([, i]) => F.values[i]));
      here.features.forEach((f, k) => parts.push([`F${f}`, here.contribution[k]]));
      if (here.n_rest) parts.push([`other features (${here.n_rest})`, here.rest]);
      for (const name of SAE_ROWS) { const i = F.labels.indexOf(name); if (i >= 0) parts.push([name, F.values[i][p]]); }
      return parts;
    }
    const shownFeature = () => {  // the chosen feature, or the largest at the selected position
      if (state.feature >= 0) return state.feature;
      const here = F.positions[state.pos];
      return here.features.length ? here.features[0] : null;
    };
    const tokenOf = (id) => F.token_strings[String(id)];
    const activationAt = (f, p) => { for (const [q, v] of F.features[String(f)].activation) if (q === p) return v; return 0; };
    function logitBars(box, side, big, colour) {
      box.innerHTML = "";
      side.ids.forEach((id, k) => {
        const row = document.createElement("div"), v = side.values[k];
        row.className = "bar-row";
        row.innerHTML = `<span class="name"></span><span class="bar" style="width:${Math.round(Math.abs(v) / big * 120)}px;` +
          `background:${colour}"></span><span class="p">${v >= 0 ? "+" : ""}${v.toFixed(3)}</span>`;
        row.firstChild.textContent = show(tokenOf(id));
        row.dataset.id = id; row.dataset.value = v;
        box.appendChild(row);
      });
    }
    views.push(() => {
      const p = state.pos, here = F.positions[p], logit = A.logit[p];
      let sum = 0;  // every number the page holds for this position, summed here
      for (const v of F.values) sum += v[p];
      for (const c of here.contribution) sum += c;
      sum += here.rest;
      const error = Math.abs(sum - logit), summary = $("sae-summary");
      summary.textContent = `logit of ${show(D.target.token)} at position ${p} ${show(D.tokens[p])}: ${logit.toPrecision(10)}; ` +
        `${F.l0[p]} features active; Σ of ${F.labels.length} rows, ${here.features.length} features` +
        (here.n_rest ? ` and the other ${here.n_rest}` : "") + ` = ${sum.toPrecision(10)} (|Σ − logit| = ${error.toExponential(2)})`;
      summary.dataset.sum = sum; summary.dataset.logit = logit;
      summary.className = error <= 1e-9 * Math.max(1, Math.abs(logit)) ? "ok" : "bad";
      const chosen = shownFeature();
      waterfall($("sae-canvas"), saeParts(p), logit, chosen === null ? null : `F${chosen}`,
                (label) => { const f = featureOf(label); if (f !== null) select({ feature: f }); });
      const list = $("sae-list");
      list.innerHTML = "";
      here.features.forEach((f, k) => {
        const li = document.createElement("li");
        const c = here.contribution[k];
        li.textContent = `F${f}`.padEnd(7) + ` act ${activationAt(f, p).toFixed(3).padStart(7)} · ${c >= 0 ? "+" : ""}${c.toFixed(4)}`;
        li.dataset.feature = f;
        li.className = f === chosen ? "chosen" : "";
        li.onclick = () => select({ feature: f });
        list.appendChild(li);
      });
      if (here.n_rest) {
        const li = document.createElement("li");
        li.textContent = `… ${here.n_rest} more, summed: ${here.rest >= 0 ? "+" : ""}${here.rest.toFixed(4)}`;
        list.appendChild(li);
      }
      const info = chosen === null ? null : F.features[String(chosen)];
      const strip = $("sae-strip");
      strip.innerHTML = "";
      if (!info) {
        $("sae-feature-title").textContent = chosen === null ? `no feature is active at position ${p}`
          : `F${chosen} is not among the features this page keeps`;
        $("sae-strip-legend").textContent = "";
        $("sae-top").innerHTML = $("sae-bottom").innerHTML = "";
        return;
      }
      const act = new Array(P).fill(0);
      for (const [q, v] of info.activation) act[q] = v;
      const top = Math.max(...act);
      $("sae-feature-title").textContent = `F${chosen}: its activation at every position, and the logits it moves`;
      D.tokens.forEach((t, q) => {
        const span = document.createElement("span");
        span.className = "tok" + (q === p ? " selected" : "");
        span.textContent = visible(t);
        span.dataset.pos = q; span.dataset.value = act[q];
        if (act[q] > 0) span.style.background = css(ramp(act[q] / top));
        if (act[q] / top > 0.6) span.style.color = "#fff";
        span.title = `position ${q} ${show(t)}: F${chosen} = ${act[q].toPrecision(6)}`;
        span.onclick = () => select({ pos: q });
        strip.appendChild(span);
      });
      $("sae-strip-legend").textContent = `F${chosen}'s activation per position: white 0 → blue ${top.toPrecision(4)} ` +
        `(its largest here); active at ${info.activation.length} of ${P} positions`;
      const big = Math.max(...info.top.values.map(Math.abs), ...info.bottom.values.map(Math.abs)) || 1;
      logitBars($("sae-top"), info.top, big, "#2e7d32");
      logitBars($("sae-bottom"), info.bottom, big, "#c62828");
    });
  }

  // Each part a bar from the running total to the running total + its value; the last bar the logit;
  // the bar named highlight (default: the selected head's or layer's) orange; pick(label) on a click.
  function waterfall(canvas, parts, logit, highlight, pick) {
    const n = parts.length + 1, W = 1000, padL = 50;
    const padB = 70, H = 240 + padB;
    const barW = Math.max(1, Math.floor((W - padL) / n));
    canvas.width = padL + barW * n; canvas.height = H;
    const ctx = canvas.getContext("2d");
    const spans = [];
    let total = 0;
    for (const [label, v] of parts) { spans.push([label, total, total + v, v]); total += v; }
    spans.push(["logit", 0, logit, logit]);
    const lo = Math.min(0, ...spans.map((s) => Math.min(s[1], s[2]))), hi = Math.max(0, ...spans.map((s) => Math.max(s[1], s[2])));
    const y = (v) => (H - padB) - (v - lo) / ((hi - lo) || 1) * (H - padB - 10);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, H);
    ctx.strokeStyle = "#999"; ctx.beginPath(); ctx.moveTo(padL, y(0)); ctx.lineTo(canvas.width, y(0)); ctx.stroke();
    ctx.fillStyle = "#444"; ctx.font = "10px sans-serif";
    ctx.fillText(hi.toFixed(2), 2, y(hi) + 8); ctx.fillText(lo.toFixed(2), 2, y(lo));
    if (Math.abs(y(0) - y(hi)) > 14 && Math.abs(y(0) - y(lo)) > 14) ctx.fillText("0", 2, y(0) + 3);
    const selected = highlight !== undefined ? highlight : state.attrBy === "head" ? `L${state.layer}H${state.head}` : `L${state.layer}.attn`;
    spans.forEach(([label, a, b, v], i) => {
      ctx.fillStyle = label === "logit" ? "#555" : label === selected ? "#e65100" : v >= 0 ? "#2e7d32" : "#c62828";
      ctx.fillRect(padL + i * barW, Math.min(y(a), y(b)), Math.max(1, barW - (barW > 3 ? 1 : 0)), Math.max(1, Math.abs(y(a) - y(b))));
    });
    {  // each bar's name under it, rotated 60°, thinned by collision
      ctx.fillStyle = "#444";
      const drawn = thin(spans.map((_, i) => i * barW), gapAt(60));
      canvas.dataset.drawnLabels = JSON.stringify(drawn);
      drawn.map((i) => [spans[i], i]).forEach(([[label], i]) => {
        ctx.save();
        ctx.translate(padL + i * barW + barW / 2 - 3, H - padB + 6);
        ctx.rotate(Math.PI / 3);
        ctx.fillText(label, 0, 0);
        ctx.restore();
      });
    }
    canvas.onmousemove = (e) => {
      const box = canvas.getBoundingClientRect();
      const i = Math.floor(((e.clientX - box.left) * canvas.width / box.width - padL) / barW);
      if (i < 0 || i >= spans.length) return tooltip(e, null);
      const [label, a, b, v] = spans[i];
      tooltip(e, label === "logit" ? `the model's logit: ${v.toPrecision(10)}`
        : `${label}: ${v >= 0 ? "+" : ""}${v.toPrecision(8)}  (running total ${a.toFixed(4)} → ${b.toFixed(4)})`);
    };
    canvas.onmouseleave = (e) => tooltip(e, null);
    canvas.onclick = pick ? (e) => {
      const box = canvas.getBoundingClientRect();
      const i = Math.floor(((e.clientX - box.left) * canvas.width / box.width - padL) / barW);
      if (i >= 0 && i < parts.length) pick(spans[i][0]);
    } : null;
    canvas.dataset.labels = JSON.stringify(spans.map((s) => s[0]));
    canvas.dataset.padL = padL; canvas.dataset.barW = barW;
  }

  // ---- steering -----------------------------------------------------------------------------
  const St = D.steering;
  if (!St) {
    $("steer-body").textContent = "No steering vector in this page (refgpt explore TEXT --plus P --minus M --layer L --coeff C …).";
  } else {
    const body = $("steer-body");
    const where = St.at_first_positions ? "ActAdd's first positions" : (St.positions.length > 1 ? "positions " : "position ") +
      St.positions.join(",");
    body.innerHTML = `<div class="controls"><label>coefficient <input type="range" id="steer-slider" min="0" ` +
      `max="${St.runs.length - 1}" step="1" value="0"></label> <b id="steer-coeff"></b>` +
      `<span class="legend">${escapeXml(show(St.plus))} − ${escapeXml(show(St.minus))} added at the stream entering block ${St.layer}, ` +
      `${where} (shaded)</span></div>` +
      `<div class="steer-grid"><div class="steer-wide"><h3>‖stream‖ per position, every stream of the steered run ` +
      `(the unsteered final stream dashed; one log axis for every coefficient)</h3><div id="steer-norms"></div></div>` +
      `<div><h3>KL(steered ‖ clean) of the next token, per position</h3>` +
      `<div id="steer-kl"></div></div><div><h3>next token at the selected position</h3><div class="steer-grid">` +
      `<div><b>without</b><div id="steer-clean" class="bars"></div></div><div><b>with</b>` +
      `<div id="steer-next" class="bars"></div></div></div></div><div class="steer-wide"><h3 id="steer-lens-title"></h3>` +
      `<canvas id="steer-lens"></canvas></div><div class="steer-wide"><h3 id="steer-kl-title"></h3>` +
      `<canvas id="steer-kl-map"></canvas></div></div>` +
      `<div id="steer-reads"><h3 id="steer-ln1-title"></h3><p id="steer-ln1-summary" class="legend"></p>` +
      `<div id="steer-ln1"></div>` +
      `<h3 id="steer-attn-title"></h3><div class="steer-grid"><div><canvas id="steer-attn-tv">` +
      `</canvas></div><div><p id="steer-attn-head" class="legend"></p><canvas id="steer-attn"></canvas></div></div></div>`;
    $("steer-slider").oninput = () => select({ steer: Number($("steer-slider").value) });
    const every = [St.clean, ...St.runs].flatMap((r) => r.resid_norm.flat());
    const normRange = [Math.min(...every), Math.max(...every)];  // fixed across coefficients: sizes compare
    views.push(() => {
      const run = St.runs[state.steer], clean = St.clean;
      $("steer-coeff").textContent = `C = ${run.coeff} · C·‖Δ‖/‖stream‖ = ` +
        run.size_ratio.map((r, i) => `${sci(r)} at ${St.positions[i]}`).join(", ");
      streamsChart($("steer-norms"), run, clean, normRange);
      lines($("steer-kl"), [run.kl], ["#1f5fa8"], "nats", false);
      bars($("steer-clean"), clean.next_token[state.pos], clean.next_prob[state.pos]);
      bars($("steer-next"), run.next_token[state.pos], run.next_prob[state.pos]);
      const tuned = state.lensKind === "tuned" && run.tuned_top_prob;  // the lens switch above chooses
      const lens = tuned ? { top_prob: run.tuned_top_prob, top_token: run.tuned_top_token }
                         : { top_prob: run.lens_top_prob, top_token: run.lens_top_token };
      const kind = tuned ? "tuned lens" : "logit lens";
      $("steer-lens-title").textContent = `${kind} of the steered run, C = ${run.coeff}: top token and its probability ` +
        `(the lens switch above chooses the lens)`;
      const cellW = Math.max(3, Math.min(48, Math.floor(1000 / P))), cellH = cellW >= 28 ? 18 : Math.max(6, Math.min(14, Math.floor(200 / S)));
      const canvas = $("steer-lens");
      canvas.dataset.kind = kind;
      heatmap(canvas, { rows: S, cols: P, cellW, cellH, colour: (r, p) => ramp(lens.top_prob[S - 1 - r][p]),
        hover: (r, p) => `${kind}, steered, C = ${run.coeff} · stream ${D.lens.streams[S - 1 - r]} · position ${p} ` +
          `${show(D.tokens[p])}\ntop ${show(lens.top_token[S - 1 - r][p])} p=${fmt(lens.top_prob[S - 1 - r][p])}`,
        label: cellW >= 28 ? (r, p) => visible(lens.top_token[S - 1 - r][p]) : null,
        click: (r, p) => select({ pos: p }), rowLabel: (r) => D.lens.streams[S - 1 - r], colLabel: tokenLabel });
      for (const q of St.positions) outline(canvas, q * cellW, 0, cellW, S * cellH, "#c62828");
      const key = tuned ? "tuned_kl_to_largest" : "logit_kl_to_largest";  // one colour scale for every coefficient
      const top = Math.max(1e-12, ...St.runs.flatMap((r) => r[key].flat()));
      const largest = St.runs.reduce((a, r) => Math.abs(r.coeff) > Math.abs(a.coeff) ? r : a).coeff;
      $("steer-kl-title").textContent = `KL(${kind} at C = ${run.coeff} ‖ ${kind} at the largest C = ${largest}) per stream ` +
        "and position: it fades as C grows";
      const klMap = $("steer-kl-map");
      heatmap(klMap, { rows: S, cols: P, cellW, cellH: Math.min(cellH, 14),
        colour: (r, p) => ramp(run[key][S - 1 - r][p] / top),
        hover: (r, p) => `KL(${kind}, C = ${run.coeff} ‖ C = ${largest}) · stream ${D.lens.streams[S - 1 - r]} · position ${p} ` +
          `${show(D.tokens[p])}: ${sci(run[key][S - 1 - r][p])} nats`,
        click: (r, p) => select({ pos: p }), rowLabel: (r) => D.lens.streams[S - 1 - r], colLabel: tokenLabel });
      colourBar(klMap, (t) => ramp(t), 0, top, "nats (the largest over every coefficient)");
      whatAttentionReads(run, largest);
    });
    // Only the normalised x moves: ln1's output at a steered position, and the steered run's attention,
    // against the largest coefficient's (the stream itself keeps growing with C).
    function whatAttentionReads(run, largest) {
      const q = St.positions.includes(state.pos) ? state.pos : St.positions[0], i = St.positions.indexOf(q);
      const ref = St.runs.find((r) => r.coeff === largest);
      $("steer-ln1-title").textContent = `what block ${St.layer}'s attention reads at position ${q} ` +
        `${show(D.tokens[q])}: ln1's output γ ⊙ (x − mean)/σ + β, per component (select another shaded position to see it)`;
      const summary = $("steer-ln1-summary");
      summary.textContent = `C = ${run.coeff}: the stream x entering block ${St.layer} differs from the largest C's by ` +
        `‖x − x(${largest})‖/‖x(${largest})‖ = ${run.resid_change[i].toPrecision(6)}; ln1's output by ` +
        `‖ln1 − ln1(${largest})‖/‖ln1(${largest})‖ = ${run.ln1_change[i].toPrecision(6)}`;
      Object.assign(summary.dataset, { pos: q, resid: run.resid_change[i], ln1: run.ln1_change[i] });
      const series = [St.clean.ln1_out[i], ref.ln1_out[i], run.ln1_out[i]];
      const W = 1000, H = 200, padL = 50, n = series[0].length, flat = series.flat();
      const lo = Math.min(...flat), hi = Math.max(...flat), span = (hi - lo) || 1;
      const x = (k) => padL + k * (W - padL - 4) / Math.max(1, n - 1), y = (v) => 8 + (hi - v) / span * (H - 36);
      const line = (v, colour, dash, name) => `<polyline points="${v.map((u, k) => `${x(k).toFixed(1)},${y(u).toFixed(1)}`).join(" ")}" ` +
        `fill="none" stroke="${colour}" stroke-width="1.2"${dash ? ' stroke-dasharray="4,3"' : ""} data-run="${name}"/>`;
      const box = $("steer-ln1");
      box.innerHTML = `<svg width="${W}" height="${H}" id="steer-ln1-svg">` +
        [lo, 0, hi].map((v) => `<line x1="${padL}" x2="${W}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>` +
          `<text x="${padL - 4}" y="${y(v) + 4}" text-anchor="end">${v.toFixed(2)}</text>`).join("") +
        line(series[0], "#999", false, "clean") + line(series[2], "#1f5fa8", false, "C") + line(series[1], "#c62828", true, "largest") +
        `<text x="${padL}" y="${H - 6}">component 0 … ${n - 1} of d_model · grey: no vector · blue: C = ${run.coeff} · ` +
        `red dashed: C = ${largest} · hover for the values</text></svg>`;
      const svg = box.firstChild;
      svg.onmousemove = (e) => {
        const b = svg.getBoundingClientRect(), k = Math.round((e.clientX - b.left - padL) / ((W - padL - 4) / Math.max(1, n - 1)));
        if (k < 0 || k >= n) return tooltip(e, null);
        tooltip(e, `ln1 out[${k}] at position ${q}: no vector ${sci(series[0][k])} · C = ${run.coeff}: ${sci(series[2][k])} · ` +
          `C = ${largest}: ${sci(series[1][k])}`);
      };
      svg.onmouseleave = (e) => tooltip(e, null);
      // attention: per layer and head, how far the steered pattern still is from the largest C's; the selected head drawn
      const Ls = St.pattern_layers, H2 = D.heads.length;
      $("steer-attn-title").textContent = `attention of the steered run, C = ${run.coeff}: per layer (from block ${St.layer}) and ` +
        `head, max over queries of ½Σ|A(C) − A(${largest})|, on 0 … 1 (click a head); right: the selected head`;
      const tv = $("steer-attn-tv");
      heatmap(tv, { rows: Ls.length, cols: H2, cellW: 36, cellH: 22, colour: (r, h) => ramp(run.pattern_tv[r][h]),
        label: (r, h) => run.pattern_tv[r][h].toFixed(3),
        hover: (r, h) => `L${Ls[r]}H${D.heads[h]}, C = ${run.coeff}: max over queries of ½Σ_k|A(C) − A(${largest})| = ` +
          `${sci(run.pattern_tv[r][h])}`,
        click: (r, h) => select({ layer: Ls[r], head: D.heads[h] }), rowLabel: (r) => `L${Ls[r]}`, colLabel: (h) => `H${D.heads[h]}`, left: 40 });
      colourBar(tv, (t) => ramp(t), 0, 1, "½Σ|A(C) − A(largest)|");
      const li = Ls.indexOf(state.layer), hi2 = D.heads.indexOf(state.head), head = $("steer-attn");
      if (li < 0 || hi2 < 0) {
        $("steer-attn-head").textContent = state.layer < St.layer ? `L${state.layer} reads the stream before the vector ` +
          `is added: its attention is the unsteered one (above)` : `L${state.layer}H${state.head} is not in this page`;
        head.width = head.height = 0;
        return;
      }
      const steered = decodePattern(run.pattern[li][hi2]), pli = D.layers.indexOf(state.layer);
      const w = (q2, k) => k <= q2 ? steered[q2 * (q2 + 1) / 2 + k] * D.pattern_unit : 0;
      $("steer-attn-head").textContent = `L${state.layer}H${state.head} of the steered run, C = ${run.coeff} (hover: the weight ` +
        `with and without the vector)`;
      const cell = Math.max(2, Math.min(16, Math.floor(420 / P)));
      heatmap(head, { rows: P, cols: P, cellW: cell, cellH: cell, colour: (q2, k) => attnColour(w(q2, k)),
        hover: (q2, k) => `L${state.layer}H${state.head} · query ${q2} ${show(D.tokens[q2])} → key ${k} ${show(D.tokens[k])}: ` +
          (k <= q2 ? `C = ${run.coeff}: ${fmt(w(q2, k), 3)} · no vector: ${fmt(weight(pli, hi2, q2, k), 3)}` : "masked (0)"),
        click: (q2) => select({ pos: q2 }), rowLabel: tokenLabel, colLabel: tokenLabel, left: 90 });
      for (const s2 of St.positions) outline(head, s2 * cell, 0, cell, P * cell, "#c62828");
    }
  }
  // Every stream's norm against position on one fixed log axis, the steered positions shaded, tokens below;
  // hover a position for every stream's value there.
  function streamsChart(box, run, clean, range) {
    const W = 1000, H = 260, padL = 60, padB = 56, names = D.resid_norm.streams, n = names.length;
    const lo = Math.log10(Math.max(range[0], 1e-300)), hi = Math.log10(Math.max(range[1], 1e-300)), span = (hi - lo) || 1;
    const x = (i) => padL + (i + 0.5) * (W - padL) / P;
    const y = (v) => 24 + (hi - Math.log10(Math.max(v, 1e-300))) / span * (H - padB - 24);
    const colour = (k) => { const c = ramp(0.25 + 0.75 * k / Math.max(1, n - 1)); return css(c); };
    const path = (values) => values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    const labelled = thin(Array.from({ length: P }, (_, i) => x(i)), gapAt(45));  // labels thinned by collision
    const decades = [];
    for (let e = Math.ceil(lo); e <= Math.floor(hi); e += Math.max(1, Math.ceil((hi - lo) / 6))) decades.push(e);
    box.innerHTML = `<svg width="${W}" height="${H}" id="steer-norms-svg" data-lo="${range[0]}" data-hi="${range[1]}">` +
      St.positions.map((q) => `<rect x="${x(q) - (W - padL) / P / 2}" y="20" width="${(W - padL) / P}" height="${H - padB - 18}" ` +
        `fill="#c62828" fill-opacity="0.12" class="steered"/>`).join("") +
      decades.map((e) => `<line x1="${padL}" x2="${W}" y1="${y(10 ** e)}" y2="${y(10 ** e)}" stroke="#eee"/>` +
        `<text x="${padL - 4}" y="${y(10 ** e) + 4}" text-anchor="end">1e${e}</text>`).join("") +
      names.map((name, k) => `<polyline points="${path(run.resid_norm[k])}" fill="none" stroke="${colour(k)}" ` +
        `stroke-width="1.4" data-stream="${name}"/>`).join("") +
      `<polyline points="${path(clean.resid_norm[n - 1])}" fill="none" stroke="#555" stroke-dasharray="5,4" stroke-width="1.2"/>` +
      `<line x1="${x(state.pos)}" x2="${x(state.pos)}" y1="6" y2="${H - padB}" stroke="#ffb300"/>` +
      labelled.map((i) =>
        `<text transform="translate(${x(i) - 3},${H - padB + 10}) rotate(45)">${escapeXml(tokenLabel(i).slice(0, 10))}</text>`).join("") +
      `<text x="${padL}" y="12">lightest: stream ${names[0]} … darkest: ${names[n - 1]}; dashed: unsteered final</text></svg>`;
    const svg = box.firstChild;
    svg.onmousemove = (e) => {
      const b = svg.getBoundingClientRect(), i = Math.floor((e.clientX - b.left - padL) / ((W - padL) / P));
      if (i < 0 || i >= P) return tooltip(e, null);
      tooltip(e, `position ${i} ${show(D.tokens[i])}, C = ${run.coeff}\n` +
        names.map((name, k) => `${name.padEnd(11)} ${sci(run.resid_norm[k][i])}`).join("\n") +
        `\nunsteered final ${sci(clean.resid_norm[n - 1][i])}`);
    };
    svg.onmouseleave = (e) => tooltip(e, null);
    svg.onclick = (e) => {
      const b = svg.getBoundingClientRect(), i = Math.floor((e.clientX - b.left - padL) / ((W - padL) / P));
      if (i >= 0 && i < P) select({ pos: i });
    };
  }
  function escapeXml(t) { return t.replace(/[<>&"]/g, (c) => ({ "<": "&lt;", ">": "&gt;", "&": "&amp;", '"': "&quot;" })[c]); }
  function lines(box, series, colours, title, log) {  // one value per position: tokens below, hover for the values
    const W = 460, H = 200, pad = 60, padB = 56;
    const f = log ? (v) => Math.log10(Math.max(v, 1e-300)) : (v) => v;
    const all = series.flat().map(f), lo = Math.min(...all), hi = Math.max(...all), span = hi - lo || 1;
    const x = (i) => pad + i * (W - pad - 6) / Math.max(1, P - 1);
    const y = (v) => H - padB - (f(v) - lo) / span * (H - padB - 16);
    box.innerHTML = `<svg width="${W}" height="${H}"><text x="${pad}" y="10">${title}</text>` +
      series.map((s, k) => `<polyline points="${s.map((v, i) => `${x(i)},${y(v)}`).join(" ")}" fill="none" ` +
        `stroke="${colours[k]}" stroke-width="1.5"/>`).join("") +
      `<line x1="${x(state.pos)}" x2="${x(state.pos)}" y1="14" y2="${H - padB}" stroke="#ffb300"/>` +
      `<line x1="${pad}" x2="${W - 6}" y1="${H - padB}" y2="${H - padB}" stroke="#999"/>` +
      `<text x="${pad - 4}" y="${y(log ? 10 ** hi : hi) + 4}" text-anchor="end">${sci(log ? 10 ** hi : hi)}</text>` +
      `<text x="${pad - 4}" y="${y(log ? 10 ** lo : lo)}" text-anchor="end">${sci(log ? 10 ** lo : lo)}</text>` +
      thin(Array.from({ length: P }, (_, i) => x(i)), gapAt(45)).map((i) =>
        `<text transform="translate(${x(i) - 3},${H - padB + 10}) rotate(45)">${escapeXml(tokenLabel(i).slice(0, 10))}</text>`).join("") +
      `</svg>`;
    const svg = box.firstChild;
    svg.onmousemove = (e) => {
      const b = svg.getBoundingClientRect(), i = Math.round((e.clientX - b.left - pad) / ((W - pad - 6) / Math.max(1, P - 1)));
      if (i < 0 || i >= P) return tooltip(e, null);
      tooltip(e, `position ${i} ${show(D.tokens[i])}: ` + series.map((s) => `${sci(s[i])} ${title}`).join(", "));
    };
    svg.onmouseleave = (e) => tooltip(e, null);
    svg.onclick = (e) => {
      const b = svg.getBoundingClientRect(), i = Math.round((e.clientX - b.left - pad) / ((W - pad - 6) / Math.max(1, P - 1)));
      if (i >= 0 && i < P) select({ pos: i });
    };
  }
  function bars(box, tokens, probs) {
    box.innerHTML = "";
    tokens.forEach((t, i) => {
      const row = document.createElement("div");
      row.className = "bar-row";
      row.innerHTML = `<span class="name"></span><span class="bar" style="width:${Math.round(probs[i] * 160)}px"></span>` +
        `<span class="p">${fmt(probs[i])}</span>`;
      row.firstChild.textContent = show(t);
      box.appendChild(row);
    });
  }

  function applyFragment() {  // the controls show what the fragment chose
    const shared = fromFragment();
    if (shared.lensKind) $(`lens-kind-${shared.lensKind}`).checked = true;
    if (shared.lensMetric) $("lens-metric").value = shared.lensMetric;
    if (shared.lnView) $("ln-view").value = shared.lnView;
    if (shared.attrBy) $(`attr-by-${shared.attrBy}`).checked = true;
    if (shared.attrTarget) $(`attr-target-${shared.attrTarget}`).checked = true;
    if (shared.paint) $("paint").value = shared.paint;
    if (shared.steer !== undefined && $("steer-slider")) $("steer-slider").value = shared.steer;
    select(shared);
  }
  window.addEventListener("hashchange", applyFragment);  // a shared link opened in a tab that shows the page
  applyFragment();
  window.refgptExplorer = { data: D, state, select, visible, readyAt: performance.now() };  // for tests and the curious
  document.body.dataset.ready = "1";
})();
