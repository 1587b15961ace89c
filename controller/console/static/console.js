// The appliance console's only script (served from /console/static: the CSP allows no inline script).
// Now page: follows /console/events (server-sent status snapshots, one a second) and moves the
// progress bar and the state/phase fields. Revoke buttons: ask before submitting.
"use strict";

function secs(v) {
  if (v === null || v === undefined) return "—";
  if (v < 120) return Math.round(v) + " s";
  const m = Math.floor(v / 60), s = Math.floor(v % 60);
  return m + " min " + String(s).padStart(2, "0") + " s";
}

function progressText(s) {
  if (s.progress_pct !== null && s.progress_pct !== undefined) {
    return s.progress_pct.toFixed(1) + " % of the ready budget (" + secs(s.elapsed_s) + " of " +
      secs(s.ready_budget_s) + ")";
  }
  if (s.state === "ready") return "ready in " + secs(s.ready_s);
  return "not starting";
}

function applyStatus(s) {
  const fields = {
    state: s.state, recipe: s.recipe || "—", describe: s.describe || s.phase || "—",
    cache: s.cache || "—", progress_text: progressText(s),
    eta_text: s.eta_text || "", stall: s.stall || "", log_tail: s.log_tail || "",
  };
  if (s.diagnosis) { fields.diagnosis = s.diagnosis; }
  for (const el of document.querySelectorAll("[data-live]")) {
    const key = el.dataset.live;
    if (key in fields) el.textContent = fields[key];
  }
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
  for (const button of document.querySelectorAll("button[data-confirm]")) {
    button.form.addEventListener("submit", (e) => {
      if (!window.confirm(button.dataset.confirm)) e.preventDefault();
    });
  }
});
