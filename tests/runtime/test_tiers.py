"""Tests of the runtime's state storage: DeviceMemory, HostStore and StateStore.

Real bytes move between real buffers here (an emulated device in RAM, HOST files in
/dev/shm); sizes are KiB to a few MiB so the module runs in seconds.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from plexrl.errors import PlexError
from plexrl.protocol import Copy, Role, State, StateKey, Tier
from plexrl.runtime.tiers.device import DeviceMemory, DeviceOutOfMemory, dispatch_reserve_bytes
from plexrl.runtime.tiers.host import HostOutOfMemory, HostStore
from plexrl.runtime.tiers.store import NoDirectPath, NotResident, StateBusy, StateStore, UnknownState

MIB = 1 << 20
W = StateKey("job-1", Role.POLICY, Copy.TRAINER, State.WEIGHTS)
G = StateKey("job-1", Role.POLICY, Copy.TRAINER, State.GRADS)
OTHER = StateKey("job-10", Role.POLICY, Copy.TRAINER, State.WEIGHTS)


def shm_dir() -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    return Path(tempfile.mkdtemp(prefix="plexrl-test-", dir=base))


@pytest.fixture
def root():
    path = shm_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_store(root: Path, device_bytes: int = 64 * MIB, host_bytes: int | None = None,
               keep_older: bool = False) -> StateStore:
    return StateStore(DeviceMemory(device_bytes), HostStore(root, host_bytes), keep_older)


def ramp(num_floats: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_floats, generator=torch.Generator().manual_seed(seed))


def books(store: StateStore) -> tuple:
    """Everything an operation that failed must leave as it was."""
    s = store.stats()
    return (s.device.used_bytes, s.device.reserved_bytes, s.host_used_bytes, s.num_copies,
            tuple((k, tuple(store.copies(k))) for k in store.keys()))


# --- moves really copy, into distinct reused buffers ------------------------------------------

def test_offload_onload_keeps_bytes_in_distinct_reused_buffers(root):
    store, init = make_store(root), ramp(MIB // 4)
    store.create(W, init)
    device_ptr = store.tensor(W).data_ptr()
    store.move(W, Tier.HOST)
    host_ptr = store.host.buffer_of(str(W), 2).tensor.data_ptr()
    assert host_ptr != device_ptr
    assert np.array_equal(store.read(W), init.numpy())
    for _ in range(20):
        out = store.move(W, Tier.DEVICE)
        assert out.num_bytes == MIB and out.src == Tier.HOST and out.seconds >= 0
        assert store.tensor(W).data_ptr() == device_ptr     # the same device buffer again
        store.move(W, Tier.HOST)
        assert store.host.buffer_of(str(W), store.copies(W)[0].version).tensor.data_ptr() \
            == host_ptr
    store.move(W, Tier.DEVICE)
    assert torch.equal(store.tensor(W), init)
    stats = store.stats()
    assert stats.device.num_allocated == 1 and stats.host_num_allocated == 1


def test_compute_writes_travel_with_the_state(root):
    store = make_store(root)
    store.create(W, 4 * 1024)
    store.tensor(W).add_(3.0)
    store.move(W, Tier.HOST)
    with pytest.raises(NotResident, match="on host"):
        store.tensor(W)
    store.move(W, Tier.DEVICE)
    assert torch.equal(store.tensor(W), torch.full((1024,), 3.0))


# --- budgets ----------------------------------------------------------------------------------

def test_device_budget_exceeded_raises_and_changes_nothing(root):
    store = make_store(root, device_bytes=3 * MIB)
    store.create(W, 2 * MIB)
    store.create(G, 2 * MIB, tier=Tier.HOST)
    before = books(store)
    with pytest.raises(DeviceOutOfMemory) as err:
        store.move(G, Tier.DEVICE)
    assert isinstance(err.value, PlexError) and isinstance(err.value, MemoryError)
    assert (err.value.need_bytes, err.value.used_bytes, err.value.budget_bytes) == \
        (2 * MIB, 2 * MIB, 3 * MIB)
    assert str(2 * MIB) in str(err.value) and str(3 * MIB) in str(err.value)
    assert books(store) == before
    with pytest.raises(DeviceOutOfMemory):
        store.device.reserve("call-7", 2 * MIB)
    assert books(store) == before
    store.move(W, Tier.HOST)                  # make room: now it fits
    store.move(G, Tier.DEVICE)
    assert store.where(G) == Tier.DEVICE


def test_reserve_counts_against_the_budget_until_released(root):
    store = make_store(root, device_bytes=4 * MIB)
    need = dispatch_reserve_bytes(kv_bytes_per_token=1024, batch=8, prompt_tokens=64,
                                  max_tokens=192, activation_bytes=MIB)
    assert need == 1024 * 8 * 256 + MIB
    store.device.reserve("call-1", need)
    with pytest.raises(DeviceOutOfMemory, match="3145728 B reserved"):
        store.create(W, 2 * MIB)
    store.device.release_reserve("call-1")
    store.create(W, 2 * MIB)


def test_pooled_buffers_are_trimmed_so_held_memory_stays_in_budget(root):
    store = make_store(root, device_bytes=4 * MIB)
    store.create(W, 3 * MIB)
    store.move(W, Tier.HOST)                  # the 3 MiB device buffer is now pooled
    store.create(G, 2 * MIB)                  # a new size: the pooled buffer must go
    dev = store.stats().device
    assert dev.used_bytes == 2 * MIB and dev.pooled_bytes == 0
    assert dev.used_bytes + dev.reserved_bytes + dev.pooled_bytes <= dev.budget_bytes


def test_host_budget_exceeded_raises_and_changes_nothing(root):
    store = make_store(root, host_bytes=3 * MIB)
    store.create(W, 2 * MIB)
    store.create(G, 2 * MIB)
    store.move(W, Tier.HOST)
    before = books(store)
    with pytest.raises(HostOutOfMemory, match="fix:"):
        store.move(G, Tier.HOST)
    assert books(store) == before


# --- versions ---------------------------------------------------------------------------------

def test_older_copy_is_read_only_and_counted_until_released(root):
    store, init = make_store(root, keep_older=True), ramp(MIB // 4)
    store.create(W, init)
    store.move(W, Tier.HOST)                  # v1 on device stays, read-only
    assert [(c.tier, c.version, c.current) for c in store.copies(W)] == \
        [(Tier.HOST, 2, True), (Tier.DEVICE, 1, False)]
    stats = store.stats()
    assert stats.device.used_bytes == MIB and stats.host_used_bytes == MIB
    assert stats.num_copies == 2 and stats.num_older == 1
    older = store.read(W, version=1)
    assert np.array_equal(older, init.numpy())
    with pytest.raises(ValueError, match="read-only"):
        older[0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        store.read(W)[0] = 1.0                # the current copy read through read() as well
    with pytest.raises(NotResident):
        store.tensor(W)                       # an older DEVICE copy is never computed on
    store.release(W, 1)
    assert store.stats().device.used_bytes == 0 and store.stats().num_older == 0
    with pytest.raises(UnknownState):
        store.release(W, 1)


def test_a_published_host_copy_is_mapped_read_only(root):
    store, init = make_store(root), ramp(1024)
    store.create(W, init, tier=Tier.HOST)
    view = store.host.open_published(str(W))
    assert np.array_equal(view.view(np.float32), init.numpy())
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1


# --- HOST outlives the process that wrote it --------------------------------------------------

def _write_then_die(root: str, key: str) -> None:
    store = StateStore(DeviceMemory(8 * MIB), HostStore(root))
    store.create(key, ramp(MIB // 4, seed=7))
    store.move(key, Tier.HOST)
    store.save_rng("job-1", torch.Generator().manual_seed(11))
    os._exit(0)                               # no close, no clean-up: a dead service


def test_host_copy_survives_its_writer_and_reopens_by_name(root):
    child = multiprocessing.get_context("spawn").Process(target=_write_then_die,
                                                         args=(str(root), str(W)))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    expected = ramp(MIB // 4, seed=7)
    host = HostStore(root)
    assert np.array_equal(host.open_published(str(W)).view(np.float32), expected.numpy())
    store = StateStore.reopen(DeviceMemory(8 * MIB), host)
    assert store.where(W) == Tier.HOST and store.stats().host_used_bytes == MIB
    store.move(W, Tier.DEVICE)
    assert torch.equal(store.tensor(W), expected)
    gen = torch.Generator()
    assert store.load_rng("job-1", gen)
    assert torch.equal(torch.rand(4, generator=gen),
                       torch.rand(4, generator=torch.Generator().manual_seed(11)))
    store.move(W, Tier.HOST)                  # the adopted buffer is reused, not a new file
    assert store.stats().host_num_allocated == 0


# --- forget, drop, busy, tiers ----------------------------------------------------------------

def test_forget_releases_every_copy_buffer_name_and_slot(root):
    store = make_store(root, keep_older=True)
    store.create(W, MIB)
    store.create(G, MIB, tier=Tier.HOST)
    store.create(OTHER, MIB)                  # job-10 shares the prefix text, not the job
    store.move(W, Tier.HOST)
    store.save_rng("job-1", torch.Generator())
    assert store.forget("job-1") == 3 * MIB
    assert store.keys() == [str(OTHER)]
    stats = store.stats()
    assert stats.device.used_bytes == MIB and stats.host_used_bytes == 0
    assert list(store.host.published()) == [] and store.load_rng("job-1", torch.Generator()) \
        is False
    store.host.close()
    assert not root.exists()


def test_drop_keeps_the_state_known_and_rebuilds_zeroed(root):
    store = make_store(root)
    store.create(W, 4096)
    store.tensor(W).fill_(5.0)
    store.drop(W)
    assert store.where(W) == Tier.DROPPED and store.stats().device.used_bytes == 0
    out = store.move(W, Tier.DEVICE)
    assert out.num_bytes == 0 and torch.count_nonzero(store.tensor(W)) == 0


def test_a_pinned_state_does_not_move_and_device_does_not_spill_directly(root):
    store = make_store(root)
    store.create(W, 4096)
    with store.use(W) as (weights,):
        weights.add_(1.0)
        with pytest.raises(StateBusy, match="pinned"):
            store.move(W, Tier.HOST)
        with pytest.raises(StateBusy):
            store.forget("job-1")
    with pytest.raises(NoDirectPath, match="fix: move it to host first"):
        store.move(W, Tier.DISK)              # DISK is reached only through HOST
    with pytest.raises(ValueError, match="no spill directory"):
        store.create(OTHER, 4096, tier=Tier.DISK)
    assert store.where(W) == Tier.DEVICE and store.stats().device.used_bytes == 4096
    store.move(W, Tier.HOST)


def test_concurrent_moves_and_compute_on_other_keys_do_not_corrupt(root):
    store, init = make_store(root), ramp(MIB // 4, seed=3)
    store.create(W, init)
    store.create(G, 64 * 1024)
    errors = []

    def mover():
        try:
            for _ in range(30):
                store.move(W, Tier.HOST)
                store.move(W, Tier.DEVICE)
        except BaseException as exc:  # noqa: BLE001 -- reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=mover)
    thread.start()
    for _ in range(300):
        with store.use(G) as (grads,):
            grads.add_(1.0)
    thread.join()
    assert not errors
    assert torch.equal(store.tensor(W), init)
    assert torch.equal(store.tensor(G), torch.full((16 * 1024,), 300.0))


# --- a property: random operations never break the books --------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["create", "device", "host", "drop", "release",
                                          "reserve"]),
                         st.integers(0, 2), st.integers(1, 4)), max_size=25)


@given(OPS, st.booleans())
def test_random_operations_keep_budgets_and_one_current_copy(ops, keep_older):
    path = shm_dir()
    try:
        store = make_store(path, device_bytes=8 * 4096, host_bytes=8 * 4096,
                           keep_older=keep_older)
        for op, k, size in ops:
            key = f"job-{k}/policy/trainer/weights"
            try:
                apply_op(store, op, key, size * 4096)
            except (DeviceOutOfMemory, HostOutOfMemory, UnknownState, ValueError):
                pass
            check_books(store)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def apply_op(store: StateStore, op: str, key: str, num_bytes: int) -> None:
    if op == "create":
        store.create(key, num_bytes)
    elif op in ("device", "host"):
        store.move(key, Tier(op))
    elif op == "drop":
        store.drop(key)
    elif op == "release":
        older = [c.version for c in store.copies(key) if not c.current]
        if older:
            store.release(key, older[0])
    else:
        store.device.release_reserve("r") if store.device.reserved_bytes else \
            store.device.reserve("r", num_bytes)


def check_books(store: StateStore) -> None:
    dev = store.stats().device
    assert dev.used_bytes + dev.reserved_bytes + dev.pooled_bytes <= dev.budget_bytes
    copies = {k: store.copies(k) for k in store.keys()}
    for key, cs in copies.items():
        assert sum(c.current for c in cs) == (0 if store.where(key) == Tier.DROPPED else 1)
    on = {t: sum(c.num_bytes for cs in copies.values() for c in cs if c.tier == t)
          for t in (Tier.DEVICE, Tier.HOST)}
    assert dev.used_bytes == on[Tier.DEVICE]
    assert store.stats().host_used_bytes == on[Tier.HOST] <= store.host.budget_bytes
    assert store.host.published() == {k: [c.version for c in sorted(cs, key=lambda c:
                                                                      c.version)
                                           if c.tier == Tier.HOST]
                                       for k, cs in copies.items()
                                       if any(c.tier == Tier.HOST for c in cs)}


def test_a_move_in_flight_holds_no_lock_over_other_states(root):
    store = make_store(root)
    store.create(W, MIB)
    store.create(G, 4096)
    in_copy, go_on = threading.Event(), threading.Event()
    publish = store.host.publish

    def slow_publish(*args):                  # runs after the copy, before the books close
        in_copy.set()
        assert go_on.wait(30)
        publish(*args)

    store.host.publish = slow_publish
    thread = threading.Thread(target=store.move, args=(W, Tier.HOST))
    thread.start()
    assert in_copy.wait(30)
    with store.use(G) as (grads,):            # another State computes meanwhile
        grads.add_(1.0)
    with pytest.raises(StateBusy, match="moving"):
        store.tensor(W)
    assert store.where(W) == Tier.DEVICE      # still current until the move completes
    go_on.set()
    thread.join()
    assert store.where(W) == Tier.HOST
