// refgpt explorer: draws the views of one forward pass from the page's JSON document
// (#refgpt-data, schema in docs/explorer.md). Plain DOM, canvas and SVG; no library, no network.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("refgpt-data").textContent);
  const P = D.tokens.length;
  const state = { pos: P - 1, layer: D.steering ? D.steering.layer : D.layers[0], head: D.heads[0], lensKind: "logit", lensMetric: "top_prob",
                  lnView: "scale", attrBy: "layer", steer: 0 };
  const $ = (id) => document.getElementById(id);
  const tip = $("tooltip");
  const show = (s) => JSON.stringify(s);  // a token as a quoted string: spaces and newlines visible
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
    if (o.rowLabel && o.cellH >= 8) {
      ctx.textAlign = "right";
      for (let r = 0; r < o.rows; r++) ctx.fillText(o.rowLabel(r).slice(0, Math.floor(left / 6.2)), left - 4, r * o.cellH + o.cellH / 2);
      ctx.textAlign = "left";
    }
    if (o.colLabel) {  // every column if there is room, else every k-th
      const every = Math.max(1, Math.ceil(12 / o.cellW));
      ctx.save();
      for (let c = 0; c < o.cols; c += every) {
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
  const tokenLabel = (p) => `${p} ${D.tokens[p]}`;

  function outline(canvas, x, y, w, h, colour) {  // x measured from the cells' left edge
    const ctx = canvas.getContext("2d");
    x += Number(canvas.dataset.left || 0);
    ctx.strokeStyle = colour || "#e65100";
    ctx.lineWidth = 2;
    ctx.strokeRect(x + 1, y + 1, w - 2, h - 2);
  }

  // ---- the selection ----------------------------------------------------------------------
  const views = [];
  function select(changes) {
    Object.assign(state, changes);
    for (const view of views) view();
  }

  // ---- header and tokens --------------------------------------------------------------------
  const m = D.model;
  $("summary").textContent = `${P} tokens · ${m.n_layers} layers × ${m.n_heads} heads · d_model ${m.d_model} · ` +
    `${m.dtype} · target ${show(D.target.token)} (id ${D.target.id})` + (m.source ? ` · ${m.source}` : "");
  const tokenBox = $("tokens");
  D.tokens.forEach((t, i) => {
    const span = document.createElement("span");
    span.className = "tok";
    span.textContent = t;
    span.title = `position ${i}, id ${D.token_ids[i]}`;
    span.dataset.pos = i;
    span.onclick = () => select({ pos: i });
    tokenBox.appendChild(span);
  });
  views.push(() => {
    for (const span of tokenBox.children) span.classList.toggle("selected", Number(span.dataset.pos) === state.pos);
    $("selection").textContent = `selected: position ${state.pos} ${show(D.tokens[state.pos])} · layer ${state.layer}` +
      ` · head ${state.head}`;
  });

  // ---- attention ----------------------------------------------------------------------------
  const attnColour = (w) => ramp(Math.sqrt(w));  // √: the small weights of long rows stay visible
  const weight = (li, hi, q, k) => k <= q ? D.pattern[li][hi][q][k] * D.pattern_unit : 0;
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
    const labels = cell >= 8 ? tokenLabel : null;
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
      `target ${show(D.target.token)}: rank ${lens.target_rank[s][p]}, p=${fmt(lens.target_prob[s][p])}`;
  }
  function drawLens(canvas, lens, kind, metric) {
    const cellW = Math.max(3, Math.min(48, Math.floor(1000 / P)));
    const rows = S, cellH = cellW >= 28 ? 18 : Math.max(8, Math.min(18, Math.floor(360 / S)));
    const r2s = (r) => S - 1 - r;  // the final stream on top
    heatmap(canvas, { rows, cols: P, cellW, cellH, colour: (r, p) => lensColour(lens, metric, r2s(r), p),
                      hover: (r, p) => lensText(kind, lens, r2s(r), p),
                      click: (r, p) => select({ pos: p, layer: streamLayer(r2s(r)) }),
                      label: cellW >= 28 ? (r, p) => lens.top_token[r2s(r)][p] : null,
                      rowLabel: (r) => D.lens.streams[r2s(r)], colLabel: tokenLabel });
    outline(canvas, state.pos * cellW, 0, cellW, rows * cellH);
  }
  views.push(() => {
    const kind = state.lensKind === "tuned" && D.lens.tuned ? "tuned" : "logit";
    drawLens($("lens-canvas"), D.lens[kind], kind, state.lensMetric);
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
      (names.length <= 40 ? names.map((n, i) => `<text transform="translate(${x(i) - 3},${H - 72}) rotate(45)">${n}</text>`).join("") : "") +
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
  function components() {
    const parts = new Map();
    A.labels.forEach((label, i) => {
      const key = state.attrBy === "head" ? label : layerOf(label);
      parts.set(key, (parts.get(key) || 0) + A.values[i][state.pos]);
    });
    return [...parts.entries()];
  }
  views.push(() => {
    const parts = components();
    let sum = 0;
    for (const v of A.values) sum += v[state.pos];  // every component, summed here on the page
    const logit = A.logit[state.pos], error = Math.abs(sum - logit);
    const summary = $("attr-summary");
    summary.textContent = `logit of ${show(D.target.token)} at position ${state.pos} ${show(D.tokens[state.pos])}: ` +
      `${logit.toPrecision(10)}; Σ of ${A.labels.length} components = ${sum.toPrecision(10)} ` +
      `(|Σ − logit| = ${error.toExponential(2)})`;
    summary.dataset.sum = sum; summary.dataset.logit = logit;
    const ok = error <= 1e-9 * Math.max(1, Math.abs(logit));
    summary.className = ok ? "ok" : "bad";
    waterfall($("attr-canvas"), parts, logit);
    const top = [...parts].sort((a, b) => Math.abs(b[1]) - Math.abs(a[1])).slice(0, 12);
    $("attr-top").innerHTML = "";
    for (const [label, v] of top) {
      const li = document.createElement("li");
      li.textContent = `${label.padEnd(12)} ${v >= 0 ? "+" : ""}${v.toFixed(4)}`;
      $("attr-top").appendChild(li);
    }
  });

  // Each part a bar from the running total to the running total + its value; the last bar the logit.
  function waterfall(canvas, parts, logit) {
    const n = parts.length + 1, W = 1000, padL = 50;
    const barW0 = Math.max(1, Math.floor((W - padL) / n)), padB = barW0 >= 12 ? 70 : 20, H = 240 + padB;
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
    const selected = state.attrBy === "head" ? `L${state.layer}H${state.head}` : `L${state.layer}.attn`;
    spans.forEach(([label, a, b, v], i) => {
      ctx.fillStyle = label === "logit" ? "#555" : label === selected ? "#e65100" : v >= 0 ? "#2e7d32" : "#c62828";
      ctx.fillRect(padL + i * barW, Math.min(y(a), y(b)), Math.max(1, barW - (barW > 3 ? 1 : 0)), Math.max(1, Math.abs(y(a) - y(b))));
    });
    if (barW >= 12) {  // each bar's name under it, when there is room
      ctx.fillStyle = "#444";
      spans.forEach(([label], i) => {
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
  }

  // ---- steering -----------------------------------------------------------------------------
  const St = D.steering;
  if (!St) {
    $("steer-body").textContent = "No steering vector in this page (refgpt explore TEXT --plus P --minus M --layer L --coeff C …).";
  } else {
    const body = $("steer-body");
    body.innerHTML = `<div class="controls"><label>coefficient <input type="range" id="steer-slider" min="0" ` +
      `max="${St.runs.length - 1}" step="1" value="0"></label> <b id="steer-coeff"></b>` +
      `<span class="legend">ActAdd of ${show(St.plus)} − ${show(St.minus)} at the stream entering block ${St.layer}</span></div>` +
      `<div class="steer-grid"><div><h3>‖stream‖ per position, without (grey) and with the vector (orange)</h3>` +
      `<div id="steer-norms"></div></div><div><h3>KL(steered ‖ clean) of the next token, per position</h3>` +
      `<div id="steer-kl"></div></div><div><h3>next token at the selected position</h3><div class="steer-grid">` +
      `<div><b>without</b><div id="steer-clean" class="bars"></div></div><div><b>with</b>` +
      `<div id="steer-next" class="bars"></div></div></div></div><div><h3>lens, steered: top token's probability</h3>` +
      `<canvas id="steer-lens"></canvas></div></div>`;
    $("steer-slider").oninput = () => select({ steer: Number($("steer-slider").value) });
    views.push(() => {
      const run = St.runs[state.steer], clean = St.clean;
      $("steer-coeff").textContent = `C = ${run.coeff}`;
      const stream = 2 * state.layer;  // resid_norm rows: 0_pre, 0_mid, 1_pre, …
      const label = D.resid_norm.streams[stream];
      lines($("steer-norms"), [clean.resid_norm[stream], run.resid_norm[stream]], ["#999", "#e65100"],
            `stream ${label} (select a layer to change it; log scale)`, true);
      lines($("steer-kl"), [run.kl], ["#1f5fa8"], "nats", false);
      bars($("steer-clean"), clean.next_token[state.pos], clean.next_prob[state.pos]);
      bars($("steer-next"), run.next_token[state.pos], run.next_prob[state.pos]);
      const lens = { top_prob: run.lens_top_prob, top_token: run.lens_top_token };
      const cellW = Math.max(3, Math.min(48, Math.floor(480 / P))), cellH = Math.max(6, Math.min(14, Math.floor(200 / S)));
      heatmap($("steer-lens"), { rows: S, cols: P, cellW, cellH, colour: (r, p) => ramp(lens.top_prob[S - 1 - r][p]),
        hover: (r, p) => `steered, C = ${run.coeff} · stream ${D.lens.streams[S - 1 - r]} · position ${p} ` +
          `${show(D.tokens[p])}\ntop ${show(lens.top_token[S - 1 - r][p])} p=${fmt(lens.top_prob[S - 1 - r][p])}`,
        click: (r, p) => select({ pos: p }), rowLabel: (r) => D.lens.streams[S - 1 - r], colLabel: tokenLabel });
    });
  }
  function lines(box, series, colours, title, log) {
    const W = 460, H = 150, pad = 36;
    const f = log ? (v) => Math.log10(Math.max(v, 1e-300)) : (v) => v;
    const all = series.flat().map(f), lo = Math.min(...all), hi = Math.max(...all), span = hi - lo || 1;
    const x = (i) => pad + i * (W - pad - 6) / Math.max(1, P - 1);
    const y = (v) => H - 16 - (f(v) - lo) / span * (H - 30);
    box.innerHTML = `<svg width="${W}" height="${H}"><text x="${pad}" y="10">${title}</text>` +
      series.map((s, k) => `<polyline points="${s.map((v, i) => `${x(i)},${y(v)}`).join(" ")}" fill="none" ` +
        `stroke="${colours[k]}" stroke-width="1.5"/>`).join("") +
      `<line x1="${x(state.pos)}" x2="${x(state.pos)}" y1="14" y2="${H - 16}" stroke="#ffb300"/>` +
      `<text x="0" y="${y(log ? 10 ** hi : hi) + 4}">${sci(log ? 10 ** hi : hi)}</text>` +
      `<text x="0" y="${y(log ? 10 ** lo : lo)}">${sci(log ? 10 ** lo : lo)}</text></svg>`;
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

  select({});
  window.refgptExplorer = { data: D, state, select, readyAt: performance.now() };  // for tests and the curious
  document.body.dataset.ready = "1";
})();
