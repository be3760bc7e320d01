// The idemgate operator console: a few views over /console/api/ (see
// src/fronts/console/console.h). Everything from the store reaches the page
// as text (textContent, attributes), never as markup.
"use strict";

const TOKEN_KEY = "idemgate.console.token";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

// el("td", {class: "key"}, "text", child…): an element with text children.
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs = {}) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

function status(text) { $("status").textContent = text || ""; }

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, body) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const init = { headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch("/console/api/" + path, init);
  let data = null;
  try { data = await res.json(); } catch (_) { /* not JSON */ }
  if (!res.ok) {
    const detail = (data && (data.detail || data.title)) || res.statusText;
    if (res.status === 401) logout("That token was refused (401): " + detail);
    throw new ApiError(res.status, detail);
  }
  return data;
}

function fmtTime(iso) { return iso ? iso.replace("T", " ").replace("Z", " UTC") : "-"; }

// ── Views ────────────────────────────────────────────────────────────────

const views = ["login", "unknown", "record", "attempts", "replay"];

function show(name) {
  for (const v of views) $(v + "-view").hidden = v !== name;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.dataset.view === name);
  }
}

function recordLink(tenant, key) {
  return "#record/" + encodeURIComponent(tenant) + "/" + encodeURIComponent(key);
}

async function route() {
  status("");
  if (!sessionStorage.getItem(TOKEN_KEY)) return show("login");
  const hash = location.hash.slice(1) || "unknown";
  const [view, ...rest] = hash.split("/");
  try {
    if (view === "record") {
      show("record");
      await loadRecord(decodeURIComponent(rest[0] || ""), decodeURIComponent(rest[1] || ""));
    } else if (view === "attempts") {
      show("attempts");
      await loadAttempts();
    } else if (view === "replay") {
      show("replay");
      await loadReplay();
    } else {
      show("unknown");
      await loadUnknown();
    }
  } catch (e) {
    status(e instanceof ApiError ? `Error ${e.status}: ${e.message}` : String(e));
  }
}

// ── Confirmation ─────────────────────────────────────────────────────────

