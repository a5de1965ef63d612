"""What ``plexrl sim --out DIR`` writes: the JSON report, its figures, and a timeline.

Owns: ``write_artifacts`` and the figures' look. For a paper-e2e report: ``report.json``,
``gpu_hours_per_step.png`` (per model, each mode's GPU-hours per step over split-async's,
so models of very different sizes share an axis; the paper's saving marked),
``savings.png`` (per model: against split-async searched, at fixed sizes, the ideal bound
and the paper), and ``timeline.json`` (a Perfetto/Chrome trace of the first experiment's
``plexrl`` run: one track of calls per worker group and one of its state moves). For a
sweep report: ``report.json`` and one ``sweep_<axis>.png`` per axis.
Must not know: how the figures were computed (the report and the traces are its input).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from plexrl.sim.experiments.experiment import ModeResult
from plexrl.sim.experiments.loop import Trace
from plexrl.sim.scenario import Scenario
from plexrl.timeline import Timeline

BASELINE = "split-async"
SAVING_BARS = (("vs_split_async", "vs split-async (searched)"),
               ("vs_split_async_fixed", "vs split-async (fixed sizes)"),
               ("ideal_vs_split_async", "ideal bound"),
               ("reference", "paper"))
SWEEP_ORDER = ("vs_split_async", "vs_colocated")
DPI = 120


def write_artifacts(out: Path, report: dict, results: dict[str, dict[str, ModeResult]] | None,
                    scenario: Scenario, seed: int) -> list[Path]:
    """Write every artifact of ``report`` into ``out`` (created); the paths, in a fixed order."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "report.json"
    report_path.write_text(json.dumps(report, sort_keys=True) + "\n", encoding="utf-8")
    paths = [report_path]
    title = f"{scenario.name}, seed {seed}"
    if results is None:
        for axis, entry in report.get("sweep", {}).items():
            paths.append(_sweep_figure(out / f"sweep_{axis}.png", axis, entry, title))
        return paths
    paths.append(_gpu_hours_figure(out / "gpu_hours_per_step.png", report, title))
    paths.append(_savings_figure(out / "savings.png", report, title))
    first = next(iter(results), None)
    if first is not None and "plexrl" in results[first]:
        timeline = trace_timeline(results[first]["plexrl"].trace, f"{first} plexrl")
        paths.append(timeline.write(out / "timeline.json"))
    return paths


def trace_timeline(trace: Trace, group: str) -> Timeline:
    """Calls on one track per worker group, state moves on a "<wg> moves" track beside it."""
    timeline = Timeline()
    groups = sorted({c.wg for c in trace.calls} | {m.wg for m in trace.moves})
    calls, moves = {}, {}
    for wg in groups:
        calls[wg] = timeline.track(str(wg), group)
        moves[wg] = timeline.track(f"{wg} moves", group)
    for c in trace.calls:
        timeline.span(calls[c.wg], f"{c.job} {c.function.value} k={c.step}", c.start_s,
                      _dur_s(c.start_s, c.end_s), category="call",
                      args={"job": str(c.job), "function": c.function.value, "step": c.step,
                            "useful_gpu_s": round(c.useful_gpu_s, 6)})
    for m in trace.moves:
        timeline.span(moves[m.wg], f"{m.job} {m.what}", m.start_s, _dur_s(m.start_s, m.end_s),
                      category="move",
                      args={"job": str(m.job), "what": m.what, "reason": m.reason,
                            "num_bytes": m.num_bytes})
    return timeline


