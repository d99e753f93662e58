// Sieve's web console: polls /api/overview and draws it. No framework, no build step.
// The operator token comes once from ?token= (or the form), is kept in sessionStorage and sent as a header.
"use strict";

(function () {
  const POLL_MS = 1500;
  const KEY = "sieve-console-token";
  const COLORS = ["#4fb3ff", "#ffb347", "#5fd38d", "#c792ea"];
  const $ = (id) => document.getElementById(id);
  let updates = 0;
  let timer = null;

  function takeTokenFromAddress() {
    const url = new URL(window.location.href);
    const token = url.searchParams.get("token");
    if (token) {
      sessionStorage.setItem(KEY, token);
      url.searchParams.delete("token");
      window.history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function fill(tableId, rows, cells) {
    const body = $(tableId).tBodies[0];
    const fresh = document.createElement("tbody");
    for (const row of rows) {
      const tr = document.createElement("tr");
      for (const cell of cells(row)) tr.appendChild(cell);
      fresh.appendChild(tr);
    }
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = el("td", "none", "muted");
      td.colSpan = $(tableId).tHead.rows[0].cells.length;
      tr.appendChild(td);
      fresh.appendChild(tr);
    }
    body.replaceWith(fresh);
  }

  function num(value, digits) {
    if (value === null || value === undefined) return "–";
    return typeof value === "number" ? value.toLocaleString(undefined, { maximumFractionDigits: digits ?? 0 }) : value;
  }

  function td(value, cls) { return el("td", value, cls); }
  function numTd(value, digits) { return el("td", num(value, digits), "num"); }
  function pct(value) { return el("td", num(value, 1) + " %", "num"); }

  function seconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    return Math.round(s / 60) + " min";
  }

  function bars(share, entitlement, most) {
    const cell = document.createElement("td");
    const width = 80 / Math.max(most, 0.01);
    const a = el("span", null, "bar");
    a.style.width = Math.max(1, Math.round(share * width)) + "px";
    const b = el("span", null, "bar ent");
    b.style.width = Math.max(1, Math.round(entitlement * width)) + "px";
    cell.appendChild(a);
    cell.appendChild(b);
    cell.title = "share (blue) against entitlement (orange)";
    return cell;
  }

  function tiles(totals) {
    const box = $("tiles");
    box.replaceChildren();
    const items = [
      ["queued", totals.pending], ["leased", totals.leased], ["delayed", totals.delayed],
      ["active devices", totals.devices], ["overloaded", totals.overloaded], ["in backoff", totals.backoff],
      ["longest device wait", seconds(totals.oldest_wait_s)], ["live workers", totals.live_workers],
      ["connected here", totals.connected_workers], ["acked here", totals.acked_here],
      ["dead letters", totals.dead_letters],
    ];
    for (const [label, value] of items) {
      const tile = el("div", null, "tile");
      tile.appendChild(el("b", num(value)));
      tile.appendChild(el("span", label));
      tile.dataset.tile = label;
      box.appendChild(tile);
    }
  }

  // --- charts: lines on a <canvas>, sized for the screen's pixel ratio --------------------------------
  function chart(canvasId, history, series, fixed) {
    const canvas = $(canvasId);
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 600, h = canvas.clientHeight || 180;
    if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const left = 46, right = 8, top = 22, bottom = 18;
    const values = series.flatMap((s) => history.map((p) => p[s.key])).filter((v) => v !== null && v !== undefined);
    let lo = fixed ? fixed[0] : 0;
    let hi = fixed ? fixed[1] : Math.max(1, ...values) * 1.1;
    if (hi <= lo) hi = lo + 1;
    ctx.strokeStyle = "#2a3542"; ctx.fillStyle = "#7f8b99"; ctx.lineWidth = 1; ctx.font = "11px system-ui";
    for (let i = 0; i <= 4; i++) {
      const y = top + (h - top - bottom) * (i / 4);
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w - right, y); ctx.stroke();
      const v = hi - (hi - lo) * (i / 4);
      const label = v === 0 ? "0" : v >= 10 ? Math.round(v).toLocaleString() : v.toFixed(2);
      ctx.fillText(label, 2, y + 4);
    }
    if (history.length < 2) { ctx.fillText("collecting…", left + 8, top + 16); canvas.dataset.points = String(history.length); return; }
    const t0 = history[0].at_ms, t1 = history[history.length - 1].at_ms;
    const span = Math.max(1, t1 - t0);
    ctx.fillText(Math.round(span / 1000) + " s", w - right - 36, h - 4);
    const x = (t) => left + (w - left - right) * ((t - t0) / span);
    const y = (v) => top + (h - top - bottom) * (1 - (Math.min(hi, Math.max(lo, v)) - lo) / (hi - lo));
    series.forEach((s, i) => {
      ctx.strokeStyle = COLORS[i % COLORS.length]; ctx.lineWidth = 1.6; ctx.beginPath();
      let drawing = false;
      for (const p of history) {
        const v = p[s.key];
        if (v === null || v === undefined) { drawing = false; continue; }
        if (drawing) ctx.lineTo(x(p.at_ms), y(v)); else ctx.moveTo(x(p.at_ms), y(v));
        drawing = true;
      }
      ctx.stroke();
      ctx.fillStyle = COLORS[i % COLORS.length];
      ctx.fillText(s.label, left + 8 + i * 90, 12);
    });
    canvas.dataset.points = String(history.length);
  }

  function render(data) {
    $("replica").textContent = "scheduler replica " + data.replica;
    tiles(data.totals);
    const devices = data.devices;
    $("devices-note").textContent = "(share: this replica's claims over the last " + data.share_window_s + " s)";
    const most = Math.max(0, ...devices.map((d) => Math.max(d.share, d.entitlement)));
    fill("devices", devices, (d) => {
      const state = d.overloaded ? "overloaded" : d.backoff ? "backoff" : "";
      // a backlogged device served well under its entitlement is what unfairness looks like (more than it is
      // entitled to is normal: the others had less work than their share)
      const under = d.queued_total > 0 && d.share < d.entitlement * 0.8;
      const shareCell = el("td", (d.share * 100).toFixed(1) + " %", "num" + (under ? " under" : ""));
      return [td(d.device + (state ? " (" + state + ")" : ""), state ? "bad" : ""), td(seconds(d.wait_s), "num"),
        td(seconds(d.oldest_task_s), "num"), numTd(d.queued_total), numTd(d.weight), shareCell, el("td", (d.entitlement * 100).toFixed(1) + " %", "num"),
        bars(d.share, d.entitlement, most)];
    });
    fill("queues", data.queues, (q) => {
      const text = q.pending.TEXT || 0, ocr = q.pending.OCR_IMAGE || 0, external = q.pending.EXTERNAL || 0;
      return [td(q.priority), numTd(text), numTd(ocr), numTd(external), numTd(text + ocr + external)];
    });
    const pools = data.slot_pools;
    fill("pools", pools.pools, (p) => [td(p.name), numTd(p.in_use), numTd(p.max_slots),
      td(p.holders.map((h) => h.holder + " (" + seconds(Math.max(0, h.lease_until_ms - data.at_ms) / 1000) + ")").join(", ") || "–")]);
    if (!pools.configured) $("pools").tBodies[0].rows[0].cells[0].textContent = "no slot pools configured";
    fill("workers", data.workers, (w) => {
      const gpu = w.gpu_count ? w.gpu_util_percent.toFixed(0) + " % of " + w.gpu_count : "none";
      const gpuMem = w.gpu_count ? w.gpu_memory_percent.toFixed(0) + " %" : "–";
      const state = w.available ? "available" : "held back: " + w.unavailable_reasons.join("; ");
      const row = [td(w.worker_id), td(w.task_types.join(", ")), td(w.active_tasks + " / " + w.concurrency, "num"),
        pct(w.cpu_percent), pct(w.memory_percent), td(gpu, "num"), td(gpuMem, "num"),
        td(seconds(w.heartbeat_age_s) + " ago", "num"), td(state, w.available ? "" : "bad")];
      return row;
    });
    $("dead-total").textContent = "(" + data.dead_letters.total + " in all, newest first)";
    fill("dead", data.dead_letters.recent, (d) => [td(d.task_id), td(d.device), td(d.type), numTd(d.attempts),
      td(d.error, "err"), td(new Date(d.dead_ms).toLocaleTimeString())]);
    const h = data.history;
    chart("chart-throughput", h, [{ key: "claimed_per_s", label: "claimed" }, { key: "acked_per_s", label: "acked" }]);
    chart("chart-latency", h, [{ key: "wait_p50_ms", label: "p50" }, { key: "wait_p95_ms", label: "p95" }]);
    chart("chart-fairness", h, [{ key: "jain", label: "Jain's index" }], [0, 1]);
    chart("chart-backlog", h, [{ key: "pending", label: "queued" }, { key: "leased", label: "leased" }]);
    updates += 1;
    document.body.dataset.updates = String(updates);
    document.body.dataset.at = String(data.at_ms);
  }

  function setStatus(text, cls) {
    const s = $("status");
    s.textContent = text;
    s.className = "status " + (cls || "");
  }

  function showLogin(message) {
    $("login").hidden = false;
    $("main").hidden = true;
    $("login-error").textContent = message || "";
    setStatus("needs an operator token", "down");
  }

  async function poll() {
    timer = null;
    const token = sessionStorage.getItem(KEY);
    const headers = token ? { Authorization: "Bearer " + token } : {};
    try {
      const reply = await fetch("/api/overview", { headers, cache: "no-store" });
      if (reply.status === 401 || reply.status === 403) {
        const body = await reply.json().catch(() => ({}));
        if (token) sessionStorage.removeItem(KEY);
        showLogin(body.error || "refused");
        return;
      }
      if (!reply.ok) {
        const body = await reply.json().catch(() => ({}));
        setStatus("scheduler answered " + reply.status + (body.error ? ": " + body.error : ""), "down");
      } else {
        const data = await reply.json();
        $("login").hidden = true;
        $("main").hidden = false;
        render(data);
        setStatus("live · " + new Date(data.at_ms).toLocaleTimeString(), "live");
      }
    } catch (err) {
      setStatus("scheduler unreachable, retrying", "down");
    }
    timer = window.setTimeout(poll, POLL_MS);
  }

  function start() {
    takeTokenFromAddress();
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token").value.trim();
      if (token) sessionStorage.setItem(KEY, token);
      $("token").value = "";
      if (timer === null) poll();
    });
    poll();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
