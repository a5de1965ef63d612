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
"""

import argparse, json, statistics, sys, tempfile, time  # noqa: E401
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
    args = parser.parse_args()
    num_bytes = args.mb << 20
    key = "bench/policy/trainer/weights"
    root = Path(tempfile.mkdtemp(prefix="plexrl-bench-swap-", dir=SHM_ROOT))
    host, device = HostStore(root), DeviceMemory(2 * num_bytes)
    store = StateStore(device, host)
    try:
        init = torch.randn(num_bytes // 4, generator=torch.Generator().manual_seed(0))
        store.create(key, init)
        src, dst = torch.randn(num_bytes // 4), torch.empty(num_bytes // 4)
        dst.zero_()
        first_s = cycle(store, key)       # warm-up: allocates and touches the HOST file
        dst.copy_(src), dst.copy_(src)
        store_s, memcpy_s, fresh_s = [], [], []
        for _ in range(args.repeats):
            store_s.append(cycle(store, key))
            start = time.perf_counter()
            dst.copy_(src)
            dst.copy_(src)
            memcpy_s.append(time.perf_counter() - start)
            fresh_s.append(copy_into_fresh(src))
        ok_store = digest(store.tensor(key)) == digest(init)
        ok_memcpy = digest(dst) == digest(src)
        stats = store.stats()
    finally:
        host.close()
    store_gbs = 2 * num_bytes / statistics.median(store_s) / 1e9
    memcpy_gbs = 2 * num_bytes / statistics.median(memcpy_s) / 1e9
    ratio = statistics.median(m / s for m, s in zip(memcpy_s, store_s))  # pairwise: drift-proof
    fresh_gbs = 2 * num_bytes / statistics.median(fresh_s) / 1e9
    print(json.dumps({
        "state_mib": args.mb, "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
        "store_gbs": round(store_gbs, 2), "memcpy_gbs": round(memcpy_gbs, 2),
        "ratio": round(ratio, 3), "memcpy_fresh_pages_gbs": round(fresh_gbs, 2),
        "first_cycle_s": round(first_s, 4), "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO, "checksum_ok": ok_store and ok_memcpy,
        "device_buffers_allocated": stats.device.num_allocated,
        "host_buffers_allocated": stats.host_num_allocated,
        "store_cycle_s": [round(s, 4) for s in store_s],
        "memcpy_cycle_s": [round(s, 4) for s in memcpy_s]}))
    return 0 if ok_store and ok_memcpy else 1


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