def _dur_s(start_s: float, end_s: float) -> float:
    """A duration whose microseconds end where ``end_s`` rounds to: back-to-back calls stay
    back to back (rounding start and duration apart can overlap them by 1 us)."""
    return (round(end_s * 1e6) - round(start_s * 1e6)) / 1e6


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # before pyplot: no display, the same PNG everywhere
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path, rect: tuple = (0, 0, 1, 1)) -> Path:
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    _pyplot().close(fig)
    return path


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _gpu_hours_figure(path: Path, report: dict, title: str) -> Path:
    plt = _pyplot()
    models = list(report["models"])
    modes = list(dict.fromkeys(m for model in models for m in report["models"][model]))
    fig, ax = plt.subplots(figsize=(2.2 + 2.2 * len(models), 4.2))
    width = 0.8 / max(len(modes), 1)
    for j, mode in enumerate(modes):
        heights = [_relative(report["models"][model], mode) for model in models]
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(models))]
        bars = ax.bar(xs, heights, width, label=mode)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    marked = False
    for i, model in enumerate(models):
        ref = report.get("reference", {}).get(model, {}).get("vs_split_async")
        if ref is not None and "plexrl" in modes:
            x = i + (modes.index("plexrl") - (len(modes) - 1) / 2) * width
            ax.hlines(1 - ref, x - width / 2, x + width / 2, colors="black", linewidth=2,
                      label=None if marked else "paper: plexrl / split-async")
            marked = True
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel(f"GPU-hours per step / {BASELINE}")
    ax.set_title(f"GPU-hours per training step, relative to {BASELINE} ({title})")
    _legend_on_top(ax)
    return _save(fig, path)


def _legend_on_top(ax) -> None:
    """Headroom above the tallest bar for a legend that covers no bar."""
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.3 * (high - low))
    ax.legend(fontsize=8, ncol=3, loc="upper center")


def _relative(modes: dict, mode: str) -> float:
    if mode not in modes or BASELINE not in modes:
        return math.nan
    return modes[mode]["gpu_hours_per_step"] / modes[BASELINE]["gpu_hours_per_step"]


def _savings_figure(path: Path, report: dict, title: str) -> Path:
    plt = _pyplot()
    models = list(report["savings"])
    fig, ax = plt.subplots(figsize=(2.2 + 2.2 * len(models), 4.2))
    width = 0.8 / len(SAVING_BARS)
    for j, (key, label) in enumerate(SAVING_BARS):
        heights = []
        for model in models:
            if key == "reference":
                value = report.get("reference", {}).get(model, {}).get("vs_split_async")
            else:
                value = report["savings"][model].get(key)
            heights.append(100 * _nan(value))
        xs = [i + (j - (len(SAVING_BARS) - 1) / 2) * width for i in range(len(models))]
        bars = ax.bar(xs, heights, width, label=label,
                      hatch="//" if key == "reference" else None)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("GPU-hours per step saved (%)")
    ax.set_title(f"plexrl against split-async ({title})")
    _legend_on_top(ax)
    return _save(fig, path)


def _sweep_figure(path: Path, axis: str, entry: dict, title: str) -> Path:
    plt = _pyplot()
    found = list(next(iter(entry["savings"].values()), {}))
    metrics = sorted(found, key=lambda m: (SWEEP_ORDER.index(m) if m in SWEEP_ORDER else 9, m))
    fig, axes = plt.subplots(1, max(len(metrics), 1), figsize=(5.5 * max(len(metrics), 1), 4),
                             squeeze=False)
    values = entry["values"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes[0], metrics):
        for k, (model, stats) in enumerate(entry["savings"].items()):
            color = colors[k % len(colors)]
            ax.plot(values, [100 * _nan(v) for v in stats[metric]["mean"]], "o-",
                    color=color, label=model)
            ax.plot(values, [100 * _nan(v) for v in stats[metric]["min"]], "--", color=color)
        ax.axhline(0.0, color="black", linewidth=0.8)
        if min(values) > 0 and max(values) >= 8 * min(values):  # 4k..32k tokens: even steps
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.set_xlabel(entry["target"])
        ax.set_ylabel("GPU-hours per step saved (%)")
        ax.set_title(metric.replace("_", " ").replace("split async", "split-async"))
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(axes[0][0].plot([], [], "--", color="grey")[0])
    labels.append("min over seeds (solid: mean)")
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(f"sweep {axis} ({title})")
    return _save(fig, path, rect=(0, 0.07, 1, 1))
