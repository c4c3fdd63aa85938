// The console page: one EventSource on /api/events brings a sample of the
// node per second (the history first); the charts are derived from the
// samples, and the key picked is fetched again at each sample. Every value
// reaches the page as text (textContent), never as markup.
"use strict";

const MAX = 120; // samples kept for the charts: two minutes
const samples = [];
let picked = ""; // the key shown in the key card
let fetching = false;

const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
};

function duration(ms) {
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 120) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 120) return m + " min " + Math.round(s - 60 * m) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

// parseJSON is JSON.parse keeping integers of 16 digits or more (tokens
// are u64, and a double holds integers exactly only up to 2^53) as their
// decimal strings, so that a token shown or sent back to revoke is the
// node's, digit for digit: a rounded one could name another holding.
// Digits inside strings (a reason, a label) are left alone.
function parseJSON(text) {
  let out = "", inStr = false, esc = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inStr) {
      out += c;
      if (esc) esc = false;
      else if (c === "\\") esc = true;
      else if (c === '"') inStr = false;
      continue;
    }
    if (c === '"') { inStr = true; out += c; continue; }
    if (c >= "0" && c <= "9") {
      let j = i;
      while (j < text.length && text[j] >= "0" && text[j] <= "9") j++;
      const digits = text.slice(i, j);
      const prev = out.replace(/\s+$/, "").slice(-1);
      const next = text[j];
      const whole = (prev === ":" || prev === "[" || prev === ",") && next !== "." && next !== "e" && next !== "E";
      out += whole && digits.length >= 16 ? '"' + digits + '"' : digits;
      i = j - 1;
      continue;
    }
    out += c;
  }
  return JSON.parse(out);
}

function rate(key) {
  // per second between consecutive samples of a counter
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].at_unix_ms - samples[i - 1].at_unix_ms) / 1000;
    const dv = samples[i][key] - samples[i - 1][key];
    out.push(dt > 0 && dv >= 0 ? dv / dt : 0);
  }
  return out;
}

function chart(id, series, nowId, unit) {
  const svg = $(id);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const all = series.flat();
  const top = Math.max(1, ...all);
  series.forEach((s, k) => {
    if (s.length < 2) return;
    const off = MAX - s.length; // the newest sample at the right edge
    const pts = s.map((v, i) => ((off + i) * 300 / (MAX - 1)).toFixed(1) + "," + (78 - (v / top) * 74).toFixed(1));
    const pl = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    pl.setAttribute("points", pts.join(" "));
    if (k > 0) pl.setAttribute("class", "second");
    svg.appendChild(pl);
  });
  const last = series.map((s) => s.length ? s[s.length - 1] : 0);
  $(nowId).textContent = last.map((v) => (v >= 100 || Number.isInteger(v) ? Math.round(v) : v.toFixed(1))).join(" / ") + (unit || "");
}

function fill(tbody, rows) {
  while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
  rows.forEach((r) => tbody.appendChild(r));
}

function render() {
  const s = samples[samples.length - 1];
  $("node").textContent = s.server_id + " (" + s.role + (s.serving ? ", serving" : "") + ")";
  $("role").textContent = s.role + (s.serving ? ", serving" : "");
  $("leader").textContent = s.leader || "none";
  $("term").textContent = s.term;
  $("indexes").textContent = s.commit_index + " / " + s.applied_index;
  $("held").textContent = s.keys_held + (s.permits ? " + " + s.permits + " permits" : "");
  $("waiters").textContent = s.waiters;
  $("lasttoken").textContent = s.last_token;
  $("clusterid").textContent = (s.cluster_id || "–") + (s.domain ? " · domain " + s.domain.slice(0, 12) + "…" : "");
  fill($("members").tBodies[0], (s.members || []).map((m) => {
    const tr = el("tr");
    tr.appendChild(el("td", m.id));
    tr.appendChild(el("td", m.peer_addr));
    tr.appendChild(el("td", m.leader ? "leader" : m.voter ? "voter" : "learner"));
    return tr;
  }));
  const recent = samples.slice(-MAX);
  const commit = recent.filter((x) => x.commit);
  chart("chart-commit", [commit.map((x) => x.commit.p50_ms), commit.map((x) => x.commit.p99_ms)], "c-commit", " ms");
  chart("chart-apply", [rate("applied_index")], "c-apply");
  chart("chart-grants", [rate("last_token")], "c-grants");
  chart("chart-waiters", [recent.map((x) => x.waiters)], "c-waiters");

  const lines = s.lines || [];
  $("nolines").hidden = lines.length > 0;
  fill($("lines").tBodies[0], lines.map((l) => {
    const tr = el("tr", undefined, "pick");
    tr.dataset.key = l.key;
    tr.appendChild(el("td", l.key + (l.semaphore ? " (semaphore " + l.held + "/" + l.permits + ")" : "")));
    tr.appendChild(el("td", l.waiters, "num"));
    tr.appendChild(el("td", l.semaphore ? "–" : l.holder ? l.holder + (l.label ? " · " + l.label : "") : "reserved"));
    tr.appendChild(el("td", l.semaphore || !l.holder ? "–" : duration(l.held_ms), "num"));
    tr.appendChild(el("td", l.handoffs_per_sec ? l.handoffs_per_sec.toFixed(1) : "–", "num"));
    tr.addEventListener("click", () => pick(l.key));
    return tr;
  }));
  $("sessioncount").textContent = s.sessions_total ? "(" + s.sessions_total + ")" : "(none)";
  fill($("sessiontable").tBodies[0], (s.sessions || []).map((x) => {
    const tr = el("tr");
    tr.appendChild(el("td", x.id));
    tr.appendChild(el("td", x.attached === undefined ? "–" : x.attached ? "yes" : "no"));
    tr.appendChild(el("td", x.waiters, "num"));
    tr.appendChild(el("td", x.holdings, "num"));
    tr.appendChild(el("td", x.resumes, "num"));
    return tr;
  }));
  refreshKey();
}

