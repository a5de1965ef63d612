"""What the demo writes into ``--out``: reward curves (PNG) and a timeline (Perfetto JSON).

Owns: ``write_curves`` (one panel per job: reward per GRPO step, shared run and, when the
record has them, the isolated run) and ``write_timeline`` (one track per worker group; each
call a span named ``<job> <function>``, category the job). Must not know: the runtime or how
the figures were measured.
"""

from __future__ import annotations

from pathlib import Path

from plexrl.timeline import Timeline


def write_curves(path: Path, shared: dict[str, list[float]],
                 isolated: dict[str, list[float]] | None = None) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(shared), figsize=(4 * len(shared), 3.2), squeeze=False)
    for ax, (name, rewards) in zip(axes[0], shared.items()):
        ax.plot(range(1, len(rewards) + 1), rewards, label="shared", lw=1)
        if isolated and name in isolated:
            ax.plot(range(1, len(isolated[name]) + 1), isolated[name], label="isolated", lw=1,
                    alpha=0.7)
        ax.set_title(name)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("mean reward")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_timeline(path: Path, calls: list[dict], prefix_strip: str = "") -> Path:
    """Spans of ``calls`` (the controller's call log), time 0 at the first call's start."""
    timeline = Timeline()
    origin = min((c["start_s"] for c in calls), default=0.0)
    for call in sorted(calls, key=lambda c: c["start_s"]):
        track = timeline.track(call["wg"], group="worker groups")
        job = call["job"].removeprefix(prefix_strip)
        timeline.span(track, f"{job} {call['function']}", call["start_s"] - origin,
                      call["end_s"] - call["start_s"], category=job,
                      args={"step": call["step"], "queued_s": round(call["start_s"]
                                                                    - call["queued_s"], 6),
                            "failed": call["failed"]})
    return timeline.write(path)
