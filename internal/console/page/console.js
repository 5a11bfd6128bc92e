// The converge console: polls /v1/console/reading and draws it. Every
// value is written as text (textContent), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
let token = "";
let access = null;
let timer = null;

function el(tag, attrs, ...children) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== undefined && c !== null) e.append(c);
  }
  return e;
}

function td(text, cls) { return el("td", cls ? { class: cls } : {}, text === undefined || text === null ? "" : String(text)); }

function fill(tbody, rows) { tbody.replaceChildren(...rows); }

function when(t, noAgo) {
  if (!t) return "-";
  const d = new Date(t);
  if (noAgo) return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  const ago = Math.max(0, Math.round((Date.now() - d.getTime()) / 1000));
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") + " (" + ago + "s ago)";
}

function num(v, unit) {
  if (v === undefined || v === null) return "-";
  let s;
  if (unit === "bytes" || unit === "bytes/s") {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    s = (i ? v.toFixed(1) : Math.round(v)) + " " + units[i] + (unit === "bytes/s" ? "/s" : "");
  } else {
    s = (Math.abs(v) >= 100 || Number.isInteger(v) ? Math.round(v) : v.toFixed(1)) + " " + unit;
  }
  return s;
}

async function api(method, path, body) {
  const opts = { method, headers: {} };
  if (token) opts.headers["Authorization"] = "Bearer " + token;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  return { status: resp.status, data };
}

function showLogin(why) {
  clearTimeout(timer);
  document.getElementById("main").hidden = true;
  document.getElementById("login").hidden = false;
  if (why) document.getElementById("login-why").textContent = why;
}

async function start() {
  const r = await api("GET", "/v1/console/access");
  if (r.status === 401 || r.status === 403) {
    sessionStorage.removeItem("converge-token");
    showLogin(r.status === 401 ? "This console needs a token with the read scope (admin to redrive dead letters)." : "This token may not read the console: it needs the read scope.");
    return;
  }
  if (r.status !== 200) {
    showLogin("The console answered " + r.status + ".");
    return;
  }
  access = r.data;
  const scope = access.admin ? "admin: may redrive" : "read only";
  document.getElementById("who").textContent = (access.token_name || "no authentication") + " (" + scope + ")";
  document.body.dataset.admin = access.admin ? "true" : "false";
  document.getElementById("login").hidden = true;
  document.getElementById("main").hidden = false;
  poll();
}

async function poll() {
  clearTimeout(timer);
  try {
    const r = await api("GET", "/v1/console/reading");
    if (r.status === 401) { showLogin("The token is no longer accepted."); return; }
    if (r.status === 200) {
      draw(r.data);
      document.getElementById("updated").textContent = "read " + new Date(r.data.at).toLocaleTimeString();
    } else {
      document.getElementById("updated").textContent = "not read yet (" + r.status + ")";
    }
  } catch (e) {
    document.getElementById("updated").textContent = "the console does not answer: " + e;
  }
  timer = setTimeout(poll, (access && access.refresh_ms) || 1000);
}

// drawn keeps what each section last drew: a section whose data did not
// change is left alone, so that a button is not replaced under the
// pointer.
const drawn = {};

function changed(section, data) {
  const key = JSON.stringify(data);
  if (drawn[section] === key) return false;
  drawn[section] = key;
  return true;
}

function draw(rd) {
  drawPicture(rd.stages || []);
  drawAgreement(rd.agreement);
  if (changed("deadletters", rd.dead_letters && rd.dead_letters.pages)) drawDeadLetters(rd.dead_letters || {});
  drawRebuilds(rd.rebuilds || []);
  if (changed("holders", rd.holders)) drawHolders(rd.holders || []);
  drawStreams(rd.streams || [], rd.consumers || []);
  const errs = rd.errors || [];
  document.getElementById("errors").hidden = errs.length === 0;
  document.getElementById("error-list").replaceChildren(...errs.map((e) => el("li", {}, e)));
}

const BOX_W = 150, BOX_H = 66, GAP_X = 40, GAP_Y = 14, PAD = 10;

