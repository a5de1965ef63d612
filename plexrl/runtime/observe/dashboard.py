"""The live dashboard: its JSON state and its page (server-rendered HTML + a small script).

Owns: ``dashboard_state`` (what the page shows, as JSON: worker groups with their recent
timeline and utilisation, queues with the reason each call waits, jobs with their tiers and
slowdowns, the saving against isolated) and ``render_page`` (the same state as HTML, with a
script that polls ``api/state`` every second and redraws it; no build toolchain, no
external assets). Times on the page are seconds since the controller started.
Must not know: HTTP, Ray, Prometheus.
"""

from __future__ import annotations

import html
import json
import re

from plexrl.core.snapshot import Snapshot
from plexrl.runtime.observe import measures

TIMELINE_S = 30.0      #: seconds of history drawn per worker group
POLL_MS = 1000


def dashboard_state(call_log: list[dict], snap: Snapshot, now: float, started_s: float,
                    readings: dict, window_s: float = 60.0) -> dict:
    """The page's state at ``now`` (the controller's monotonic clock); ``readings``:
    ``measures.readings`` at the same moment."""
    def rel(t: float) -> float:
        return round(t - started_s, 3)
    util, slow = readings["utilisation"], readings["slowdowns"]
    devices = {wg: g.num_devices for wg, g in snap.cluster.worker_groups.items()}
    recent = _recent(call_log, now - TIMELINE_S)
    groups = []
    for wg in snap.group_order:
        spans = [{"job": c["job"], "function": c["function"], "start_s": rel(c["start_s"]),
                  "end_s": rel(c["end_s"])} for c in recent if c["wg"] == wg]
        running = snap.running.get(wg)
        if running is not None:
            spans.append({"job": running.job, "function": str(running.function),
                          "start_s": rel(running.started_at), "end_s": rel(now), "running": True})
        groups.append({"wg": wg, "num_devices": devices[wg], "utilisation": round(util[wg], 4),
                       "running": f"{running.job} {running.function}" if running else "",
                       "num_queued": len(snap.queued_by_group.get(wg, ())), "timeline": spans,
                       "jobs": sorted({j for j, v in snap.jobs.items()
                                       if wg in v.bindings.values()})})
    queues = [{"wg": c.wg, "call": int(c.call), "job": c.job, "function": str(c.function),
               "step": c.step, "waited_s": round(now - c.queued_at, 3),
               "reason": measures.wait_reason(snap, c)} for c in snap.queued]
    pending = [{"job": s.job, "reason": "waits for room to place its models"}
               for s in snap.pending]
    jobs = []
    for job, view in sorted(snap.jobs.items()):
        tiers: dict[str, int] = {}
        for key, state in snap.states.items():
            if key.job == job:
                tiers[str(state.tier)] = tiers.get(str(state.tier), 0) + state.num_bytes
        s = slow.get(job, {"slowdown": 1.0, "blocked_s": 0.0, "elapsed_s": 0.0})
        jobs.append({"job": job, "groups": sorted(set(view.bindings.values())), "tiers": tiers,
                     "num_calls": s.get("num_calls", 0),
                     "slowdown": round(s["slowdown"], 4), "blocked_s": round(s["blocked_s"], 3),
                     "elapsed_s": round(s["elapsed_s"], 3)})
    saving = readings["saving"]
    return {"now_s": rel(now), "timeline_s": TIMELINE_S, "window_s": window_s,
            "worker_groups": groups, "queues": queues, "pending": pending, "jobs": jobs,
            "saving": {k: round(v, 4) for k, v in saving.items()}}


def _recent(call_log: list[dict], since: float) -> list[dict]:
    """The calls that ended after ``since`` (the log is in end order: read from its end)."""
    out = []
    for c in reversed(call_log):
        if c["end_s"] <= since:
            break
        out.append(c)
    return out[::-1]


def render_page(state: dict) -> str:
    """The whole page, tables filled from ``state``; the script keeps them live."""
    fills = {"STATE": json.dumps(state).replace("</", "<\\/"), "BODY": _tables(state),
             "POLL_MS": str(POLL_MS)}
    return re.sub(r"%(STATE|BODY|POLL_MS)%", lambda m: fills[m.group(1)], _PAGE)


def _tables(state: dict) -> str:
    """The first paint, before the script runs (and all there is without scripts)."""
    e = html.escape
    rows = "".join(f"<tr><td>{e(g['wg'])}</td><td class=util data-wg='{e(g['wg'])}'>"
                   f"{g['utilisation'] * 100:.1f}%</td><td>{e(g['running'])}</td>"
                   f"<td>{g['num_queued']}</td><td>{e(', '.join(g['jobs']))}</td></tr>"
                   for g in state["worker_groups"])
    jobs = "".join(f"<tr><td class=job>{e(j['job'])}</td><td>{e(', '.join(j['groups']))}</td>"
                   f"<td>{e(_tiers(j['tiers']))}</td><td>{j['num_calls']}</td>"
                   f"<td>{j['slowdown']:.2f}x</td></tr>" for j in state["jobs"])
    return (f"<table id=groups>{_GROUP_HEAD}{rows}</table>"
            f"<table id=jobs>{_JOB_HEAD}{jobs}</table>")


