// agentrl inspector: plain JS, no libraries. Talks to the JSON API of agentrl/inspector/app.py.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const state = {
    step: "", min: "", max: "", stop: "", task: "", offset: 0, limit: 50,
    episode: "", colorBy: "mask", extraKeys: [],
  };
  let current = null; // the episode shown
  let metricsData = null;

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => (
      { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    return String(Number(v.toPrecision(digits || 3)));
  }

  // An axis label with enough digits to tell the ends of [lo, hi] apart.
  function fmtAxis(v, lo, hi) {
    const span = Math.abs(hi - lo), mag = Math.max(Math.abs(lo), Math.abs(hi));
    const digits = span > 0 && mag > 0 ? Math.ceil(Math.log10(mag / span)) + 2 : 3;
    return fmt(v, Math.min(Math.max(digits, 3), 8));
  }

  function say(msg) { $("status").textContent = msg || ""; }

  async function api(path) {
    const r = await fetch(path);
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.detail || (r.status + " " + r.statusText));
    return body;
  }

  // ------------------------------------------------------------------ URL state

  function readUrl() {
    const q = new URLSearchParams(window.location.search);
    for (const k of ["step", "min", "max", "stop", "task", "episode"]) {
      if (q.has(k)) state[k] = q.get(k);
    }
    if (q.has("offset")) state.offset = Math.max(0, parseInt(q.get("offset"), 10) || 0);
    return q.has("step");
  }

  function writeUrl() {
    const q = new URLSearchParams();
    for (const k of ["step", "min", "max", "stop", "task", "episode"]) {
      if (state[k] !== "") q.set(k, state[k]);
    }
    if (state.step === "") q.set("step", "all");
    if (state.offset) q.set("offset", state.offset);
    window.history.replaceState(null, "", "?" + q.toString());
  }

  // ------------------------------------------------------------------ charts

  function range(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
    return [lo, hi];
  }

  function chart(key, ser, flags) {
    const W = 290, H = 130, L = 58, R = 10, T = 18, B = 20;
    const pts = ser.train.concat(ser.eval);
    if (!pts.length) return "";
    let [x0, x1] = range(pts.map((p) => p[0]));
    let [y0, y1] = range(pts.map((p) => p[1]));
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const sx = (x) => (L + (x - x0) / (x1 - x0) * (W - L - R)).toFixed(1);
    const sy = (y) => (H - B - (y - y0) / (y1 - y0) * (H - T - B)).toFixed(1);
    let s = `<svg class="chart" data-key="${esc(key)}" width="${W}" height="${H}" ` +
      `viewBox="0 0 ${W} ${H}" xmlns="http://www.w3.org/2000/svg">`;
    s += `<text class="title" x="${L}" y="12">${esc(key)}</text>`;
    s += `<rect class="frame" x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}"/>`;
    s += `<text class="axis" x="${L - 4}" y="${T + 8}" text-anchor="end">${fmtAxis(y1, y0, y1)}</text>`;
    s += `<text class="axis" x="${L - 4}" y="${H - B}" text-anchor="end">${fmtAxis(y0, y0, y1)}</text>`;
    s += `<text class="axis" x="${L}" y="${H - 6}">step ${fmt(x0)}</text>`;
    s += `<text class="axis" x="${W - R}" y="${H - 6}" text-anchor="end">${fmt(x1)}</text>`;
    for (const f of flags) {
      if (f.keys.includes(key) && f.step >= x0 && f.step <= x1) {
        s += `<line class="flag" x1="${sx(f.step)}" x2="${sx(f.step)}" y1="${T}" y2="${H - B}">` +
          `<title>${esc(f.name)} from step ${f.step}</title></line>`;
      }
    }
    const train = ser.train.slice().sort((a, b) => a[0] - b[0]);
    if (train.length > 1) {
      s += `<polyline class="line" points="${train.map((p) => sx(p[0]) + "," + sy(p[1])).join(" ")}"/>`;
    }
    const dot = (p, cls) => `<circle class="pt ${cls}" data-step="${p[0]}" cx="${sx(p[0])}" ` +
      `cy="${sy(p[1])}" r="${pts.length > 200 ? 1.5 : 3}"><title>${cls} step ${p[0]}: ` +
      `${fmt(p[1], 4)}</title></circle>`;
    s += train.map((p) => dot(p, "train")).join("") + ser.eval.map((p) => dot(p, "eval")).join("");
    return s + "</svg>";
  }

  async function loadMetrics() {
    const keys = metricsData ? metricsData.dashboard.concat(state.extraKeys) : [];
    const d = await api("/api/metrics" + (keys.length ? "?keys=" + encodeURIComponent(keys.join(",")) : ""));
    if (!metricsData) metricsData = d;
    metricsData.series = d.series;
    const shown = Object.keys(d.series);
    const html = shown.map((k) => chart(k, d.series[k], d.flags)).join("");
    $("charts").innerHTML = html || '<p class="muted">no metrics.jsonl rows yet</p>';
    $("flags").innerHTML = d.flags.map((f) =>
      `<li>red flag <b>${esc(f.name)}</b> from step ${f.step}: ${esc(f.detail)}</li>`).join("");
    $("metric-add").innerHTML = '<option value="">+ add a metric…</option>' + d.keys
      .filter((k) => !shown.includes(k)).map((k) => `<option>${esc(k)}</option>`).join("");
  }

  // ------------------------------------------------------------------ episode list

  function readForm() {
    state.step = $("f-step").value;
    state.min = $("f-min").value.trim();
    state.max = $("f-max").value.trim();
    state.stop = $("f-stop").value;
    state.task = $("f-task").value.trim();
  }

  function writeForm() {
    $("f-step").value = state.step;
    $("f-min").value = state.min;
    $("f-max").value = state.max;
    $("f-stop").value = state.stop;
    $("f-task").value = state.task;
  }

  async function loadEpisodes() {
    const q = new URLSearchParams();
    if (state.step !== "") q.set("step", state.step);
    if (state.min !== "") q.set("min_reward", state.min);
    if (state.max !== "") q.set("max_reward", state.max);
    if (state.stop !== "") q.set("stop", state.stop);
    if (state.task !== "") q.set("task", state.task);
    q.set("offset", state.offset);
    q.set("limit", state.limit);
    writeUrl();
    const d = await api("/api/episodes?" + q.toString());
    const rows = d.episodes.map((e) =>
      `<tr data-id="${esc(e.id)}" data-stop="${esc(e.stop_reason)}" data-reward="${e.reward}"` +
      `${e.id === state.episode ? ' class="selected"' : ""}><td>${e.step}</td><td>${e.index}</td>` +
      `<td class="task" title="${esc(e.task_id)}">${esc(e.task_id)}</td><td>${fmt(e.reward)}</td>` +
      `<td>${esc(e.stop_reason)}${e.error ? " ⚠" : ""}</td><td>${e.num_turns}</td>` +
      `<td title="model tokens / all tokens">${e.num_model_tokens}/${e.num_tokens}</td></tr>`);
    $("episodes").tBodies[0].innerHTML = rows.join("") ||
      '<tr><td colspan="7" class="muted">no episode matches</td></tr>';
    const end = d.offset + d.episodes.length;
    $("page-info").textContent = `${d.total ? d.offset + 1 : 0}–${end} of ${d.total}`;
    $("prev").disabled = d.offset === 0;
    $("next").disabled = end >= d.total;
    document.body.dataset.listed = String(d.total);
    if (!state.episode && d.episodes.length) await showEpisode(d.episodes[0].id);
  }

  // ------------------------------------------------------------------ one episode

  function renderTokens(ep) {
    const t = ep.tokens, n = t.ids.length;
    const before = new Map(), after = new Map();
    const add = (m, i, html) => m.set(i, (m.get(i) || "") + html);
    const kind = new Array(n).fill("prompt");
    for (const s of ep.spans) {
      for (let i = s.start; i < s.end && i < n; i++) kind[i] = s.kind;
      if (s.kind === "model" && s.end > s.start) {
        add(before, s.start, `<span class="turn-mark">turn ${s.turn + 1}</span>`);
        add(after, s.end - 1, `<span class="reward-mark${s.reward < 0 ? " neg" : ""}" ` +
          `title="reward of turn ${s.turn + 1}">r=${fmt(s.reward)}</span>`);
      }
    }
    if (ep.samples.length > 1) {
      ep.samples.forEach((s, k) => add(before, s[0],
        `<span class="sample-mark" title="training sample ${k + 1}: tokens ${s[0]}–${s[1] - 1}">` +
        `sample ${k + 1}</span>`));
    }
    const out = [];
    for (let i = 0; i < n; i++) {
      out.push(before.get(i) || "");
      const m = t.loss_mask[i], lp = t.rollout_logprobs[i];
      let cls = "tok m" + m + (kind[i] === "observation" ? " obs" : "");
      let style = "";
      let title = `#${i} id ${t.ids[i]} · loss mask ${m} · ${kind[i]}`;
      if (m === 1) {
        const p = lp === null ? null : Math.exp(lp);
        title += ` · rollout logprob ${fmt(lp, 4)} (p ${fmt(p, 3)}) · weights v${t.weight_versions[i]}`;
        if (state.colorBy === "logprob" && p !== null) {
          style = ` style="background:hsl(${Math.round(120 * p)},70%,78%)"`;
        }
      }
      const text = t.text ? t.text[i] : `⟨${t.ids[i]}⟩`;
      if (t.text && /^<\|.*\|>$|^<\/?[a-z_]+>$/.test(text)) cls += " special";
      out.push(`<span class="${cls}" data-i="${i}" title="${esc(title)}"${style}>${esc(text)}</span>`);
      out.push(after.get(i) || "");
    }
    return out.join("");
  }

  function renderEpisode(ep) {
    const kv = [
      ["task", ep.task_id], ["group", ep.group_id], ["reward", fmt(ep.reward, 4)],
      ["stop", ep.stop_reason], ["turns", ep.num_turns],
      ["tokens", `${ep.num_model_tokens} model / ${ep.num_tokens}`],
      ["prompt", ep.prompt_length + " tokens"],
      ["strategy", ep.strategy + (ep.samples.length > 1 ? ` (${ep.samples.length} samples)` : "")],
    ];
    let h = `<h2>Episode ${esc(ep.id)} <span class="muted">${esc(ep.episode_id)}</span></h2>`;
    h += '<div class="kv" id="episode-kv">' +
      kv.map(([k, v]) => `<span><b>${k}</b> <span data-k="${k}">${esc(v)}</span></span>`).join("") + "</div>";
    if (ep.error) h += `<pre class="error">${esc(ep.error)}</pre>`;
    if (ep.tree) h += '<div id="tree-view"><h3>Tree of group ' + esc(ep.group_id) +
      '</h3><p class="muted">loading…</p></div>';
    h += '<h3>Tokens <select id="color-by"><option value="mask">colour by loss mask</option>' +
      '<option value="logprob">colour by rollout probability</option></select></h3>';
    h += '<div class="legend"><span class="tok m1">model token (loss mask 1)</span>' +
      '<span class="tok m0">prompt (mask 0)</span><span class="tok m0 obs">tool / env (mask 0)</span>' +
      '<span class="turn-mark">turn</span><span class="reward-mark">turn reward</span>' +
      (ep.samples.length > 1 ? '<span class="sample-mark">sample start</span>' : "") + "</div>";
    h += `<p class="muted" id="trainer-lp">Hover a token for its id, rollout logprob and weight ` +
      `version. Trainer logprobs: not recorded (${esc(ep.trainer_logprobs_note)}).</p>`;
    h += `<div id="tokens">${renderTokens(ep)}</div>`;
    h += '<h3>Turns</h3><table id="turns"><thead><tr><th>turn</th><th>tokens</th><th>reward</th>' +
      "</tr></thead><tbody>" + ep.spans.filter((s) => s.kind === "model").map((s) =>
      `<tr><td>${s.turn + 1}${s.role ? ` (${esc(s.role)})` : ""}</td><td>${s.start}–${s.end - 1}</td>` +
      `<td>${fmt(s.reward, 4)}</td></tr>`)
      .join("") + "</tbody></table>";
    const calls = ep.tool_calls.length;
    const m = ep.metrics;
    h += `<h3>Tool calls (${calls})</h3><p class="muted" id="tool-latency">`;
    h += ep.tool_time_s === null ? (calls ? "tool time: not recorded" : "no tool calls") :
      `tool time ${fmt(ep.tool_time_s, 3)} s in all` +
      (calls ? `, ${fmt(ep.tool_time_s / calls, 3)} s per call on average` : "") +
      (m.tool_errors ? `, ${m.tool_errors} error(s)` : "");
    h += "</p><div id=\"tools\">" + ep.tool_calls.map((c) =>
      `<div class="tool"><b>turn ${c.turn + 1} · ${esc(c.name || "(no call)")}</b> ` +
      `<span class="latency">${c.latency_s === null ? "latency not recorded" :
        fmt(c.latency_s * 1000, 1) + " ms"}${c.error ? " · " + esc(c.error) : ""}</span> ` +
      (c.arguments === null ? "" : `<code>${esc(JSON.stringify(c.arguments))}</code>`) +
      `<pre>${c.output === null ? "(no output)" : esc(c.output)}</pre></div>`).join("") + "</div>";
    h += `<details open><summary>Messages (${ep.messages.length})</summary>` +
      ep.messages.map((msg) => `<div class="msg ${esc(msg.role)}"><span class="role">` +
        `${esc(msg.role)}${msg.name ? " · " + esc(msg.name) : ""}</span>` +
        (msg.reasoning_content ? `<pre class="reasoning">${esc(msg.reasoning_content)}</pre>` : "") +
        `<pre>${esc(msg.content)}</pre>` +
        (msg.tool_calls || []).map((c) => `<pre>→ ${esc(c.function.name)}(` +
          `${esc(JSON.stringify(c.function.arguments))})</pre>`).join("") + "</div>").join("") +
      "</details>";
    h += `<details><summary>Metrics and info</summary><pre>${esc(JSON.stringify(
      { metrics: ep.metrics, info: ep.info }, null, 1))}</pre></details>`;
    return h;
  }

  // ------------------------------------------------------------------ tree rollouts

  function advClass(a) { return a === null ? "" : a > 0 ? " pos" : a < 0 ? " neg" : ""; }

  function renderTree(tr, epId) {
    if (tr.error) {
      return `<h3>Tree of group ${esc(tr.group_id)}</h3><p class="error" id="tree-error">` +
        `Cannot show this group as a tree: ${esc(tr.error)}</p>`;
    }
    const byId = new Map(tr.nodes.map((n) => [n.id, n]));
    const me = tr.leaves.find((l) => l.id === epId);
    const onPath = new Set(me ? me.path : []);
    const node = (n) => {
      const turns = n.turns.map((t) => `<div class="tree-turn"><span class="turn-mark">turn ` +
        `${t.turn + 1}</span><pre>${esc(t.text)}</pre>` +
        (t.after ? `<pre class="after">${esc(t.after)}</pre>` : "") + "</div>").join("");
      const out = tr.leaves.filter((l) => l.path[l.path.length - 1] === n.id).map((l) =>
        ` · <span class="leaf-out">leaf <a href="#" data-open="${esc(l.id)}">${esc(l.id)}</a> ` +
        `r=${fmt(l.reward, 4)} · ${esc(l.stop_reason)}</span>`).join("");
      const head = `<span class="node-id">${esc(n.id)}</span> · V=${fmt(n.value, 4)} · ` +
        `<span class="adv${advClass(n.advantage)}" title="${n.choice ? "V(node) − V(parent); under the " +
          "group: V − group mean" : "its parent's only child: no choice here, the parent's Â"}">` +
        `Â=${fmt(n.advantage, 4)}${n.choice ? "" : " (only child)"}</span> · ${n.leaves.length} ` +
        `${n.leaves.length === 1 ? "leaf" : "leaves"}${out}`;
      const kids = n.children.map((c) => node(byId.get(c))).join("");
      return `<li class="tree-node${onPath.has(n.id) ? " on-path" : ""}" data-node="${esc(n.id)}" ` +
        `data-value="${n.value}" data-adv="${n.advantage}"><div class="node-head">${head}</div>` +
        `<details class="node-turns"><summary>${n.turns.length} turn(s)</summary>${turns}</details>` +
        (kids ? `<ul>${kids}</ul>` : "") + "</li>";
    };
    const roots = tr.nodes.filter((n) => n.parent === null).map(node).join("");
    const st = tr.settings, g = tr.group;
    let h = `<h3>Tree of group ${esc(tr.group_id)} <span class="muted">(${tr.leaves.length} leaves)</span></h3>`;
    h += `<p class="muted" id="tree-how">Advantages as the trainer's tree_grpo gives them: ` +
      `group mean ${fmt(g.mean, 4)}, std ${fmt(g.std, 4)}, norm_by_std ${st.norm_by_std}` +
      `${st.norm_by_std ? ` (Â ÷ (std + ${st.eps}))` : ""}, γ ${st.gamma}; outcomes: ` +
      `${esc(tr.outcomes_from)}. ${tr.notes.map(esc).join("; ")}.</p>`;
    h += `<ul class="tree">${roots}</ul>`;
    h += '<table id="tree-leaves"><thead><tr><th>leaf</th><th>reward</th><th>outcome</th><th>stop</th>' +
      "<th>Â per turn</th></tr></thead><tbody>" + tr.leaves.map((l) =>
      `<tr data-leaf="${esc(l.id)}"${l.id === epId ? ' class="selected"' : ""}><td><a href="#" ` +
      `data-open="${esc(l.id)}">${esc(l.id)}</a> <span class="muted">${esc(l.path.join(" › "))}` +
      `</span></td><td>${fmt(l.reward, 4)}</td><td>${fmt(l.outcome, 4)}</td><td>${esc(l.stop_reason)}</td>` +
      `<td>${l.trained ? l.turn_advantages.map((a) => `<span class="adv${advClass(a)}">${fmt(a, 3)}</span>`)
        .join(" ") : "not trained (no model turn)"}</td></tr>`).join("") + "</tbody></table>";
    return h;
  }

  async function showTree(id) {
    const tr = await api("/api/tree/" + encodeURIComponent(id));
    if (state.episode !== id || !$("tree-view")) return;
    $("tree-view").innerHTML = renderTree(tr, id);
    document.body.dataset.tree = tr.error ? "error" : tr.group_id;
  }

  async function showEpisode(id) {
    state.episode = id;
    writeUrl();
    for (const tr of $("episodes").tBodies[0].rows) {
      tr.classList.toggle("selected", tr.dataset.id === id);
    }
    const ep = await api("/api/episode/" + encodeURIComponent(id));
    current = ep;
    $("episode").innerHTML = renderEpisode(ep);
    $("color-by").value = state.colorBy;
    $("color-by").addEventListener("change", (ev) => {
      state.colorBy = ev.target.value;
      $("tokens").innerHTML = renderTokens(current);
    });
    document.body.dataset.episode = id;
    delete document.body.dataset.tree;
    if (ep.tree) {
      $("tree-view").addEventListener("click", guard(async (ev) => {
        const a = ev.target.closest("a[data-open]");
        if (!a) return;
        ev.preventDefault();
        await showEpisode(a.dataset.open);
      }));
      await showTree(id);
    }
  }

  // ------------------------------------------------------------------ wiring

  function guard(fn) {
    return (...args) => Promise.resolve(fn(...args)).then(() => say(""), (e) => say(String(e.message || e)));
  }

  const refilter = guard(async () => {
    readForm();
    state.offset = 0;
    state.episode = "";
    await loadEpisodes();
  });

  async function init() {
    const urlHasStep = readUrl();
    const run = await api("/api/run");
    $("run-name").textContent = "· " + run.name;
    $("run-info").textContent = `${run.path} · ${run.steps} step(s) with episodes · ${run.tokenizer}`;
    $("f-stop").innerHTML = '<option value="">any</option>' +
      run.stop_reasons.map((s) => `<option>${esc(s)}</option>`).join("");
    const steps = await api("/api/steps?limit=10000");
    $("f-step").innerHTML = '<option value="">all steps</option>' + steps.steps.map((s) =>
      `<option value="${s.step}">${s.step} (${s.episodes} ep${s.reward_mean === null ||
        s.reward_mean === undefined ? "" : ", r̄ " + fmt(s.reward_mean)})</option>`).join("");
    if (state.step === "all") state.step = "";
    else if (!urlHasStep && steps.steps.length) state.step = String(steps.steps[steps.steps.length - 1].step);
    writeForm();

    $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); refilter(); });
    for (const id of ["f-step", "f-stop"]) $(id).addEventListener("change", () => refilter());
    $("f-clear").addEventListener("click", () => {
      state.min = state.max = state.stop = state.task = "";
      writeForm();
      refilter();
    });
    $("prev").addEventListener("click", guard(async () => {
      state.offset = Math.max(0, state.offset - state.limit);
      await loadEpisodes();
    }));
    $("next").addEventListener("click", guard(async () => {
      state.offset += state.limit;
      await loadEpisodes();
    }));
    $("episodes").addEventListener("click", guard(async (ev) => {
      const tr = ev.target.closest("tr[data-id]");
      if (tr) await showEpisode(tr.dataset.id);
    }));
    $("charts").addEventListener("click", (ev) => {
      const pt = ev.target.closest("circle[data-step]");
      if (!pt) return;
      $("f-step").value = pt.dataset.step;
      refilter();
    });
    $("metric-add").addEventListener("change", guard(async (ev) => {
      if (ev.target.value) state.extraKeys.push(ev.target.value);
      await loadMetrics();
    }));

    const episode = state.episode;
    await Promise.all([
      loadMetrics(),
      loadEpisodes().then(() => (episode && !current ? showEpisode(episode) : null)),
    ]);
  }

  guard(init)().then(() => { document.body.dataset.ready = "1"; });
})();