function drawPicture(stages) {
  const svg = document.getElementById("picture");
  const columns = new Map();
  for (const s of stages) {
    if (!columns.has(s.column)) columns.set(s.column, []);
    columns.get(s.column).push(s);
  }
  const cols = [...columns.keys()].sort((a, b) => a - b);
  const height = Math.max(1, ...[...columns.values()].map((c) => c.length)) * (BOX_H + GAP_Y) + 2 * PAD;
  const width = cols.length * (BOX_W + GAP_X) - GAP_X + 2 * PAD;
  const pos = new Map();
  cols.forEach((c, i) => {
    const list = columns.get(c);
    const top = (height - list.length * (BOX_H + GAP_Y) + GAP_Y) / 2;
    list.forEach((s, j) => pos.set(s.id, { x: PAD + i * (BOX_W + GAP_X), y: top + j * (BOX_H + GAP_Y) }));
  });
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  const defs = el("svg:defs", {}, el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" },
    el("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#9aa5b1" })));
  const lines = [], boxes = [];
  for (const s of stages) {
    const a = pos.get(s.id);
    for (const f of s.feeds || []) {
      const b = pos.get(f);
      if (!b) continue;
      lines.push(el("svg:line", { x1: a.x + BOX_W, y1: a.y + BOX_H / 2, x2: b.x - 2, y2: b.y + BOX_H / 2 }));
    }
    const lag = s.lag !== undefined && s.lag !== null ? "lag " + num(s.lag, s.lag_unit) : "";
    const rate = s.rate !== undefined && s.rate !== null ? num(s.rate, s.rate_unit) : "- " + s.rate_unit;
    const title = el("svg:title", {}, s.name + (s.detail ? ": " + s.detail : ""));
    boxes.push(el("svg:g", { class: "stage " + s.state, "data-stage": s.id, "data-state": s.state, transform: "translate(" + a.x + "," + a.y + ")" },
      title,
      el("svg:rect", { width: BOX_W, height: BOX_H, rx: 5 }),
      el("svg:text", { x: 8, y: 14, class: "kind" }, s.kind),
      el("svg:text", { x: 8, y: 30, class: "name" }, s.name.length > 22 ? s.name.slice(0, 21) + "\u2026" : s.name),
      el("svg:text", { x: 8, y: 45, class: "rate" }, rate),
      el("svg:text", { x: 8, y: 59, class: "lag" }, lag)));
  }
  svg.replaceChildren(defs, ...lines, ...boxes);
}

function drawAgreement(ag) {
  document.getElementById("agreement-none").hidden = !!ag;
  const stores = document.querySelector("#agreement-stores tbody");
  const diffs = document.querySelector("#differences tbody");
  if (!ag) { fill(stores, []); fill(diffs, []); return; }
  fill(stores, ag.stores.map((p) => el("tr", { "data-store": p.store, class: p.differences_named ? "difference" : "" },
    td(p.store), td((100 * p.proven_fraction).toFixed(1) + "% (" + p.buckets_agreeing + " of " + ag.buckets + " buckets)"),
    td(p.proven_documents, "num"), td(p.full_passes, "num"), td(when(p.last_full_pass)), td(p.differences_named, "num"))));
  const rows = [];
  for (const p of ag.stores) {
    for (const d of p.differences) {
      let repair = d.repairable ? "repairable" : "not repairable";
      if (d.unrepairable) repair = "not repairable: " + d.unrepairable;
      if (d.reemitted) repair = "re-emitted " + when(d.reemitted);
      if (d.repair_error) repair = "re-emission failed: " + d.repair_error;
      rows.push(el("tr", { class: "difference", "data-store": d.store, "data-key": d.key },
        td(d.store), td(d.key), td(d.problem), td(d.detail, "reason"), td(when(d.named_at)), td(repair)));
    }
  }
  fill(diffs, rows);
  document.getElementById("differences").hidden = rows.length === 0;
}

function payloadText(p) {
  if (p.event) return "event " + p.kind + " key " + JSON.stringify(p.key) + " version " + p.version;
  let s = "";
  if (p.key) s = "not a valid event: " + (p.kind ? "kind " + p.kind + " " : "") + "key " + JSON.stringify(p.key) + " version " + p.version + ", ";
  return s + p.bytes + " bytes: " + (p.head || "");
}

function drawDeadLetters(dl) {
  const pages = dl.pages || [];
  document.getElementById("deadletters-none").hidden = pages.length > 0;
  const admin = access && access.admin;
  const out = pages.map((pg) => {
    const rows = pg.dead_letters.map((e) => {
      const orig = (e.original_subject || "-") + (e.original_stream ? " (" + e.original_stream + " seq " + e.original_seq + ")" : "");
      const cells = [td("#" + e.seq), td(when(e.time, true)), td(e.code || "-"), td(e.reason || "-", "reason"), td(orig, "payload"), td(payloadText(e.payload), "payload")];
      if (admin) {
        const b = el("button", { class: "redrive", type: "button", "data-consumer": pg.consumer, "data-seq": e.seq }, "Redrive");
        b.addEventListener("click", () => redrive(pg.consumer, e.seq, payloadText(e.payload)));
        cells.push(el("td", {}, b));
      }
      return el("tr", { class: "deadletter", "data-consumer": pg.consumer, "data-seq": e.seq, "data-code": e.code || "" }, ...cells);
    });
    const head = ["seq", "time", "code", "reason", "original", "payload"].concat(admin ? [""] : []).map((h) => el("th", {}, h));
    const more = pg.truncated ? " (the oldest " + pg.dead_letters.length + " shown)" : "";
    return el("div", { class: "page", "data-consumer": pg.consumer },
      el("h3", {}, pg.consumer + ": " + pg.total + (pg.total === 1 ? " dead letter" : " dead letters") + " on " + pg.subject + more),
      el("table", {}, el("thead", {}, el("tr", {}, ...head)), el("tbody", {}, ...rows)));
  });
  document.getElementById("deadletter-pages").replaceChildren(...out);
}

