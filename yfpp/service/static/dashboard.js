// The yfpp serve dashboard: polls the API each second, follows one subscription's results (SSE over fetch,
// so that the token goes in a header), draws the shared NFA. Every value is shown through textContent.
"use strict";
const $ = (sel) => document.querySelector(sel);
let token = localStorage.getItem("yfpp-token") || "";
let watched = new URLSearchParams(location.search).get("sub");
let stream = null;
const lastCounts = new Map();

function headers() { return token ? { Authorization: "Bearer " + token } : {}; }

async function api(path) {
  const r = await fetch(path, { headers: headers() });
  if (r.status === 401) { $("#login").hidden = false; throw new Error("a token is needed"); }
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function row(cells, numeric = []) {
  const tr = document.createElement("tr");
  cells.forEach((c, i) => {
    const td = document.createElement("td");
    if (c instanceof Node) td.append(c); else td.textContent = c ?? "";
    if (numeric.includes(i)) td.className = "n";
    tr.append(td);
  });
  return tr;
}

function rate(key, count) {
  const now = performance.now(), last = lastCounts.get(key);
  lastCounts.set(key, { count, now });
  return last ? ((count - last.count) * 1000 / (now - last.now)).toFixed(1) : "";
}

async function refresh() {
  try {
    const h = await api("/health");
    $("#status").textContent = h.status;
    $("#status").className = h.status === "ok" ? "" : "bad";
    $("#totals").textContent = `${h.events_in} events in (${h.events_per_s}/s), ${h.dead_letters} dead letters, ` +
      `${h.subscriptions} subscriptions, ${h.live_runs} live runs, inbox ${h.inbox}`;
    const feeds = $("#feeds tbody");
    feeds.replaceChildren(
      ...Object.entries(h.feeds).map(([fmt, port]) => row([`tcp ${fmt}`, port, "listening", "", "", "", ""])),
      ...(h.mqtt || []).map((f) => row([f.name, f.topics.join(" "), f.connected ? "connected" : "reconnecting",
        f.messages, f.events, rate(f.name, f.events), f.dead_letters], [3, 4, 5, 6])));
    const subs = await api("/subscriptions");
    if (!watched && subs.length) watched = subs[0].id;
    $("#subs tbody").replaceChildren(...subs.map((s) => {
      const c = s.counters, l = s.latency, u = s.usage || {}, b = document.createElement("button");
      b.textContent = "watch";
      b.onclick = () => { watched = s.id; follow(); refresh(); };
      const latency = l.window ? `${l.p50_ms} / ${l.p99_ms}` : "";
      const tr = row([s.id, s.name, s.sink || "pull", c.matches, c.delivered, c.dropped + c.pull_dropped,
        c.queued + c.pull_queued, c.sink_errors, latency, u.runs, u.cpu_s, b], [3, 4, 5, 6, 7, 8, 9, 10]);
      tr.dataset.id = s.id;
      if (s.id === watched) tr.className = "chosen";
      return tr;
    }));
    if (watched && (!stream || stream.id !== watched)) follow();
  } catch (e) {
    $("#status").textContent = e.message;
    $("#status").className = "bad";
  }
}

async function follow() {
  if (stream) stream.ctrl.abort();
  if (!watched) return;
  const ctrl = new AbortController(), id = watched;
  stream = { id, ctrl };
  $("#watching").textContent = `of ${id}`;
  $("#live").replaceChildren();
  try {
    const r = await fetch(`/subscriptions/${encodeURIComponent(id)}/matches`, { headers: headers(), signal: ctrl.signal });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const reader = r.body.getReader(), text = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += text.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const data = buf.slice(0, end).split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        buf = buf.slice(end + 2);
        if (data) show(JSON.parse(data));
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") $("#watching").textContent = `of ${id}: ${e.message}`;
  }
  if (stream && stream.ctrl === ctrl) stream = null;  // ended: the next refresh follows again
}

function show(result) {
  const li = document.createElement("li");
  li.className = "result";
  li.dataset.id = result.id;
  li.textContent = JSON.stringify(result);
  const live = $("#live");
  live.prepend(li);
  while (live.children.length > 100) live.lastChild.remove();
}

async function drawNfa() {
  let g;
  try { g = await api("/nfa"); } catch (e) { return; }
  const f = g.figures;
  $("#nfa-figures").textContent = `${f.queries} queries, ${f.nodes} nodes (${f.shared_nodes} shared)` +
    (g.hidden ? `, ${g.hidden} not drawn` : "");
  const NS = "http://www.w3.org/2000/svg", W = 150, H = 34, pos = new Map(), rows = new Map();
  for (const n of g.nodes) {
    const k = rows.get(n.depth) || 0;
    rows.set(n.depth, k + 1);
    pos.set(n.id, { x: 10 + n.depth * W, y: 10 + k * H });
  }
  const svg = document.createElementNS(NS, "svg");
  const width = 20 + (Math.max(0, ...rows.keys()) + 1) * W, height = 20 + Math.max(1, ...rows.values()) * H;
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  const el = (name, attrs, text) => {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  for (const e of g.edges) {
    const a = pos.get(e.from), b = pos.get(e.to);
    if (e.from === e.to) { el("text", { x: a.x + 100, y: a.y + 8 }, "⟲"); continue; }
    el("line", { x1: a.x + 110, y1: a.y + 11, x2: b.x, y2: b.y + 11, stroke: "#89a" });
  }
  for (const n of g.nodes) {
    const p = pos.get(n.id);
    const box = el("rect", { x: p.x, y: p.y, width: 110, height: 22, rx: 4, fill: n.accepts ? "#dfd" : "#fff", stroke: "#567" });
    const t = document.createElementNS(NS, "title");
    t.textContent = n.queries.join(", ");
    box.append(t);
    el("text", { x: p.x + 6, y: p.y + 15 }, n.label.length > 17 ? n.label.slice(0, 16) + "…" : n.label);
  }
  $("#nfa").replaceChildren(svg);
}

$("#login").onsubmit = (e) => {
  e.preventDefault();
  token = $("#token").value;
  localStorage.setItem("yfpp-token", token);
  $("#login").hidden = true;
  refresh(); drawNfa();
};
refresh(); drawNfa();
setInterval(refresh, 1000);
setInterval(drawNfa, 10000);
