"""The paper-e2e report: per (model, mode) figures, savings, and their rendering.

Owns: ``build_report`` (for every experiment of a scenario: each mode at its searched size
and at CALIBRATION 6.4's fixed size, the savings of plexrl against split-async and of
plexrl-on-policy against colocated, and the ideal bound), the JSON shape printed by
``plexrl sim --format json``, and the plain-text table. The first experiment that uses a
model provides ``models[<model>]`` and ``savings[<model>]``. Must not know: the CLI.
"""

from __future__ import annotations

from plexrl.sim.experiments.experiment import (ModeResult, alone_step_s, cheapest, core_private_gpus, fixed_sizes,
                                               run_mode, slowed, try_sizes, within_slowdown)
from plexrl.sim.experiments.pool import map_runs
from plexrl.sim.scenario import Scenario

#: PAPER.md: GPU-hours per training step saved against split-async.
REFERENCE_SAVING = {"Qwen2.5-7B-Instruct": 0.3136, "Qwen3-30B-A3B": 0.3010, "Qwen3-235B-A22B": 0.3758}
#: PAPER.md: bubble ratio of the jobs.
REFERENCE_BUBBLE = {"Qwen2.5-7B-Instruct": 0.8010, "Qwen3-30B-A3B": 0.7067, "Qwen3-235B-A22B": 0.8111}
FIGURES = ("gpu_hours_per_step", "step_s", "bubble_frac", "decode_efficiency", "slowdown")
SHARED_MODES = ("plexrl", "plexrl-on-policy", "plexrl-shared", "plexrl-shared-on-policy")


def mode_json(result: ModeResult) -> dict:
    out = {name: round(result.mean(name), 6) for name in FIGURES}
    out["useful_gpu_hours_per_step"] = round(result.mean("useful_gpu_hours_per_step"), 6)
    out["sizes"] = dict(result.sizes)
    out["jobs"] = {job: {name: round(getattr(r, name), 6) for name in FIGURES}
                   for job, r in result.jobs.items()}
    return out


def _saving(ours: ModeResult | None, base: ModeResult | None) -> float | None:
    if ours is None or base is None:
        return None
    return round(1 - ours.mean("gpu_hours_per_step") / base.mean("gpu_hours_per_step"), 6)


def _ideal(base: ModeResult | None) -> float | None:
    """The most any mode could save against ``base``: its share of charged, not useful, GPU-hours."""
    if base is None:
        return None
    return round(1 - base.mean("useful_gpu_hours_per_step") / base.mean("gpu_hours_per_step"), 6)


def savings(sized: dict[str, ModeResult], fixed: dict[str, ModeResult]) -> dict:
    """Savings of the plexrl modes: one step stale against split-async, on-policy against
    colocated; ``shared``: the rollout-fleet modes (D203), with the step-time ratio
    against the baseline (how much slower a step is for the saving)."""
    split, coloc = sized.get("split-async"), sized.get("colocated")
    shared_stale, shared_on = sized.get("plexrl-shared"), sized.get("plexrl-shared-on-policy")
    return {"vs_split_async": _saving(sized.get("plexrl"), split),
            "vs_colocated": _saving(sized.get("plexrl-on-policy"), coloc),
            "ideal_vs_split_async": _ideal(split),
            "ideal_vs_colocated": _ideal(coloc),
            "vs_split_async_fixed": _saving(fixed.get("plexrl"), fixed.get("split-async")),
            "shared": {"vs_split_async": _saving(shared_stale, split),
                       "vs_colocated": _saving(shared_on, coloc),
                       "step_vs_split_async": _step_ratio(shared_stale, split),
                       "step_vs_colocated": _step_ratio(shared_on, coloc)}}


def _step_ratio(ours: ModeResult | None, base: ModeResult | None) -> float | None:
    if ours is None or base is None:
        return None
    return round(ours.mean("step_s") / base.mean("step_s"), 6)


def _experiment_json(s: Scenario, name: str, sized: dict[str, ModeResult],
                     fixed: dict[str, ModeResult]) -> dict:
    """One experiment's modes, searched and fixed, with savings; JSON-ready."""
    exp = s.experiments[name]
    table = s.sizes[s.workloads[exp.workloads[0]].model]
    modes = {m: mode_json(r) for m, r in sized.items()}
    for mode in modes:
        if mode in SHARED_MODES[:2]:  # the core placement's own choice, beside the search's
            modes[mode]["core_estimate_private_gpus"] = core_private_gpus(s, exp.workloads, mode, table)
    return {"model": s.models[s.workloads[exp.workloads[0]].model].name,
            "workloads": list(exp.workloads), "description": exp.description,
            "modes": modes,
            "fixed": {m: mode_json(r) for m, r in fixed.items()},
            "savings": savings(sized, fixed)}