function holderLine(h, what, key, permit) {
  const p = el("div", undefined, "holder");
  p.dataset.token = h.token;
  p.appendChild(el("span", what + " "));
  p.appendChild(el("b", h.owner + (h.label ? " · " + h.label : "")));
  p.appendChild(el("span", ", token " + h.token + ", held " + duration(h.held_ms) + ", lease left " + duration(h.lease_remaining_ms) +
    (h.block_keys ? ", block " + h.block_keys.join(" ") : "")));
  const b = el("button", "Revoke…", "danger small revoke");
  b.type = "button";
  b.dataset.token = h.token;
  b.title = "End this holding now (asks for confirmation and a reason)";
  b.addEventListener("click", () => openRevoke({ key: key, token: String(h.token), owner: h.owner, label: h.label,
    what: permit ? "permit in slot " + h.slot : "lock" }));
  p.appendChild(b);
  return p;
}

function when(ms) {
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function lastRevoke(rv) {
  const p = el("div", undefined, "lastrevoke");
  p.id = "lastrevoke";
  p.dataset.token = rv.token;
  p.appendChild(el("span", "last revoke: "));
  p.appendChild(el("b", "token " + rv.token + (rv.permit ? " (permit, slot " + rv.slot + ")" : "") + " of " +
    rv.owner + (rv.label ? " · " + rv.label : "")));
  p.appendChild(el("span", " by " + rv.by + " at " + when(rv.at_unix_ms) + (rv.reason ? ": “" + rv.reason + "”" : "") +
    (rv.keys && rv.keys.length > 1 ? " (block " + rv.keys.join(" ") + ")" : "")));
  return p;
}

function showKey(rep) {
  const v = $("keyview");
  while (v.firstChild) v.removeChild(v.firstChild);
  v.className = "";
  v.dataset.key = rep.key;
  v.appendChild(el("h3", rep.key));
  if (rep.semaphore) {
    v.appendChild(el("p", "semaphore: " + rep.semaphore.held + " of " + rep.semaphore.permits + " permits held"));
    (rep.permits || []).forEach((h) => v.appendChild(holderLine(h, "slot " + h.slot + ":", rep.key, true)));
  } else if (rep.held) {
    v.appendChild(holderLine(rep.holder, "held by", rep.key, false));
  } else {
    v.appendChild(el("p", rep.reserved ? "reserved for a block at the head of its line" : "free", "muted"));
  }
  v.appendChild(el("p", rep.queue_len ? rep.queue_len + " waiting" + (rep.queue_truncated ? " (the first " + rep.queue.length + " shown)" : "") : "nobody waiting", "muted"));
  if (rep.queue && rep.queue.length) {
    const t = el("table");
    t.id = "queue";
    const head = el("tr");
    ["place", "owner", "waited", "wait left", "session"].forEach((h) => head.appendChild(el("th", h)));
    t.appendChild(el("thead")).appendChild(head);
    const body = t.appendChild(el("tbody"));
    rep.queue.slice(0, 50).forEach((w) => {
      const tr = el("tr");
      tr.dataset.position = w.position;
      tr.dataset.owner = w.owner;
      tr.appendChild(el("td", w.position, "num"));
      tr.appendChild(el("td", w.owner + (w.label ? " · " + w.label : "")));
      tr.appendChild(el("td", duration(w.waited_ms), "num"));
      tr.appendChild(el("td", duration(w.wait_remaining_ms), "num"));
      tr.appendChild(el("td", w.session || "–"));
      body.appendChild(tr);
    });
    v.appendChild(t);
  }
  if (rep.last_revoke) v.appendChild(lastRevoke(rep.last_revoke));
}

async function refreshKey() {
  if (!picked || fetching) return;
  fetching = true;
  try {
    const r = await fetch("/api/keys/" + encodeURIComponent(picked).replace(/%2F/g, "/"), { credentials: "same-origin" });
    const body = parseJSON(await r.text());
    if (!r.ok) {
      const v = $("keyview");
      v.textContent = body.error || ("HTTP " + r.status);
      v.className = "muted";
      return;
    }
    if (body.key === picked) showKey(body);
  } catch (e) {
    // the next sample tries again
  } finally {
    fetching = false;
  }
}

function pick(key) {
  if (key !== picked) $("revokeresult").hidden = true;
  picked = key;
  $("keyinput").value = key;
  refreshKey();
}

// The revoke: the one change the console makes. The dialog shows what is
// revoked and asks for a reason; the request carries the session's CSRF
// token (GET /api/csrf) in a header.
let revoking = null; // {key, token, owner, label, what} while the dialog is open

function openRevoke(target) {
  revoking = target;
  const s = samples[samples.length - 1];
  $("rv-key").textContent = target.key;
  $("rv-token").textContent = target.token;
  $("rv-holder").textContent = target.owner + (target.label ? " · " + target.label : "") + " (" + target.what + ")";
  $("rv-node").textContent = s ? s.server_id + " (" + s.role + ")" : "–";
  $("rv-reason").value = "";
  $("rv-error").hidden = true;
  $("rv-confirm").disabled = false;
  $("revokedialog").hidden = false;
  $("rv-reason").focus();
}

function closeRevoke() {
  revoking = null;
  $("revokedialog").hidden = true;
}

function showOutcome(ok, code, text) {
  const r = $("revokeresult");
  r.textContent = text;
  r.className = ok ? "ok" : "failed";
  r.dataset.outcome = code;
  r.hidden = false;
}

const explain = {
  token_mismatch: "the holder changed since the page showed it; reload the key and check again",
  not_held: "the key is no longer held; reload the key",
  not_leader: "this node is not the leader: revoke from the leader's console",
  indeterminate: "the revoke was proposed but its outcome is unknown: the key's last revoke will say whether it happened",
  not_supported: "a member of the cluster runs a version without revoke",
  invalid_reason: "the reason must be printable ASCII, at most 128 characters",
};

async function sendRevoke(e) {
  e.preventDefault();
  if (!revoking) return;
  const reason = $("rv-reason").value.trim();
  if (!reason) {
    $("rv-error").textContent = "Say why: the reason goes to the audit log and to the holder.";
    $("rv-error").hidden = false;
    return;
  }
  const target = revoking;
  $("rv-confirm").disabled = true;
  let status = 0;
  let body = {};
  try {
    const c = await fetch("/api/csrf", { credentials: "same-origin" });
    if (!c.ok) {
      status = c.status;
    } else {
      const csrf = (await c.json()).token;
      const r = await fetch("/api/revoke", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Console-CSRF": csrf },
        body: JSON.stringify({ key: target.key, token: target.token, reason: reason }),
      });
      status = r.status;
      body = await r.text().then(parseJSON).catch(() => ({}));
    }
  } catch (err) {
    body = { error: "the node did not answer: " + err };
  }
  closeRevoke();
  if (status === 200 && body.revoked) {
    const rv = body.revoked;
    showOutcome(true, "revoked", "Revoked token " + rv.token + " of " + rv.owner + (rv.label ? " · " + rv.label : "") + " on " + rv.key +
      (rv.next_token ? "; the next holder got token " + rv.next_token + "." : "; nobody was waiting."));
    if (rv.next_token) $("revokeresult").dataset.nextToken = rv.next_token;
  } else if (status === 401) {
    showOutcome(false, "unauthorized", "Not revoked: the session ended; log in again.");
  } else {
    const code = body.code || "error";
    let text = "Not revoked (" + code + "): " + (explain[code] || body.error || "HTTP " + status);
    if (code === "not_leader") text += body.leader ? " (the leader is " + body.leader + ")." : " (no leader is known now).";
    showOutcome(false, code, text);
  }
  refreshKey();
}

function connect() {
  const es = new EventSource("/api/events");
  es.onopen = () => { $("conn").textContent = "live"; $("conn").className = "badge live"; };
  es.onerror = () => {
    $("conn").textContent = "reconnecting";
    $("conn").className = "badge";
  };
  es.onmessage = (m) => {
    const s = parseJSON(m.data);
    if (samples.length && samples[samples.length - 1].at_unix_ms >= s.at_unix_ms) samples.length = 0; // a reconnect replays the history
    samples.push(s);
    if (samples.length > MAX) samples.shift();
    render();
  };
}

document.addEventListener("DOMContentLoaded", () => {
  $("keyform").addEventListener("submit", (e) => {
    e.preventDefault();
    const k = $("keyinput").value.trim();
    if (k) pick(k);
  });
  $("revokeform").addEventListener("submit", sendRevoke);
  $("rv-cancel").addEventListener("click", closeRevoke);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && revoking) closeRevoke(); });
  connect();
});
