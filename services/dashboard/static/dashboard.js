// The dashboard's pages: fetch the page's JSON endpoint every few seconds and redraw.
// Every value from the server is inserted as text (never as HTML), so record contents cannot run script.
"use strict";

const PAGE = document.body.dataset.page;
const REFRESH_MS = Number(document.body.dataset.refreshMs || 5000);
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];
const charts = new Map();

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "-"; }
function num(v, digits = 2) { return v === null || v === undefined ? "-" : Number(v).toFixed(digits); }
function showError(msg) {
  const box = document.getElementById("error");
  box.textContent = msg || "";
  box.hidden = !msg;
}

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (r.status === 401) { window.location = "/login"; throw new Error("signed out"); }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

async function post(path, body) {
  const r = await fetch(path, {
    method: "POST", credentials: "same-origin",
    headers: { "content-type": "application/json", "x-apprentice-dashboard": "1" },
    body: JSON.stringify(body),
  });
  const out = await r.json();
  if (!r.ok) throw new Error(out.error || r.statusText);
  return out;
}

function confirmDialog(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

// Time axes: x values are ms since the epoch (the server's `ms`), shown in the viewer's time zone; the
// server's `axis` gives the range (padded around the buckets: one bucket does not stretch the axis over
// years), a whole-second/minute/hour/day tick step and the bucket width.
function timeLabel(ms, span) {
  const d = new Date(ms);
  return span > 36 * 3600e3 ? d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" })
    : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", ...(span <= 3600e3 ? { second: "2-digit" } : {}) });
}

// Ticks on whole multiples of the step in the viewer's time zone (whole minutes, hours, local midnights);
// Chart.js's own linear ticks would divide the range evenly (05:09, 08:54, ...).
function timeTicks(axis) {
  return (scale) => {
    const zone = -new Date(axis.min).getTimezoneOffset() * 60e3;
    const ticks = [];
    for (let v = Math.ceil((axis.min + zone) / axis.step) * axis.step - zone; v <= axis.max && ticks.length < 100; v += axis.step) {
      ticks.push({ value: v });
    }
    scale.ticks = ticks;
  };
}

function timeScale(axis) {
  if (!axis) return { type: "linear", ticks: { callback: (v) => new Date(v).toLocaleTimeString() } };
  const span = axis.max - axis.min;
  return {
    type: "linear", min: axis.min, max: axis.max, afterBuildTicks: timeTicks(axis),
    ticks: { maxRotation: 0, callback: (v) => timeLabel(v, span) },
  };
}

function timeTooltip(axis) {
  return { callbacks: { title: (items) => items.length ? (axis
    ? `${new Date(items[0].parsed.x).toLocaleString()} (+${axis.bucket / 1000} s bucket)`
    : new Date(items[0].parsed.x).toLocaleString()) : "" } };
}

// One Chart per canvas: a refresh updates the chart drawn on that canvas in place; a chart whose canvas
// was replaced or left the page is destroyed first (Chart.js refuses a second chart on a canvas).
function lineChart(id, canvas, datasets, yLabel, { yMax, x, tooltip } = {}) {
  let chart = charts.get(id);
  if (chart && chart.canvas !== canvas) {
    chart.destroy();
    charts.delete(id);
    chart = undefined;
  }
  const other = Chart.getChart(canvas);
  if (!chart && other) other.destroy();
  const scales = {
    x: x || { type: "linear" },
    y: { title: { display: true, text: yLabel }, beginAtZero: true, ...(yMax ? { max: yMax } : {}) },
  };
  const plugins = { legend: { position: "bottom" }, ...(tooltip ? { tooltip } : {}) };
  if (!chart) {
    chart = new Chart(canvas, {
      type: "line", data: { datasets },
      options: { animation: false, responsive: true, maintainAspectRatio: false, parsing: false, scales, plugins },
    });
    charts.set(id, chart);
  } else {
    chart.data.datasets = datasets;
    chart.options.scales = scales;
    chart.options.plugins = plugins;
    chart.update("none");
  }
  const points = datasets.reduce((n, d) => n + d.data.length, 0);
  canvas.dataset.points = String(points);
  return chart;
}

// Charts whose canvas left the page (a tenant or curve gone): destroyed, so nothing holds them.
function pruneCharts() {
  for (const [id, chart] of charts) {
    if (!chart.canvas || !chart.canvas.isConnected) {
      chart.destroy();
      charts.delete(id);
    }
  }
}

function chartBox(id) {
  let canvas = document.getElementById(id);
  if (!canvas) canvas = el("canvas", { id });
  return canvas;
}

// --- learning -------------------------------------------------------------------------------------
function renderLearning(data) {
  const root = document.getElementById("learning");
  if (!data.curves.length) return;
  const seen = new Set();
  for (const curve of data.curves) {
    const slug = `${curve.tenant}--${curve.task}`.replace(/[^A-Za-z0-9_-]/g, "_");
    seen.add(slug);
    let section = document.getElementById(`curve-${slug}`);
    const ids = ["reward", "success", "tokens"].map((m) => `${m}-${slug}`);
    if (!section) {
      root.querySelector(".empty")?.remove();
      section = el("section", { id: `curve-${slug}`, class: "curve", "data-tenant": curve.tenant, "data-task": curve.task },
        el("h2", {}, `${curve.tenant} · ${curve.task}`),
        el("p", { class: "summary" }),
        el("div", { class: "grid3" }, ids.map((id) => el("div", { class: "chart-box" }, chartBox(id)))));
      root.append(section);
    }
    const total = curve.series.reduce((n, s) => n + s.n, 0);
    section.querySelector(".summary").textContent =
      `${total} graded interactions; versions: ${curve.series.map((s) => `${s.version} (${s.n})`).join(", ")}`;
    const sets = (field) => curve.series.map((s, i) => ({
      label: s.version, borderColor: COLORS[i % COLORS.length], backgroundColor: COLORS[i % COLORS.length],
      data: s.points.filter((p) => p[field] !== null).map((p) => ({ x: p.ms, y: p[field] })), tension: 0.2,
    }));
    const time = { x: timeScale(curve.axis), tooltip: timeTooltip(curve.axis) };
    lineChart(ids[0], document.getElementById(ids[0]), sets("reward"), "mean reward", time);
    lineChart(ids[1], document.getElementById(ids[1]), sets("success"), "KPI success rate", { ...time, yMax: 1 });
    lineChart(ids[2], document.getElementById(ids[2]), sets("tokens"), "response tokens", time);
  }
  for (const section of root.querySelectorAll("section.curve")) {
    if (!seen.has(section.id.slice(6))) section.remove();
  }
  pruneCharts();
}

// --- versions -------------------------------------------------------------------------------------
async function weightsAction(action, version) {
  let fraction = null;
  if (action === "canary") {
    const answer = window.prompt(`Share of requests for ${version} (0-1]:`, "0.1");
    if (answer === null) return;
    fraction = Number(answer);
  }
  const what = { promote: `Promote ${version} to every pod (through the eval gate)?`,
                 canary: `Canary ${version} on ${fraction} of requests?`,
                 rollback: version ? `Roll back to ${version} (a canary running in its slot ends)?`
                   : "Roll back to the previous version?" }[action];
  if (!(await confirmDialog(what))) return;
  try {
    await post(`/api/weights/${action}`, { version, fraction, confirm: version || "previous" });
    showError("");
    refresh();
  } catch (e) { showError(`${action} ${version}: ${e.message}`); }
}

// The orders that can succeed on a version (the server's `actions`); for the others, why not (`not_offered`).
function versionActions(v) {
  const label = {
    promote: "promote",
    canary: v.slot_canary === v.version ? "change canary share" : "canary",
    rollback: v.serving ? `end canary ${v.slot_canary}` : "roll back to",
  };
  const buttons = v.actions.map((a) => el("button", { onclick: () => weightsAction(a, v.version), class: a }, label[a]));
  const reasons = new Map();   // one note per reason: "served now" for promote, canary and rollback alike
  for (const [a, why] of Object.entries(v.not_offered || {})) reasons.set(why, [...(reasons.get(why) || []), a]);
  const words = { promote: "promote", canary: "canary", rollback: "roll back" };
  const notes = [...reasons].map(([why, actions]) => el("div", { class: "small not-offered", "data-actions": actions.join(" ") },
    v.actions.length ? `no ${actions.map((a) => words[a]).join(" or ")}: ${why}` : why));
  return [...buttons, ...notes];
}

function renderVersions(data) {
  const serving = document.getElementById("serving");
  serving.replaceChildren(
    el("div", { class: "card" }, el("b", {}, "promoted"), el("span", { id: "promoted" }, data.promoted_text || "base")),
    el("div", { class: "card" }, el("b", {}, "canary"),
      el("span", { id: "canary" }, [
        ...(data.canary ? [`${data.canary} (${Math.round(data.canary_fraction * 100)}%)`] : []),
        ...Object.entries(data.tenant_canaries || {}).map(([t, v]) => `${v} for tenant ${t}`),
      ].join(" · ") || "none")),
    el("div", { class: "card" }, el("b", {}, "rollback"),
      el("button", { onclick: () => weightsAction("rollback", ""), id: "rollback-previous" }, "to previous")));
  const tbody = document.querySelector("#versions-table tbody");
  tbody.replaceChildren(...data.versions.slice().reverse().map((v) => el("tr", { "data-version": v.version },
    el("td", {}, el("b", {}, v.version), v.tenant ? ` (${v.tenant})` : ""),
    el("td", {}, v.parent),
    el("td", {}, `${v.algorithm || "-"} ${v.kind || ""}`),
    el("td", { class: `status-${v.status}` }, v.status,
      v.canary ? ` ${Math.round(v.canary.fraction * 100)}%, ${v.canary.requests} requests` : "",
      v.reason ? el("div", { class: "small" }, v.reason) : ""),
    el("td", {}, v.eval.map((e) => el("div", { class: e.passed ? "pass" : "fail" },
      `${e.suite}/${e.metric}: ${num(e.candidate)} (${e.comparison ? `vs ${e.comparison} ${e.baseline_version}` : "base"} ${num(e.baseline)})`))),
    el("td", { class: "small" }, v.data_offsets.map((o) => el("div", {}, `${o.topic}[${o.partition}] ${o.start}-${o.end}`))),
    el("td", { class: "actions" }, versionActions(v)))));
  const versions = ["base", ...data.versions.map((v) => v.version)];   // the base model's scores open the curve
  const canvas = document.getElementById("gate-curve");
  const datasets = data.curve.map((c, i) => ({
    label: c.label, borderColor: COLORS[i % COLORS.length], backgroundColor: COLORS[i % COLORS.length],
    data: c.points.map((p) => ({ x: versions.indexOf(p.version), y: p.value })),
  }));
  lineChart("gate-curve", canvas, datasets, "score",
    { x: { type: "linear", ticks: { stepSize: 1, callback: (v) => versions[v] ?? "" } } });
  document.querySelector("#pods-table tbody").replaceChildren(...data.pods.map((p) => el("tr", {},
    el("td", {}, p.pod), el("td", {}, p.serving), el("td", {}, p.canary || "-"),
    el("td", { class: "small" }, Object.entries(p.tenants).map(([t, v]) => `${t || "*"}: ${v}`).join(", ") || "-"),
    el("td", {}, p.canary ? `${p.canary_requests} (${p.canary_errors} errors)` : "-"),
    el("td", { class: p.lagging ? "fail" : "pass" }, p.lagging ? "lagging" : p.converged ? "converged" : "converging",
      p.detail ? el("div", { class: "small" }, p.detail) : ""))));
  document.querySelector("#orders-table tbody").replaceChildren(...data.orders.slice().reverse().map((o) => el("tr", {},
    el("td", {}, when(o.at)), el("td", {}, o.action + (o.fraction ? ` ${Math.round(o.fraction * 100)}%` : "")),
    el("td", {}, o.version), el("td", {}, o.previous || "-"), el("td", {}, o.by || "-"), el("td", { class: "small" }, o.reason))));
}

// --- reward hacking -------------------------------------------------------------------------------
function renderHacking(data) {
  const root = document.getElementById("hacking");
  if (!data.tenants.length) return;
  // One section per tenant, kept across refreshes: its chart stays on its canvas and is updated in place.
  const sections = data.tenants.map((t) => {
    const id = `hacking-${t.tenant.replace(/[^A-Za-z0-9_-]/g, "_")}`;
    let section = document.getElementById(`tenant-${id}`);
    if (!section) {
      section = el("section", { class: "tenant", id: `tenant-${id}`, "data-tenant": t.tenant },
        el("h2", {}, t.tenant),
        el("p", { class: "summary" }),
        el("div", { class: "chart-box" }, chartBox(id)),
        el("table", { class: "examples" },
          el("thead", {}, el("tr", {}, ["when", "version", "flags", "reward", "prompt", "response"].map((h) => el("th", {}, h)))),
          el("tbody", {})));
    }
    section.querySelector(".summary").replaceChildren(
      `${t.flagged} of ${t.interactions} interactions flagged, ${t.quarantined} quarantined. `,
      ...Object.entries(t.flags).map(([f, n]) => el("span", { class: "tag" }, `${f}: ${n}`)));
    section.querySelector("tbody").replaceChildren(...t.examples.map((e) => el("tr", {},
      el("td", {}, when(e.served_at)), el("td", {}, e.policy_version),
      el("td", {}, e.flags.join(", "), e.quarantined ? el("div", { class: "fail" }, "quarantined") : ""),
      el("td", {}, num(e.reward)), el("td", { class: "text" }, e.prompt), el("td", { class: "text" }, e.response))));
    return section;
  });
  if (sections.length !== root.children.length || sections.some((section, i) => root.children[i] !== section)) {
    root.replaceChildren(...sections);
  }
  for (const t of data.tenants) {
    const id = `hacking-${t.tenant.replace(/[^A-Za-z0-9_-]/g, "_")}`;
    lineChart(id, document.getElementById(id), [
      { label: "flagged", borderColor: COLORS[1], backgroundColor: COLORS[1], data: t.points.map((p) => ({ x: p.ms, y: p.flagged })) },
      { label: "quarantined", borderColor: COLORS[4], backgroundColor: COLORS[4], data: t.points.map((p) => ({ x: p.ms, y: p.quarantined })) },
      { label: "interactions", borderColor: COLORS[6], backgroundColor: COLORS[6], data: t.points.map((p) => ({ x: p.ms, y: p.n })) },
    ], "interactions per bucket", { x: timeScale(t.axis), tooltip: timeTooltip(t.axis) });
  }
  pruneCharts();
}

// --- knowledge ------------------------------------------------------------------------------------
async function knowledgeAction(action, key, item, text) {
  try {
    await post(`/api/knowledge/${action}`, { key, item_id: item, text });
    showError("");
    refresh();
  } catch (e) { showError(`${action} ${item}: ${e.message}`); }
}

// Actions that change what is served are confirmed first; approve / reject / edit are not (as before).
const KNOWLEDGE_CONFIRM = {
  retire: (it) => `Retire ${it.id}? It leaves the serving context and training (restore undoes it).`,
  restore: (it) => `Restore ${it.id}? It serves in context again` +
    (it.superseded_by ? `, next to ${it.superseded_by.id} which superseded it.` : "."),
  split: (it, text) => `Split "${text}" off ${it.id}? It becomes a pending item of its own, with its sources.`,
};

async function confirmedKnowledgeAction(action, key, it, text) {
  if (KNOWLEDGE_CONFIRM[action] && !(await confirmDialog(KNOWLEDGE_CONFIRM[action](it, text)))) return;
  await knowledgeAction(action, key, it.id, text);
}

let editing = false;   // do not redraw under an open editor

function itemCell(b, it) {
  const cell = el("td", { class: "text" }, el("div", { class: "item-text" }, it.text));
  if (it.screen_flags.length) {
    cell.append(el("div", { class: "fail" }, `screen: ${it.screen_flags.join(", ")}`,
      it.status === "rejected" ? ""
        : el("div", { class: "small" }, "read it: approve or restore it only with the CLI's --override-screen; or edit, reject or retire it")));
  }
  if (it.questions.length) {
    cell.append(el("div", { class: "small questions" }, "questions: ", it.questions.join(" · ")));
  }
  if (it.answer_terms.length) {
    cell.append(el("div", { class: "small answer-terms" }, "answer terms: ",
      it.answer_terms.map((t) => el("span", { class: "tag" }, t))));
  }
  if (it.superseded_by) {
    const s = it.superseded_by;
    cell.append(el("div", { class: "supersession" }, `superseded by ${s.id}`, s.status ? ` (${s.status})` : "",
      s.text ? `: ${s.text} ` : " (no longer in the base) ",
      it.actions.includes("restore")
        ? el("button", { class: "restore", onclick: () => confirmedKnowledgeAction("restore", b.key, it) }, "undo") : ""));
  }
  for (const s of it.supersedes) {
    cell.append(el("div", { class: "small supersedes" }, `supersedes ${s.id}: ${s.text}`));
  }
  if (it.merges.length) {
    cell.append(el("div", { class: "merges" }, el("div", { class: "small" }, `merged (${it.merges.length}):`),
      it.merges.map((m) => el("div", { class: "merge" },
        m.text ? `“${m.text}”` : "(the same text)",
        el("span", { class: "small" }, ` from ${m.sources.join(", ") || "-"} · ${when(m.at)} · by ${m.by || "?"} (${m.role || "?"})`),
        m.can_split ? el("button", { class: "split", onclick: () => confirmedKnowledgeAction("split", b.key, it, m.text) }, "undo merge")
          : m.split ? el("span", { class: "small" }, " (split off)") : ""))));
  }
  return cell;
}

function renderKnowledge(data) {
  if (editing) return;
  const root = document.getElementById("knowledge");
  if (!data.bases.length) return;
  root.replaceChildren(...data.bases.map((b) => el("section", { class: "base", "data-key": b.key },
    el("h2", {}, b.key, el("span", { class: "small" },
      ` version ${b.version}, ${b.items.length} items${b.require_approval ? ", approval required" : ""}`)),
    el("p", { class: "counts" }, Object.entries(b.counts).map(([state, n]) =>
      el("span", { class: "tag", "data-state": state }, `${state}: ${n}`))),
    el("table", {}, el("thead", {}, el("tr", {}, ["state", "item", "provenance", "actions"].map((h) => el("th", {}, h)))),
      el("tbody", {}, b.items.map((it) => {
        const textCell = itemCell(b, it);
        const actions = el("td", {});
        const label = { approve: "approve", reject: "reject", retire: "retire", restore: "restore" };
        for (const action of it.actions) {
          if (action === "edit") {
            actions.append(el("button", { class: "edit", onclick: () => {
              editing = true;
              const area = el("textarea", { rows: 3 }, it.text);
              textCell.replaceChildren(area,
                el("button", { onclick: () => { editing = false; knowledgeAction("edit", b.key, it.id, area.value); } }, "save"),
                el("button", { onclick: () => { editing = false; refresh(); } }, "cancel"));
            } }, "edit"));
          } else if (!(action === "restore" && it.superseded_by)) {   // a supersession's undo sits by it
            actions.append(el("button", { class: action, onclick: () => confirmedKnowledgeAction(action, b.key, it) },
              label[action] || action));
          }
        }
        return el("tr", { "data-item": it.id, class: `item-${it.status}` },
          el("td", { class: `status-${it.status}` }, it.state,
            it.state_detail ? el("div", { class: "small" }, it.state_detail) : "",
            it.revision > 1 ? el("div", { class: "small" }, `revision ${it.revision}`) : ""),
          textCell,
          el("td", { class: "small" }, it.provenance.map((p) =>
            el("div", {}, `${when(p.at)} ${p.action} by ${p.by || "?"} (${p.role || "?"}) ${p.source}`)),
            it.sources.length ? el("div", {}, `from ${it.sources.join(", ")}`) : ""),
          actions);
      }))))));
}

// --- health ---------------------------------------------------------------------------------------
function renderHealth(data) {
  document.getElementById("services").replaceChildren(...Object.entries(data.services).map(([name, s]) =>
    el("div", { class: `card ${s.healthy ? "pass" : "fail"}`, id: `service-${name}` },
      el("b", {}, name), el("span", {}, s.healthy ? "healthy" : "down"),
      el("div", { class: "small" }, s.target || `metrics ${s.metrics_port}`))));
  document.getElementById("spool").textContent =
    `Inference spool depth: ${data.spool_depth ?? "unknown"} · graded records read: ${data.dashboard.graded_records}` +
    (data.dashboard.reader_error ? ` · reader: ${data.dashboard.reader_error}` : "");
  const waiting = data.grader_waiting || { lines: [] };
  document.getElementById("grader-waiting").replaceChildren(...waiting.lines.map((line) =>
    el("p", { class: line.includes("no rule reads") || waiting.waiting > 0 ? "warn" : "" }, line)));
  const tbody = document.querySelector("#lag-table tbody");
  if (Array.isArray(data.lag)) {
    tbody.replaceChildren(...data.lag.map((r) => el("tr", {},
      el("td", {}, r.group), el("td", {}, r.topic), el("td", {}, r.partition), el("td", {}, r.committed),
      el("td", {}, r.end), el("td", { class: r.lag > 0 ? "warn" : "" }, r.lag))));
  } else {
    tbody.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "fail" }, data.lag.error)));
  }
}

const PAGES = {
  learning: ["/api/learning", renderLearning], versions: ["/api/versions", renderVersions],
  hacking: ["/api/hacking", renderHacking], knowledge: ["/api/knowledge", renderKnowledge],
  health: ["/api/health", renderHealth],
};

async function refresh() {
  const entry = PAGES[PAGE];
  if (!entry) return;
  try {
    entry[1](await api(entry[0]));
    document.body.dataset.loaded = String(Date.now());
  } catch (e) {
    console.error(`refreshing the ${PAGE} page:`, e);
    showError(e.message);
  }
}

if (PAGES[PAGE]) {
  refresh();
  setInterval(refresh, REFRESH_MS);
}