def build_report(s: Scenario, seed: int, max_workers: int | None = None) -> tuple[dict, dict]:
    """The report dict, and the searched results per experiment (for plots and timelines).

    Every (experiment, mode, size) the search tries is one independent simulation; they run
    over the machine's cores (``map_runs``), then the shared modes' chosen sizes are run
    again per job alone for the slowdowns. Results do not depend on ``max_workers``.
    """
    workloads = {name: exp.workloads for name, exp in s.experiments.items()}
    tables = {name: s.sizes[s.workloads[w[0]].model] for name, w in workloads.items()}
    cells = [(name, mode) for name in s.experiments for mode in s.modes]
    tries = {(name, mode): try_sizes(s, mode, workloads[name]) for name, mode in cells}
    runs = [(s, mode, workloads[name], sizes, seed, False)
            for name, mode in cells for sizes in tries[(name, mode)]]
    ran = iter(map_runs(run_mode, runs, max_workers))
    tried = {cell: {sizes: next(ran) for sizes in tries[cell]} for cell in cells}
    sized = {cell: cheapest(tried[cell]) for cell in cells}
    fixed = {cell: tried[cell][fixed_sizes(tables[cell[0]])] for cell in cells}  # always tried
    # baseline modes share no worker group: their slowdown is 1 (D14)
    shared = sorted({(cell, pick[cell].chosen) for cell in cells if cell[1] in SHARED_MODES
                     for pick in (sized, fixed)}, key=str)
    steps = map_runs(alone_step_s, [(s, mode, workloads[name], sizes, seed) for (name, mode), sizes in shared],
                     max_workers)
    alone = dict(zip(shared, steps))
    for pick in (sized, fixed):
        for cell in cells:
            if cell[1] in SHARED_MODES:
                pick[cell] = slowed(pick[cell], alone[(cell, pick[cell].chosen)])
    for cell in cells:   # a job slowed beyond max_slowdown: the next cheapest size in bound
        if cell[1] in SHARED_MODES:
            sized[cell] = within_slowdown(s, tried[cell], workloads[cell[0]], seed, sized[cell])
    experiments, results, models, saved = {}, {}, {}, {}
    for name in s.experiments:
        results[name] = {mode: sized[(name, mode)] for mode in s.modes}
        experiments[name] = _experiment_json(s, name, results[name],
                                             {mode: fixed[(name, mode)] for mode in s.modes})
        model = experiments[name]["model"]
        if model not in models:
            models[model] = experiments[name]["modes"]
            saved[model] = experiments[name]["savings"]
    reference = {m: {"vs_split_async": REFERENCE_SAVING.get(m), "bubble_frac": REFERENCE_BUBBLE.get(m)}
                 for m in models}
    report = {"scenario": s.name, "seed": seed, "queue_policy": s.queue_policy,
              "max_slowdown": s.max_slowdown, "savings": saved, "models": models, "reference": reference,
              "experiments": experiments}
    return report, results


def _pct(x: float | None) -> str:
    return "  n/a" if x is None else f"{100 * x:5.1f}%"


def render_table(report: dict) -> str:
    """A plain-text summary: one block per model, then the savings beside the reference."""
    lines = [f"scenario {report['scenario']}  seed {report['seed']}  policy {report['queue_policy']}"]
    head = f"  {'mode':<17}{'GPU-h/step':>11}{'step s':>9}{'bubble':>8}{'decode':>8}{'slowdown':>9}  sizes"
    for model, modes in report["models"].items():
        lines += ["", model, head]
        for mode, r in modes.items():
            sizes = " ".join(f"{k}={v}" for k, v in r["sizes"].items())
            lines.append(f"  {mode:<17}{r['gpu_hours_per_step']:>11.3f}{r['step_s']:>9.1f}"
                         f"{_pct(r['bubble_frac']):>8}{_pct(r['decode_efficiency']):>8}"
                         f"{r['slowdown']:>9.3f}  {sizes}")
    lines += ["", f"  {'model':<22}{'vs split':>9}{'(fixed)':>9}{'ideal':>8}{'vs coloc':>9}{'ideal':>8}"
                  f"{'paper':>8}{'shared vs split':>16}{'vs coloc':>9}"]
    for model, sv in report["savings"].items():
        ref = report["reference"][model]["vs_split_async"]
        lines.append(f"  {model:<22}{_pct(sv['vs_split_async']):>9}{_pct(sv['vs_split_async_fixed']):>9}"
                     f"{_pct(sv['ideal_vs_split_async']):>8}{_pct(sv['vs_colocated']):>9}"
                     f"{_pct(sv['ideal_vs_colocated']):>8}{_pct(ref):>8}"
                     f"{_pct(sv['shared']['vs_split_async']):>16}{_pct(sv['shared']['vs_colocated']):>9}")
    lines += ["", "  experiments (plexrl: per-job slowdown against the job alone)"]
    for name, exp in report["experiments"].items():
        sv = exp["savings"]
        slow = " ".join(f"{job}={r['slowdown']:.3f}" for job, r in exp["modes"]["plexrl"]["jobs"].items()) \
            if "plexrl" in exp["modes"] else ""
        lines.append(f"  {name:<18} vs split {_pct(sv['vs_split_async'])}  vs coloc "
                     f"{_pct(sv['vs_colocated'])}  {slow}")
    return "\n".join(lines)