def _tiers(tiers: dict) -> str:
    return " ".join(f"{t} {b / 2**20:.1f} MiB" for t, b in sorted(tiers.items()))


_GROUP_HEAD = ("<tr><th>worker group</th><th>utilisation</th><th>running</th><th>queued</th>"
               "<th>jobs</th></tr>")
_JOB_HEAD = ("<tr><th>job</th><th>worker groups</th><th>tiers</th><th>calls</th>"
             "<th>slowdown vs alone</th></tr>")

_PAGE = """<!doctype html>
<html><head><meta charset=utf-8><title>PlexRL</title>
<style>
body{font:14px sans-serif;margin:1em}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
.lane{position:relative;height:22px;background:#f4f4f4;margin:2px 0 8px;width:100%}
.span{position:absolute;top:0;height:22px;overflow:hidden;font-size:11px;color:#fff;white-space:nowrap}
#saving{font-size:18px}
</style></head><body>
<h1>PlexRL</h1>
<p id=saving></p>
<h2>Worker groups</h2><div id=timelines></div>
<div id=tables>%BODY%</div>
<h2>Queues</h2><table id=queues></table>
<p><a href="metrics">metrics</a> &middot; <a href="api/state">state (JSON)</a></p>
<script>
let state = %STATE%;
const esc = s => String(s).replace(/[&<>'"]/g, c => "&#" + c.charCodeAt(0) + ";");
const hue = s => { let h = 7; for (const c of s) h = (h * 31 + c.charCodeAt(0)) % 100003;
                   return (h * 137.508) % 360; };   // near names, far hues
const mib = b => (b / 1048576).toFixed(1) + " MiB";
function draw() {
  const s = state, t0 = s.now_s - s.timeline_s;
  document.getElementById("saving").textContent =
    `saving against isolated: ${(s.saving.saving_frac * 100).toFixed(1)}% ` +
    `(shared ${s.saving.shared_device_s.toFixed(1)} vs isolated ` +
    `${s.saving.isolated_device_s.toFixed(1)} device-s) at t=${s.now_s.toFixed(1)} s`;
  document.getElementById("timelines").innerHTML = s.worker_groups.map(g =>
    `<div>${esc(g.wg)}: last ${s.timeline_s} s</div><div class=lane data-wg="${esc(g.wg)}">` +
    g.timeline.map(c => {
      const a = Math.max(c.start_s, t0), w = Math.max(c.end_s - a, 0);
      return `<div class=span title="${esc(c.job + " " + c.function)}" style="left:` +
        `${(a - t0) / s.timeline_s * 100}%;width:${w / s.timeline_s * 100}%;` +
        `background:hsl(${hue(c.job)},60%,45%)">${esc(c.job)}</div>`;
    }).join("") + `</div>`).join("");
  document.getElementById("tables").innerHTML =
    `<table id=groups>%GROUP_HEAD%` + s.worker_groups.map(g =>
      `<tr><td>${esc(g.wg)}</td><td class=util data-wg="${esc(g.wg)}">` +
      `${(g.utilisation * 100).toFixed(1)}%</td><td>${esc(g.running)}</td>` +
      `<td>${g.num_queued}</td><td>${esc(g.jobs.join(", "))}</td></tr>`).join("") +
    `</table><table id=jobs>%JOB_HEAD%` + s.jobs.map(j =>
      `<tr><td class=job>${esc(j.job)}</td><td>${esc(j.groups.join(", "))}</td><td>` +
      esc(Object.keys(j.tiers).sort().map(t => t + " " + mib(j.tiers[t])).join(" ")) +
      `</td><td>${j.num_calls}</td><td>${j.slowdown.toFixed(2)}x</td></tr>`).join("") +
    `</table>`;
  document.getElementById("queues").innerHTML =
    `<tr><th>worker group</th><th>job</th><th>call</th><th>waited</th><th>reason</th></tr>` +
    s.queues.map(q => `<tr><td>${esc(q.wg)}</td><td>${esc(q.job)}</td>` +
      `<td>${esc(q.function)} (step ${q.step})</td><td>${q.waited_s.toFixed(2)} s</td>` +
      `<td>${esc(q.reason)}</td></tr>`).join("") +
    s.pending.map(p => `<tr><td></td><td>${esc(p.job)}</td><td>placement</td><td></td>` +
      `<td>${esc(p.reason)}</td></tr>`).join("");
  document.body.dataset.updated = s.now_s;
}
async function poll() {
  try { const r = await fetch("api/state"); if (r.ok) { state = await r.json(); draw(); } }
  catch (e) {}
  setTimeout(poll, %POLL_MS%);
}
draw(); setTimeout(poll, %POLL_MS%);
</script></body></html>
""".replace("%GROUP_HEAD%", _GROUP_HEAD).replace("%JOB_HEAD%", _JOB_HEAD)
