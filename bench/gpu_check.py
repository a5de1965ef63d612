"""The GPU check of worker groups of several devices: run it on a node with CUDA GPUs.

Starts the runtime on the GPUs Ray finds (one rank per GPU, ``--ranks`` of them in one worker
group) and runs, printing one JSON object:

- ``sharded``: ``bench/sharded.py``'s comparison (SFT steps on the group against one device);
- ``swap``: ``bench/swap.py --ranks``'s cycle (offload + onload of each rank's shard);
- ``equivalence``: two jobs sharing the group against each alone on it (bitwise weights).

Without CUDA it prints ``{"ran": false, ...}`` and exits 0: the check needs a GPU. What it
reports as ``engine_device`` is where the engine's tensors live: the engine computes on the
host today (the DEVICE tier is a budget over host memory) and the ranks talk over gloo, so on a
GPU node this check measures the same code paths with the GPUs reserved, not CUDA kernels
(docs/design.md, "Worker groups of many devices").
"""

import argparse, json, subprocess, sys  # noqa: E401
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _json_of(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return {**(json.loads(lines[-1]) if lines else {"stderr": done.stderr[-2000:]}),
            "exit_code": done.returncode}


def _equivalence(ranks: int) -> dict:
    """Two jobs sharing a group of ``ranks`` devices end bitwise where each ends alone."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(HERE.parent / "tests/runtime/test_equivalence.py"), "-k",
                           f"bitwise_equal_to_alone and {ranks}"],
                          capture_output=True, text=True, timeout=1200)
    return {"passed": done.returncode == 0, "tail": done.stdout.strip().splitlines()[-1:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"ran": False, "needs": "a CUDA GPU (torch.cuda.is_available() is "
                          "False here)", "torch": torch.__version__}))
        return 0
    out = {"ran": True, "gpus": torch.cuda.device_count(),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "engine_device": "cpu", "backend": "gloo"}
    out["sharded"] = _json_of([sys.executable, str(HERE / "sharded.py"), "--ranks",
                               str(args.ranks)])
    out["swap"] = _json_of([sys.executable, str(HERE / "swap.py"), "--ranks", str(args.ranks),
                            "--repeats", "5"])
    out["equivalence"] = _equivalence(args.ranks)
    print(json.dumps(out))
    ok = out["sharded"].get("meets_target") and out["swap"].get("checksum_ok") and \
        out["equivalence"]["passed"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
