"""Tests of the DISK tier: spill files, their checksums, failed transitions, and a runtime whose
host memory is too small for two jobs, so the core spills one job's States to DISK.

Unit tests move real bytes between an emulated device, HOST files in /dev/shm and spill
files in a temp directory; sizes are KiB so they run in well under a second each.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

import grpo_like
from plexrl.errors import PlexError
from plexrl.protocol import Copy, Role, State, StateKey, Tier
from plexrl.runtime.tiers.device import DeviceMemory, DeviceOutOfMemory
from plexrl.runtime.tiers.disk import POINTS, DiskStore, xxh3
from plexrl.runtime.tiers.host import HostOutOfMemory, HostStore
from plexrl.runtime.models import model_spec
from plexrl.runtime.tiers.store import (ChecksumMismatch, InjectedFailure, NoDirectPath, StateStore,
                                        UnknownState)

KIB = 1 << 10
W = StateKey("job-1", Role.POLICY, Copy.TRAINER, State.WEIGHTS)
O = StateKey("job-1", Role.POLICY, Copy.TRAINER, State.OPTIMIZER)
OTHER = StateKey("job-10", Role.POLICY, Copy.TRAINER, State.WEIGHTS)


@pytest.fixture
def dirs():
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    host, spill = Path(tempfile.mkdtemp(prefix="plexrl-test-", dir=base)), Path(tempfile.mkdtemp())
    yield host, spill
    shutil.rmtree(host, ignore_errors=True)
    shutil.rmtree(spill, ignore_errors=True)


def make_store(dirs, fail_at=(), host_bytes=None, keep_older=False) -> StateStore:
    host, spill = dirs
    return StateStore(DeviceMemory(1 << 20), HostStore(host, host_bytes), keep_older,
                      disk=DiskStore(spill), fail_at=fail_at)


def ramp(num: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    values = torch.randn(num, generator=torch.Generator().manual_seed(seed)) * 1000
    return values.to(dtype)


def files(store: StateStore) -> list[str]:
    return sorted(p.name for p in store.disk.root.iterdir())


def books(store: StateStore) -> tuple:
    """Everything a failed transition must leave as it was (budgets, copies, files, names)."""
    s = store.stats()
    return (s.device.used_bytes, s.host_used_bytes, s.disk_used_bytes, s.disk_num_files,
            s.num_copies, tuple((k, tuple(store.copies(k))) for k in store.keys()),
            files(store), store.host.published())


def current_hash(store: StateStore, key) -> str:
    return xxh3(np.ascontiguousarray(store.read(key)).view(np.uint8))


# --- spill and restore ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_spill_restore_round_trip_is_bitwise_and_counted(dirs, dtype):
    store, init = make_store(dirs), ramp(4 * KIB, dtype)
    num_bytes = init.numel() * init.element_size()
    store.create(W, init)
    store.move(W, Tier.HOST)
    spilled = store.move(W, Tier.DISK)
    assert (spilled.src, spilled.dst, spilled.num_bytes) == (Tier.HOST, Tier.DISK, num_bytes)
    stats = store.stats()
    assert (stats.host_used_bytes, stats.disk_used_bytes, stats.disk_num_files) == \
        (0, num_bytes, 1)
    path = Path(store.location(W))
    assert path.parent == store.disk.root and path.suffix == ".safetensors"
    # a plain safetensors file: the State's bytes in its dtype, the hash in the metadata
    assert torch.equal(load_file(str(path))["data"], init)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["xxh3_64"] == spilled.checksum == xxh3(init.view(torch.uint8).numpy())
    assert (meta["key"], meta["version"]) == (str(W), str(spilled.version))
    if dtype != torch.bfloat16:                # numpy has no bfloat16 to read it as
        assert np.array_equal(store.read(W), init.numpy())
    restored = store.move(W, Tier.HOST)
    assert restored.checksum == spilled.checksum and restored.src == Tier.DISK
    assert files(store) == [] and store.stats().disk_used_bytes == 0
    store.move(W, Tier.DEVICE)
    assert torch.equal(store.tensor(W).view(dtype), init)


def test_device_and_disk_meet_only_through_host(dirs):
    store = make_store(dirs)
    store.create(W, ramp(KIB))
    with pytest.raises(NoDirectPath, match="DISK is reached only from HOST"):
        store.move(W, Tier.DISK)
    store.move(W, Tier.HOST)
    store.move(W, Tier.DISK)
    with pytest.raises(NoDirectPath, match="from disk to device"):
        store.move(W, Tier.DEVICE)
    assert store.where(W) == Tier.DISK and len(files(store)) == 1


def test_a_state_created_on_disk_restores_its_initial_bytes(dirs):
    store, init = make_store(dirs), ramp(KIB, seed=4)
    store.create(W, init, tier=Tier.DISK)
    store.create(O, 8 * KIB, tier=Tier.DISK)
    assert store.stats().disk_used_bytes == 12 * KIB and store.stats().host_used_bytes == 0
    store.move(W, Tier.HOST)
    store.move(O, Tier.HOST)
    assert np.array_equal(store.read(W), init.numpy())
    assert not store.read(O).any()


# --- checksums --------------------------------------------------------------------------------

def _flip_a_data_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x40
    path.write_bytes(raw)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _edit_the_stored_hash(path: Path) -> None:
    with safe_open(str(path), "pt") as f:
        stored = f.metadata()["xxh3_64"]
    forged = ("0" if stored[0] != "0" else "1") + stored[1:]
    path.write_bytes(path.read_bytes().replace(stored.encode(), forged.encode(), 1))


@pytest.mark.parametrize("corrupt", [_flip_a_data_byte, _truncate, _edit_the_stored_hash])
def test_a_corrupt_spill_file_is_refused_and_the_state_stays_on_disk(dirs, corrupt):
    store, init = make_store(dirs), ramp(2 * KIB, seed=1)
    store.create(W, init, tier=Tier.HOST)
    spilled = store.move(W, Tier.DISK)
    path = Path(store.location(W))
    corrupt(path)
    before = books(store)
    for _ in range(2):                          # refused every time, not once
        with pytest.raises(ChecksumMismatch) as err:
            store.move(W, Tier.HOST)
        assert books(store) == before and store.where(W) == Tier.DISK
    message = str(err.value)
    assert isinstance(err.value, PlexError) and isinstance(err.value, OSError)
    assert str(path) in message and spilled.checksum in message and "fix:" in message
    assert err.value.path == str(path) and err.value.expected == spilled.checksum
    assert err.value.actual and err.value.actual != spilled.checksum
    assert store.stats().host_used_bytes == 0   # the buffer it was read into went back


def test_a_stale_temp_file_of_a_dead_writer_is_removed_and_fsync_writes_the_same(dirs):
    host, spill = dirs
    (spill / ".job-1@3.safetensors.tmp").write_bytes(b"half a file")
    store = StateStore(DeviceMemory(1 << 20), HostStore(host), disk=DiskStore(spill, fsync=True))
    assert files(store) == []
    init = ramp(KIB, seed=2)
    store.create(W, init, tier=Tier.HOST)
    store.move(W, Tier.DISK)
    store.move(W, Tier.HOST)
    assert np.array_equal(store.read(W), init.numpy())


# --- failed transitions -----------------------------------------------------------------------

_SOURCE = {"offload": Tier.DEVICE, "onload": Tier.HOST, "spill": Tier.HOST, "restore": Tier.DISK}
_DEST = {"offload": Tier.HOST, "onload": Tier.DEVICE, "spill": Tier.DISK, "restore": Tier.HOST}


def _put(store: StateStore, key, tier: Tier) -> None:
    """Bring ``key`` to ``tier`` by the ordinary path (DEVICE -> HOST -> DISK)."""
    if tier in (Tier.HOST, Tier.DISK):
        store.move(key, Tier.HOST)
    if tier == Tier.DISK:
        store.move(key, Tier.DISK)


@pytest.mark.parametrize("point", POINTS)
def test_an_injected_failure_leaves_the_previous_copy_current_and_good(dirs, point):
    kind = point.partition(":")[0]
    store, init = make_store(dirs), ramp(8 * KIB, seed=5)
    store.create(W, init)
    store.create(O, ramp(2 * KIB, seed=6))      # a bystander on the same tiers
    _put(store, W, _SOURCE[kind])
    _put(store, O, Tier.DISK)
    before, digest = books(store), current_hash(store, W)
    assert digest == xxh3(init.view(torch.uint8).numpy())
    store.fail.arm(point)
    with pytest.raises(InjectedFailure, match=point):
        store.move(W, _DEST[kind])
    # the previous copy is current, on its tier, its bytes unchanged; the partial copy is
    # gone and every budget, file and name is as before
    assert store.where(W) == _SOURCE[kind] and books(store) == before
    assert current_hash(store, W) == digest
    assert not [p for p in store.disk.root.iterdir() if p.name.startswith(".")]
    # ... and it is loadable: the same move again (the point fired once) lands the same bytes
    store.move(W, _DEST[kind])
    if store.where(W) == Tier.DISK:
        store.move(W, Tier.HOST)
    if store.where(W) == Tier.HOST:
        store.move(W, Tier.DEVICE)
    assert torch.equal(store.tensor(W), init)
    assert current_hash(store, W) == digest


def test_failure_points_are_named_at_construction_and_fire_once(dirs):
    with pytest.raises(ValueError, match="known: offload:mid_copy"):
        make_store(dirs, fail_at=("spill:nowhere",))
    store = make_store(dirs, fail_at=("spill:after_rename", "restore:mid_copy"))
    store.create(W, ramp(KIB), tier=Tier.HOST)
    with pytest.raises(InjectedFailure, match="spill:after_rename"):
        store.move(W, Tier.DISK)
    assert files(store) == [] and store.where(W) == Tier.HOST
    store.move(W, Tier.DISK)
    with pytest.raises(InjectedFailure, match="restore:mid_copy"):
        store.move(W, Tier.HOST)
    store.move(W, Tier.HOST)
    assert store.fail.armed == set()


def test_a_failed_restore_with_host_full_changes_nothing(dirs):
    store = make_store(dirs, host_bytes=8 * KIB)
    store.create(W, ramp(KIB), tier=Tier.HOST)
    store.move(W, Tier.DISK)
    store.create(O, 8 * KIB, tier=Tier.HOST)     # host is now full
    before = books(store)
    with pytest.raises(HostOutOfMemory):
        store.move(W, Tier.HOST)
    assert books(store) == before


# --- forget, drop, a property over random operations ------------------------------------------

def test_forget_and_drop_remove_spill_files(dirs):
    store = make_store(dirs, keep_older=True)
    for key in (W, O, OTHER):
        store.create(key, 4 * KIB, tier=Tier.HOST)
        store.move(key, Tier.DISK)               # the HOST copy stays as an older copy
    store.move(W, Tier.HOST)                     # v3 on HOST current; v2 on DISK older
    assert len(files(store)) == 3
    assert store.forget("job-1") == 5 * 4 * KIB  # W: host v1, disk v2, host v3; O: host, disk
    assert files(store) == [Path(store.location(OTHER)).name]
    store.release(OTHER, 1)
    store.drop(OTHER)
    assert files(store) == [] and store.stats().disk_used_bytes == 0
    assert store.stats().host_used_bytes == 0


OPS = st.lists(st.tuples(st.sampled_from(["create", "device", "host", "disk", "drop",
                                          "release"]),
                         st.integers(0, 2), st.integers(1, 4)), max_size=25)


@given(OPS, st.booleans())
def test_random_operations_keep_one_file_per_disk_copy(ops, keep_older):
    host, spill = (Path(tempfile.mkdtemp(dir="/dev/shm")), Path(tempfile.mkdtemp()))
    try:
        store = make_store((host, spill), host_bytes=8 * 4096, keep_older=keep_older)
        for op, k, size in ops:
            key = f"job-{k}/policy/trainer/weights"
            try:
                if op == "create":
                    store.create(key, size * 4096)
                elif op == "release":
                    older = [c.version for c in store.copies(key) if not c.current]
                    if older:
                        store.release(key, older[0])
                elif op == "drop":
                    store.drop(key)
                else:
                    store.move(key, Tier(op))
            except (DeviceOutOfMemory, HostOutOfMemory, UnknownState, NoDirectPath, ValueError):
                pass
            on_disk = [(k, c) for k in store.keys() for c in store.copies(k)
                       if c.tier == Tier.DISK]
            assert store.stats().disk_used_bytes == sum(c.num_bytes for _, c in on_disk)
            assert len(files(store)) == len(on_disk) == store.stats().disk_num_files
    finally:
        shutil.rmtree(host, ignore_errors=True)
        shutil.rmtree(spill, ignore_errors=True)


# --- the runtime: host memory too small for two jobs, so the core spills ----------------------

SPEC = model_spec("policy", source="tiny-qwen2")
P = int(SPEC.total_params)
OPTIMIZER = 8 * P + 4
JOB_BYTES = 4 * P + 4 * P + OPTIMIZER + 4 * P      # trainer weights, grads, optimizer; rollout
DEVICE = JOB_BYTES + 300_000                         # one job and its largest call's workspace
HOST = JOB_BYTES + 4 * P                             # one job's States, not two jobs' optimizers
SEEDS = {"a": 1, "b": 2}


def _steps(runtime, order, tmp_path, tag, ends=()):
    """Register each job just before its first step, run ``order``; return step records and
    the saved state of each job."""
    jobs, records = {}, {name: [] for name in SEEDS}
    for name, k in order:
        if name not in jobs:
            jobs[name] = runtime.register_job(name, {"policy": SPEC}, seed=SEEDS[name])
        records[name].append(grpo_like.step(jobs[name], k))
    saved = {}
    for name, job in jobs.items():
        path = tmp_path / f"{tag}-{name}.safetensors"
        job.save(str(path)).result()
        saved[name] = load_file(str(path))
    return records, saved, jobs


def test_runtime_sizes_force_a_spill():
    assert JOB_BYTES <= HOST < JOB_BYTES + OPTIMIZER < 2 * JOB_BYTES
    assert JOB_BYTES < DEVICE < JOB_BYTES + 4 * P


def test_runtime_spills_when_host_is_short_and_results_equal_alone_despite_failures(connect,
                                                                                    tmp_path):
    order = [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    spill_root = tmp_path / "spill"
    failing = ("onload:mid_copy", "spill:mid_write", "restore:mid_copy")   # each fires once
    shared = connect(device_bytes=DEVICE, host_bytes=HOST, spill_root=str(spill_root),
                     fail_at=failing)
    records, saved, jobs = _steps(shared, order, tmp_path, "shared")
    failed = shared.inspect("failed-transitions")   # replanned, then done: results unchanged
    assert sorted((f["src"], f["dst"]) for f in failed) == \
        [("disk", "host"), ("host", "device"), ("host", "disk")]
    moves = shared.inspect("transitions")
    spills = [m for m in moves if m["dst"] == "disk"]
    restores = [m for m in moves if m["src"] == "disk"]
    assert spills and restores, "the core never spilled: host memory was not short"
    assert all(m["reason"] == "spill" and m["src"] == "host" for m in spills)
    assert all(m["reason"] == "restore" and m["dst"] == "host" for m in restores)
    for m in restores:                           # what comes back is what went out
        out = [s for s in spills if s["key"] == m["key"] and s["end_s"] < m["end_s"]][-1]
        assert m["checksum"] == out["checksum"] and m["src_ptr"] == out["dst_ptr"]
        assert m["src_ptr"].startswith(str(spill_root))
    alone = {}
    for name in SEEDS:                           # each job alone, on a runtime of its own
        solo = connect(device_bytes=DEVICE, host_bytes=HOST, spill_root=str(tmp_path / name))
        alone[name] = _steps(solo, [s for s in order if s[0] == name], tmp_path, "alone")
        assert not [m for m in solo.inspect("transitions") if "disk" in (m["src"], m["dst"])]
    for name in SEEDS:
        solo_records, solo_saved, _ = alone[name]
        for k, (x, y) in enumerate(zip(solo_records[name], records[name])):
            for field in ("tokens", "gen_logprobs", "old_logprobs"):
                assert np.array_equal(x[field], y[field]), (name, k, field)
        for key in ("weights", "optimizer", "grads", "generator"):
            assert torch.equal(solo_saved[name][key], saved[name][key]), (name, key)
    # a job that ends with States on DISK leaves no spill file behind
    on_disk = {k for k, (tier, *_) in shared.inspect("status")["states"].items()
               if tier == "disk"}
    (spill_dir,) = spill_root.glob("plexrl-*/*/wg0")
    assert on_disk and len(list(spill_dir.iterdir())) == len(on_disk)
    for name, job in jobs.items():
        job.end()
        assert not [p for p in spill_dir.iterdir() if p.name.startswith(f"{name}%2F")]
    assert list(spill_dir.iterdir()) == []
