"""Benchmark: offload + onload of one State through the StateStore against plain memcpy.

One State of --mb MiB (default 256) is created on an emulated DEVICE; a cycle is
move(HOST) then move(DEVICE), two copies of the State's bytes into reused, pre-touched
buffers (the HOST one a file in /dev/shm). The in-run baseline is two ``copy_`` calls of the
same bytes between two pre-touched CPU tensors. --repeats cycles of each, interleaved after
one untimed warm-up. Per side: the median cycle's bandwidth (bytes copied / wall seconds of
the whole move calls, bookkeeping included). The ratio is the median over cycles of memcpy
seconds / store seconds, each pair run back to back (robust to a shared machine's drift).
After the timed loop, xxhash64 of the State's current bytes must equal the original's, and of
the baseline's destination its source's. Also measured: the same copies into fresh
(untouched) pages, and the first cycle, which creates the HOST file. Prints one JSON object;
ratio target >= 0.8; exit 1 if a checksum differs.

``--ranks R`` (R > 1) also runs the swap of a worker group of R ranks in the same run: R
processes, each with its own StateStore holding 1/R of the same total bytes (its shard), all
starting each cycle together at a barrier, as a group's ranks move their shards at once. A
group cycle lasts as long as its slowest rank's; its memcpy baseline is each rank copying its
own bytes at the same time. Printed under ``"ranks"``: per side the group's bandwidth, its
ratio to its memcpy, and the group's speed against the one rank above.
"""

import argparse, json, multiprocessing, statistics, sys, tempfile, time  # noqa: E401
from pathlib import Path

import torch
import xxhash

from plexrl.protocol import Tier
from plexrl.runtime.tiers.device import DeviceMemory
from plexrl.runtime.tiers.host import SHM_ROOT, HostStore
from plexrl.runtime.tiers.store import StateStore

TARGET_RATIO = 0.8


def digest(t: torch.Tensor) -> str:
    return xxhash.xxh64(t.contiguous().view(torch.uint8).numpy()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="State size, MiB")
    parser.add_argument("--repeats", type=int, default=20, help="timed cycles per side")
    parser.add_argument("--ranks", type=int, default=1,
                        help="also swap the same bytes split over this many ranks at once")
    args = parser.parse_args()
    num_bytes = args.mb << 20
    one = measure(num_bytes, args.repeats)
    store_s, memcpy_s, fresh_s, first_s = (one["store_s"], one["memcpy_s"], one["fresh_s"],
                                           one["first_s"])
    ok_store, ok_memcpy, stats = one["ok_store"], one["ok_memcpy"], one["stats"]
    store_gbs = 2 * num_bytes / statistics.median(store_s) / 1e9
    memcpy_gbs = 2 * num_bytes / statistics.median(memcpy_s) / 1e9
    ratio = statistics.median(m / s for m, s in zip(memcpy_s, store_s))  # pairwise: drift-proof
    fresh_gbs = 2 * num_bytes / statistics.median(fresh_s) / 1e9
    out = {
        "state_mib": args.mb, "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
        "store_gbs": round(store_gbs, 2), "memcpy_gbs": round(memcpy_gbs, 2),
        "ratio": round(ratio, 3), "memcpy_fresh_pages_gbs": round(fresh_gbs, 2),
        "first_cycle_s": round(first_s, 4), "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO, "checksum_ok": ok_store and ok_memcpy,
        "device_buffers_allocated": stats.device.num_allocated,
        "host_buffers_allocated": stats.host_num_allocated,
        "store_cycle_s": [round(s, 4) for s in store_s],
        "memcpy_cycle_s": [round(s, 4) for s in memcpy_s]}
    if args.ranks > 1:
        group = measure_ranks(num_bytes, args.repeats, args.ranks)
        ok_store = ok_store and group["checksum_ok"]
        group["vs_one_rank"] = round(statistics.median(
            s1 / s2 for s1, s2 in zip(store_s, group.pop("store_cycle_s"))), 3)
        out["ranks"] = group
    print(json.dumps(out))
    return 0 if ok_store and ok_memcpy else 1


def measure(num_bytes: int, repeats: int, barrier=None) -> dict:
    """``repeats`` store cycles and memcpy pairs of ``num_bytes`` (each started at
    ``barrier`` when given, with the other ranks)."""
    key = "bench/policy/trainer/weights"
    root = Path(tempfile.mkdtemp(prefix="plexrl-bench-swap-", dir=SHM_ROOT))
    host, device = HostStore(root), DeviceMemory(2 * num_bytes)
    store = StateStore(device, host)
    wait = barrier.wait if barrier is not None else (lambda: None)
    try:
        init = torch.randn(num_bytes // 4, generator=torch.Generator().manual_seed(0))
        store.create(key, init)
        src, dst = torch.randn(num_bytes // 4), torch.empty(num_bytes // 4)
        dst.zero_()
        first_s = cycle(store, key)       # warm-up: allocates and touches the HOST file
        dst.copy_(src), dst.copy_(src)
        store_s, memcpy_s, fresh_s = [], [], []
        for _ in range(repeats):
            wait()
            store_s.append(cycle(store, key))
            wait()
            start = time.perf_counter()
            dst.copy_(src)
            dst.copy_(src)
            memcpy_s.append(time.perf_counter() - start)
            if barrier is None:
                fresh_s.append(copy_into_fresh(src))
        return {"store_s": store_s, "memcpy_s": memcpy_s, "fresh_s": fresh_s,
                "first_s": first_s, "ok_store": digest(store.tensor(key)) == digest(init),
                "ok_memcpy": digest(dst) == digest(src), "stats": store.stats()}
    finally:
        host.close()


def _rank(num_bytes: int, repeats: int, barrier, answers) -> None:
    torch.set_num_threads(1)   # as a rank's service runs (OMP_NUM_THREADS=1 in its actor)
    out = measure(num_bytes, repeats, barrier)
    answers.put({k: v for k, v in out.items() if k != "stats"})


def measure_ranks(num_bytes: int, repeats: int, ranks: int) -> dict:
    """The same bytes split over ``ranks`` processes that swap their shards at once."""
    context = multiprocessing.get_context("spawn")
    barrier, answers = context.Barrier(ranks), context.Queue()
    share = -(-num_bytes // ranks // 4) * 4
    workers = [context.Process(target=_rank, args=(share, repeats, barrier, answers))
               for _ in range(ranks)]
    for worker in workers:
        worker.start()
    results = [answers.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    store_s = [max(r["store_s"][i] for r in results) for i in range(repeats)]   # slowest rank
    memcpy_s = [max(r["memcpy_s"][i] for r in results) for i in range(repeats)]
    return {"ranks": ranks, "bytes_per_rank": share,
            "store_gbs": round(2 * share * ranks / statistics.median(store_s) / 1e9, 2),
            "memcpy_gbs": round(2 * share * ranks / statistics.median(memcpy_s) / 1e9, 2),
            "ratio": round(statistics.median(m / s for m, s in zip(memcpy_s, store_s)), 3),
            "checksum_ok": all(r["ok_store"] and r["ok_memcpy"] for r in results),
            "store_cycle_s": store_s}


def copy_into_fresh(src: torch.Tensor) -> float:
    """Two copies of ``src`` into newly allocated, untouched tensors: why buffers are reused."""
    start = time.perf_counter()
    for _ in range(2):
        torch.empty_like(src).copy_(src)
    return time.perf_counter() - start


def cycle(store: StateStore, key: str) -> float:
    """Offload then onload ``key``; wall seconds of both move calls."""
    start = time.perf_counter()
    store.move(key, Tier.HOST)
    store.move(key, Tier.DEVICE)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