async function redrive(consumer, seq, what) {
  const ok = window.confirm("Redrive dead letter #" + seq + " of " + consumer + "?\n\n" + what +
    "\n\nA document's dead letter is re-emitted through the writer (its current version), an ingest one republished; each is deleted once its redrive is acknowledged. Fix the cause first.");
  if (!ok) return;
  const msg = document.getElementById("redrive-result");
  const r = await api("POST", "/v1/console/deadletters/" + encodeURIComponent(consumer) + "/redrive", { seqs: [seq] });
  const res = r.data || {};
  if (r.status === 200) {
    const kept = (res.results || []).filter((x) => x.Kept);
    msg.className = kept.length ? "failed" : "";
    msg.textContent = kept.length ? "#" + seq + " of " + consumer + " kept: " + kept[0].Kept
      : "#" + seq + " of " + consumer + " redriven (" + (res.results && res.results[0] ? res.results[0].Path : "") + ")";
  } else {
    msg.className = "failed";
    msg.textContent = "redrive of #" + seq + " refused (" + r.status + "): " + (res.error ? (res.error.message || res.error) : "");
  }
  poll();
}

// rebuildTarget is what a rebuild fills: its generation, in place or not,
// and the one partition it rebuilds, when it rebuilds one.
function rebuildTarget(x) {
  if (x.partition !== undefined && x.partition !== null) return (x.target || "") + " (partition " + x.partition + " of " + x.partitions + ", in place)";
  return (x.target || "") + (x.in_place ? " (in place)" : "");
}

function drawRebuilds(rbs) {
  document.getElementById("rebuilds-none").hidden = rbs.length > 0;
  document.getElementById("rebuild-rows").hidden = rbs.length === 0;
  fill(document.querySelector("#rebuild-rows tbody"), rbs.map((rb) => {
    const st = rb.status, state = rb.state;
    if (!st) {
      return el("tr", { "data-projector": rb.projector }, td(rb.projector), td(state.phase), td("-"), td("(its projector was not asked)"), td(rebuildTarget(state)), td(when(state.started_at)));
    }
    const bar = el("progress", { max: "1", value: String(rb.fraction) });
    let applied = st.applied_seq + " of " + st.stream_last_seq + " (pending " + st.pending + ")";
    if (st.phase === "done") applied = "done " + when(st.done_at) + ", " + st.completed + " since its projector started";
    if (st.error) applied += "; last error: " + st.error;
    return el("tr", { "data-projector": rb.projector, "data-phase": st.phase, "data-applied": st.applied_seq, "data-last": st.stream_last_seq },
      td(rb.projector), td(st.phase), el("td", {}, bar, " " + Math.round(100 * rb.fraction) + "%"), td(applied, "applied"),
      td(rebuildTarget(st)), td(when(st.started_at)));
  }));
}

function drawHolders(hs) {
  document.getElementById("holders-none").hidden = hs.length > 0;
  fill(document.querySelector("#holder-rows tbody"), hs.map((h) => el("tr", { "data-lease": h.lease },
    td(h.lease), td(h.kind), td(h.holder || "nobody (its instance stopped or died; another takes it within the lease's TTL)"), td(h.source))));
}

function drawStreams(streams, consumers) {
  fill(document.querySelector("#stream-rows tbody"), streams.filter((s) => s.exists).map((s) => el("tr", { "data-stream": s.name },
    td(s.name), td(s.messages, "num"), td(s.first_seq + ".." + s.last_seq), td(s.consumers, "num"), td(when(s.last_time)))));
  fill(document.querySelector("#consumer-rows tbody"), consumers.map((c) => el("tr", { "data-consumer": c.stream + "/" + c.name },
    td(c.name), td(c.stream), td(c.pending, "num"), td(c.ack_pending, "num"), td(c.redelivered, "num"), td(c.dead_letters, "num"),
    td(when(c.last_applied_commit_time)))));
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("converge-token", token);
  start();
});

// A token in the fragment (#token=...) never reaches a server's log; it
// is kept for this tab and taken out of the address bar.
const frag = new URLSearchParams(location.hash.slice(1));
if (frag.get("token")) {
  sessionStorage.setItem("converge-token", frag.get("token"));
  history.replaceState(null, "", location.pathname + location.search);
}
token = sessionStorage.getItem("converge-token") || "";
start();
