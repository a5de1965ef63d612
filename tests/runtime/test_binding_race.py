"""A job ended while its States are being made (an operator's cancel, a lease, a lost
service) leaves nothing on its services, and its registration gets the error instead of
waiting forever. The controller runs here without Ray: its executor is a fake whose binds
wait until the test lets them finish, so the end lands in the middle of binding for sure.
"""

from __future__ import annotations

import asyncio

from plexrl.core.snapshot import Snapshot
from plexrl.errors import CallError
from plexrl.protocol import JobId, JobRequest, Role
from plexrl.runtime.config import RuntimeConfig, cluster_spec
from plexrl.runtime.control.controller import Controller
from plexrl.runtime.control.journal import Journal
from plexrl.runtime.models import model_spec


class SlowBindExecutor:
    """The executor's bind/unbind, recorded; binds finish when ``release`` is set."""

    def __init__(self):
        self.services, self.nodes = {"wg0": object()}, {"wg0": "node0"}
        self.log: list[tuple[str, str]] = []
        self.binding, self.release = asyncio.Event(), asyncio.Event()

    async def _bind(self, job):
        self.binding.set()
        await self.release.wait()
        self.log.append(("bind", job))

    def bind(self, wg, job, *args):
        return self._bind(job)

    async def _unbind(self, job):
        self.log.append(("unbind", job))

    def unbind(self, wg, job, err):
        return self._unbind(job)


async def end_while_binding(tmp_path) -> tuple[SlowBindExecutor, BaseException | None, Controller]:
    config = RuntimeConfig()
    controller = Controller(config, "race")
    controller.journal = Journal(tmp_path)
    controller.executor = executor = SlowBindExecutor()
    controller.snap = Snapshot(cluster=cluster_spec(config, executor.nodes),
                               config=config.core_config())
    request = JobRequest(JobId("job-a"), ((Role.POLICY, model_spec("policy", source="tiny-llama")),))
    registering = asyncio.create_task(controller.register(request))
    await asyncio.wait_for(executor.binding.wait(), 10)
    await controller._end_job(JobId("job-a"), controller.jobs["job-a"],
                              CallError("job job-a ended by its operator", job="job-a"))
    executor.release.set()
    error = None
    try:
        await asyncio.wait_for(registering, 10)
    except CallError as err:
        error = err
    await asyncio.wait_for(asyncio.gather(*controller._tasks), 10)   # _bind's cleanup
    return executor, error, controller


def test_a_job_ended_while_binding_is_unbound_after_its_binds_and_its_registration_fails(tmp_path):
    executor, error, controller = asyncio.run(end_while_binding(tmp_path))
    assert error is not None and "ended by its operator" in str(error)
    assert ("bind", "job-a") in executor.log
    assert executor.log[-1] == ("unbind", "job-a"), executor.log   # after every bind
    assert "job-a" not in controller.jobs
    assert not any(key.job == "job-a" for key in controller.snap.states)