// Asks before an action; resolves to {ok, cls, body}.
function confirmAction(title, text, withOutcome) {
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-outcome").hidden = !withOutcome;
  $("confirm-body").value = "";
  const dialog = $("confirm");
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve({
      ok: dialog.returnValue === "ok",
      cls: $("confirm-class").value,
      body: $("confirm-body").value,
    }), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// Release, set the outcome or evict `r` ({tenant, key, fence}), after asking.
async function act(action, r) {
  const what = {
    release: ["Release this record?",
      "Only if the action did NOT happen: the record is deleted and the next attempt executes."],
    "set-outcome": ["Set the outcome of this record?",
      "Only if the action DID happen: the outcome below is stored and retries replay it."],
    evict: ["Evict this record?",
      "The record is removed whatever its state; the next attempt executes."],
  }[action];
  const answer = await confirmAction(what[0], `${what[1]}\n\nKey: ${r.key} (tenant ${r.tenant}, fence ${r.fence})`,
    action === "set-outcome");
  if (!answer.ok) return;
  const body = { tenant: r.tenant, key: r.key, fence: r.fence };
  if (action === "set-outcome") { body.class = answer.cls; body.body = answer.body; }
  try {
    await api(action, body);
    const done = { release: "released", "set-outcome": "outcome set", evict: "evicted" }[action];
    await route();
    status(`${r.key}: ${done}.`);
  } catch (e) {
    status(`Error ${e.status || ""}: ${e.message}`);
  }
}

function actionButtons(r) {
  return [
    el("button", { type: "button", "data-action": "release", onclick: () => act("release", r) }, "Release"),
    el("button", { type: "button", "data-action": "set-outcome", onclick: () => act("set-outcome", r) }, "Set outcome"),
    el("button", { type: "button", class: "danger", "data-action": "evict", onclick: () => act("evict", r) }, "Evict"),
  ];
}

// ── Unknown records ──────────────────────────────────────────────────────

async function loadUnknown() {
  const data = await api("unknown");
  const body = $("unknown-table").tBodies[0];
  body.replaceChildren();
  for (const r of data.records) {
    body.append(el("tr", { "data-key": r.key },
      el("td", { class: "key" }, el("a", { href: recordLink(r.tenant, r.key) }, r.key)),
      el("td", {}, r.tenant), el("td", {}, r.tool), el("td", {}, fmtTime(r.since)),
      el("td", {}, r.fence), el("td", {}, ...actionButtons(r))));
  }
  $("unknown-table").hidden = data.records.length === 0;
  $("unknown-empty").hidden = data.records.length !== 0;
  const more = $("unknown-more");
  more.hidden = !data.truncated;
  more.textContent = `Showing what the newest ${data.scanned} "unknown" audit entries name ` +
    `(at most ${data.max_records} records: [console] max_records, scan_attempts).`;
}

// ── A record ─────────────────────────────────────────────────────────────

async function loadRecord(tenant, key) {
  const fields = $("record-fields");
  fields.replaceChildren();
  $("record-actions").replaceChildren();
  $("record-outcome").textContent = "";
  let r;
  try {
    r = (await api(`record?tenant=${encodeURIComponent(tenant)}&key=${encodeURIComponent(key)}`)).record;
  } catch (e) {
    if (e.status !== 404) throw e;
    fields.append(el("dt", {}, "key"), el("dd", {}, key), el("dt", {}, "state"),
      el("dd", {}, "no live record (released, evicted, never begun or expired)"));
    r = null;
  }
  if (r) {
    const rows = [["key", r.key], ["tenant", r.tenant], ["state", r.state], ["fence", r.fence],
      ["tool", r.tool], ["turn", r.turn || "-"], ["fingerprint", r.fingerprint],
      ["created", fmtTime(r.created_at)]];
    if (r.lease_expires_at) rows.push(["lease until", fmtTime(r.lease_expires_at) + (r.lease_expired ? " (expired)" : "")]);
    if (r.completed_at) rows.push([r.state === "unknown" ? "unknown since" : "completed", fmtTime(r.completed_at)]);
    rows.push(["expires", fmtTime(r.expires_at)]);
    if (r.outcome_class) rows.push(["outcome", `${r.outcome_class}, ${r.outcome_bytes} bytes`]);
    for (const [k, v] of rows) {
      fields.append(el("dt", {}, k), el("dd", k === "state" ? { class: "state-" + v, id: "record-state" } : {}, v));
    }
    if (r.state === "unknown") $("record-actions").append(...actionButtons(r));
    else $("record-actions").append(actionButtons(r)[2]);
    $("record-outcome").textContent = r.outcome_body !== undefined
      ? r.outcome_body + (r.outcome_cut ? "\n… (cut; idemgate inspect --show-outcome prints it whole)" : "")
      : r.outcome_binary ? "(not text; idemgate inspect --json --show-outcome prints it in base64)"
        : "(none)";
  }
  const attempts = await api(`attempts?tenant=${encodeURIComponent(tenant)}&key=${encodeURIComponent(key)}&limit=50`);
  fillAttempts($("record-attempts"), attempts.attempts, false);
}

// ── The attempt log ──────────────────────────────────────────────────────

function fillAttempts(table, attempts, wide) {
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const a of attempts) {
    const cells = [el("td", {}, fmtTime(a.at))];
    if (wide) cells.push(el("td", {}, a.tenant), el("td", {}, a.tool));
    cells.push(el("td", {}, a.outcome), el("td", {}, a.latency_ms + " ms"));
    if (wide) cells.push(el("td", { class: "key" }, el("a", { href: recordLink(a.tenant, a.key) }, a.key)));
    else cells.push(el("td", {}, a.instance));
    cells.push(el("td", {}, a.detail));
    body.append(el("tr", { "data-outcome": a.outcome }, ...cells));
  }
}

