// The appliance console's only script (served from /console/static: the CSP allows no inline script).
// Now page: follows /console/events (server-sent status snapshots, one a second) and moves the
// progress bar and the state/phase fields. Revoke buttons: ask before submitting. Log page: the
// Follow button polls the log's text from the last offset (log.txt, X-Next-Offset) and appends it.
"use strict";

function secs(v) {
  if (v === null || v === undefined) return "—";
  if (v < 120) return Math.round(v) + " s";
  const m = Math.floor(v / 60), s = Math.floor(v % 60);
  return m + " min " + String(s).padStart(2, "0") + " s";
}

function applyStatus(s) {
  const fields = {
    state: s.state, recipe: s.recipe || "—", describe: s.describe || s.phase || "—",
    // every label below is the server's, derived from one status object (views.state_line)
    cache: s.cache_text || "—", progress_text: s.progress_text || "", retry_text: s.retry_text || "",
    memory_text: s.memory_text || "—", headroom_text: s.headroom_text || "—",
    eta_text: s.eta_text || "", stall: s.stall || "", log_tail: s.log_tail || "",
  };
  if (s.diagnosis) { fields.diagnosis = s.diagnosis; }
  for (const el of document.querySelectorAll("[data-live]")) {
    const key = el.dataset.live;
    if (key in fields) el.textContent = fields[key];
  }
  const headroom = document.getElementById("headroom");
  if (headroom) headroom.classList.toggle("low", Boolean(s.headroom_low));
  const state = document.getElementById("state");
  if (state) state.className = "state state-" + s.state;
  const bar = document.getElementById("progress");
  if (bar) bar.value = s.progress_pct === null || s.progress_pct === undefined ? (s.state === "ready" ? 100 : 0)
    : s.progress_pct;
  // The expected ready time from earlier launches: a second bar (elapsed against the usual ready
  // time) and a likely-stall flag, both hidden without history / without a flag.
  const etaBar = document.getElementById("eta-bar");
  if (etaBar) {
    etaBar.hidden = s.eta_pct === null || s.eta_pct === undefined;
    etaBar.value = etaBar.hidden ? 0 : s.eta_pct;
  }
  const stall = document.getElementById("stall");
  if (stall) stall.hidden = !s.stall;
  // The failed launch's last log lines, shown only while backing off or failed.
  const logTail = document.getElementById("log-tail");
  if (logTail) logTail.hidden = !s.log_tail;
  const phases = document.getElementById("phases");
  if (phases && Array.isArray(s.phases)) {
    phases.replaceChildren(...s.phases.map((p) => {
      const li = document.createElement("li");
      li.textContent = p.label;
      if (p.done) li.className = "done";
      else if (p.current) li.className = "current";
      return li;
    }));
  }
  const link = document.getElementById("launch-link");
  if (link && s.launch_id && link.textContent !== s.launch_id) {
    link.textContent = s.launch_id;
    link.href = "/console/launches/" + encodeURIComponent(s.launch_id);
  }
}

const LOG_KEEP_CHARS = 256 * 1024;  // the page keeps the end of a followed log, not all of it
const LOG_EVERY_MS = 2000;

function followLog(button) {
  const log = document.getElementById("log");
  const state = document.getElementById("follow-state");
  let offset = Number(button.dataset.offset || "0");
  let timer = null;
  // With access lines hidden, only whole lines are judged (a chunk may end inside one): `carry` is the
  // unfinished last line; its first `shown` characters are on the page already (the tail ended in it).
  // The pattern is the server's own (appliance/observe/log_filter.py), handed over in the page.
  const hide = button.dataset.accessPattern ? new RegExp(button.dataset.accessPattern) : null;
  const initial = log.textContent;
  let carry = initial.slice(initial.lastIndexOf("\n") + 1);
  let shown = carry.length;
  function kept(text) {
    if (!hide) return text;
    const all = carry + text;
    const cut = all.lastIndexOf("\n");
    if (cut < 0) { carry = all; return ""; }
    let out = "";
    for (const line of all.slice(0, cut).split("\n")) {
      const skip = shown;
      shown = 0;
      if (!hide.test(line)) out += line.slice(skip) + "\n";
    }
    carry = all.slice(cut + 1);
    return out;
  }
  async function poll() {
    try {
      const r = await fetch(button.dataset.logUrl + "?offset=" + offset, {credentials: "same-origin"});
      if (r.status === 401) { window.location.assign("/console/login?next=" + window.location.pathname); return; }
      if (!r.ok) { state.textContent = "the log cannot be read now (" + r.status + "); still trying"; return; }
      const text = kept(await r.text());
      offset = Number(r.headers.get("X-Next-Offset") || offset);
      if (text) {
        // the log box scrolls by itself; it stays at the end unless the reader scrolled up
        const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 40;
        log.textContent = (log.textContent + text).slice(-LOG_KEEP_CHARS);
        if (atBottom) log.scrollTop = log.scrollHeight;
      }
      state.textContent = "following: new lines every " + LOG_EVERY_MS / 1000 + " s";
    } catch (e) {
      state.textContent = "the log cannot be read now; still trying";
    }
  }
  function toggle() {
    if (timer === null) {
      timer = window.setInterval(poll, LOG_EVERY_MS);
      button.textContent = "Stop following";
      poll();
    } else {
      window.clearInterval(timer);
      timer = null;
      button.textContent = "Follow";
      state.textContent = "not following";
    }
  }
  log.scrollTop = log.scrollHeight;  // a tail: open at its end
  button.addEventListener("click", toggle);
  if (button.dataset.autostart) toggle();
}

// The Now page's load panel: the server renders it (figures and SVG sparklines); this fetches it
// again once per sample and swaps it in, so the page stays live without a charting library.
function followLoad(panel) {
  const every = Number(panel.dataset.loadEvery || "5000");
  async function redraw() {
    try {
      const r = await fetch(panel.dataset.loadUrl, {credentials: "same-origin"});
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      panel.replaceChildren(...Array.from(doc.body.childNodes).map((n) => document.importNode(n, true)));
    } catch (e) {
      // a missed redraw: the next one comes at the next sample
    }
  }
  window.setInterval(redraw, every);
}

function follow(url) {
  const source = new EventSource(url);
  source.addEventListener("status", (e) => applyStatus(JSON.parse(e.data)));
  source.addEventListener("ended", () => {
    source.close();
    window.location.assign("/console/login?next=/console/");
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const now = document.getElementById("now");
  if (now && now.dataset.statusUrl) follow(now.dataset.statusUrl);
  const load = document.getElementById("load");
  if (load && load.dataset.loadUrl) followLoad(load);
  const logButton = document.getElementById("follow");
  if (logButton && logButton.dataset.logUrl) followLog(logButton);
  for (const button of document.querySelectorAll("button[data-confirm]")) {
    button.form.addEventListener("submit", (e) => {
      if (!window.confirm(button.dataset.confirm)) e.preventDefault();
    });
  }
});