async function loadAttempts() {
  const form = new FormData($("attempts-form"));
  const q = new URLSearchParams();
  for (const [k, v] of form) if (String(v).trim() !== "") q.set(k, String(v).trim());
  const data = await api("attempts?" + q.toString());
  fillAttempts($("attempts-table"), data.attempts, true);
}

// ── The replay chart ─────────────────────────────────────────────────────

const COLORS = ["#1f5fa8", "#c0392b", "#27ae60", "#8e44ad", "#d35400", "#16a085", "#7f8c8d", "#b7950b"];

async function loadReplay() {
  const since = new FormData($("replay-form")).get("since") || "1h";
  const data = await api("replay?since=" + encodeURIComponent(since));
  drawChart(data);
}

function drawChart(data) {
  const W = 900, H = 320, L = 48, R = 16, T = 16, B = 36;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "replay ratio per tool" });
  const x = (t) => L + (t - data.from) / (data.to - data.from) * (W - L - R);
  const y = (v) => T + (1 - v) * (H - T - B);
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    chart.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#d8dde3" }));
    const label = svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#5b6570" });
    label.textContent = v.toFixed(2);
    chart.append(label);
  }
  for (const t of [data.from, (data.from + data.to) / 2, data.to]) {
    const label = svg("text", { x: x(t), y: H - 12, "text-anchor": "middle", "font-size": 11, fill: "#5b6570" });
    label.textContent = new Date(t).toISOString().slice(11, 16) + " UTC";
    chart.append(label);
  }
  const legend = $("legend");
  legend.replaceChildren();
  data.tools.forEach((tool, i) => {
    const color = COLORS[i % COLORS.length];
    let d = "";
    let pen = "M";
    for (const p of tool.points) {
      if (p.ratio === null) { pen = "M"; continue; }
      const px = x(p.t + data.bucket_ms / 2), py = y(p.ratio);
      d += `${pen}${px.toFixed(1)},${py.toFixed(1)} `;
      pen = "L";
      const dot = svg("circle", { cx: px.toFixed(1), cy: py.toFixed(1), r: 3, fill: color });
      const tip = svg("title");
      tip.textContent = `${tool.tool}: ${p.replays} of ${p.answers} replayed`;
      dot.append(tip);
      chart.append(dot);
    }
    if (d) chart.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2 }));
    const swatch = svg("svg", { width: 12, height: 12, class: "swatch" });
    swatch.append(svg("rect", { width: 12, height: 12, fill: color }));
    legend.append(el("li", { "data-tool": tool.tool }, swatch, `${tool.tool} (${tool.answers} answered)`));
  });
  if (data.tools.length === 0) legend.append(el("li", {}, "No attempts in this period."));
  $("chart").replaceChildren(chart);
}

// ── Log in / out ─────────────────────────────────────────────────────────

function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  $("nav").hidden = true;
  show("login");
  status(message || "");
}

async function login(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    const me = await api("whoami");
    $("who").textContent = `${me.tenant} (admin) · ${me.instance}`;
    $("nav").hidden = false;
    const limit = document.querySelector("#attempts-form [name=limit]");
    limit.max = String(me.limits.max_attempts);
    return true;
  } catch (e) {
    if (e.status === 403) logout("That token is not an admin's (403): " + e.message);
    else if (e.status !== 401) logout(`Error ${e.status || ""}: ${e.message}`);
    return false;
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (await login($("token").value)) { $("token").value = ""; await route(); }
  });
  $("logout").addEventListener("click", () => logout("Logged out."));
  $("attempts-form").addEventListener("submit", (ev) => { ev.preventDefault(); loadAttempts().catch((e) => status(e.message)); });
  $("replay-form").addEventListener("submit", (ev) => { ev.preventDefault(); loadReplay().catch((e) => status(e.message)); });
  window.addEventListener("hashchange", route);
  if (sessionStorage.getItem(TOKEN_KEY) && !(await login(sessionStorage.getItem(TOKEN_KEY)))) return;
  await route();
});
