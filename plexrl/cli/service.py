"""``plexrl up | down | status | jobs | logs | cancel | submit``: PlexRL as a team's service.

Owns: the arguments of these commands, finding the running controller through the run
directory (``plexrl.runtime.head``), and printing: a table or lines for people, or with
``--format json`` exactly one JSON object on stdout. Must not know: how the controller
queues, runs or ends jobs (``plexrl.runtime.control.submissions``).
"""

from __future__ import annotations

import json
import sys
import time

COMMANDS = ("up", "down", "status", "jobs", "logs", "cancel", "submit")


def add_parsers(sub) -> None:
    up = sub.add_parser("up", help="start (or join, with --address) a Ray head and a detached "
                                   "controller that outlive this command")
    up.add_argument("--address", help="join this Ray cluster (host:port) instead of starting "
                                      "a head on loopback")
    up.add_argument("--host", default="127.0.0.1", help="the address a new head listens on")
    up.add_argument("--devices", type=int, default=1,
                    help="devices in all (emulated ones where the cluster has no GPU)")
    up.add_argument("--groups", type=int, default=1,
                    help="worker groups the devices are split into, equally (--devices 4 "
                         "--groups 2: two groups of two, each model sharded over its two)")
    up.add_argument("--device-bytes", type=int, help="memory of one emulated device (bytes)")
    up.add_argument("--host-bytes", type=int, help="host memory for parked states (bytes)")
    up.add_argument("--lease-s", type=float, help="a job whose driver is silent this long ends")
    up.add_argument("--queue-policy", choices=("hrrs", "fcfs", "round-robin"))
    sub.add_parser("down", help="stop what `plexrl up` started (its controller; the Ray head "
                                "only if up started it)")
    reads = {"status": "the controller and the job queue",
             "jobs": "jobs with their state, queue position and reason",
             "logs": "a job's program output", "cancel": "end a job and kill its program",
             "submit": "submit a job file (TOML or YAML)"}
    for name, text in reads.items():
        cmd = sub.add_parser(name, help=text)
        if name in ("logs", "cancel"):
            cmd.add_argument("job", help="the job's name")
        if name == "submit":
            cmd.add_argument("job_file", help="a job file (examples/jobs/own-job.toml)")
        if name == "logs":
            cmd.add_argument("--follow", "-f", action="store_true",
                             help="keep printing until the program exits")
        cmd.add_argument("--format", choices=("table", "json"), default="table")
        cmd.add_argument("--token", help="operator or job token (default: $PLEXRL_TOKEN, "
                                         "else the run directory's operator-token)")
    for cmd in (up, sub.choices["down"]):
        cmd.add_argument("--format", choices=("table", "json"), default="table")


def run(args) -> int:
    return {"up": _up, "down": _down, "status": _status, "jobs": _jobs, "logs": _logs,
            "cancel": _cancel, "submit": _submit}[args.command](args)


# -- up / down ---------------------------------------------------------------------------------
def _up(args) -> int:
    from plexrl.runtime import head
    state = head.read_state()
    if state is not None and _answers(state):
        return _emit(args, {"address": state.address, "controller": state.controller,
                            "started_head": state.started_head, "already_running": True,
                            "token_file": str(head.run_dir() / head.TOKEN_FILE)},
                     f"PlexRL is already up at {state.address} (controller {state.controller})")
    if state is not None:          # what it recorded is gone: forget it
        head.stop_head(state)
        head.clear_state()
    head.run_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    started = args.address is None
    config = _config(args)   # a bad split is refused before anything starts
    state = (head.start_head(args.devices, host=args.host) if started else
             head.HeadState(address=args.address, controller=head.CONTROLLER_NAME,
                            started_head=False))
    try:
        head.connect_ray(state.address)
        controller = head.find_controller(state.controller)
        if controller is not None:     # joined a cluster where one already runs
            return _emit(args, {"address": state.address, "controller": state.controller,
                                "started_head": False, "already_running": True,
                                "token_file": None},
                         f"PlexRL is already up at {state.address} (controller "
                         f"{state.controller}, started elsewhere)")
        controller = head.create_controller(config, state.controller)
        token = head.write_token()
        head.call(controller.serve, token, str(head.run_dir()), state.address, state.controller)
        head.write_state(state)
    except BaseException:
        head.stop_head(state)
        raise
    token_file = head.run_dir() / head.TOKEN_FILE
    return _emit(args, {"address": state.address, "controller": state.controller,
                        "started_head": started, "already_running": False,
                        "token_file": str(token_file)},
                 f"PlexRL is up at {state.address} (controller {state.controller}, namespace "
                 f"plexrl)\noperator token: {token_file} (mode 0600)")


def _config(args):
    from plexrl.errors import ConfigError
    from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
    if args.groups < 1 or args.devices < args.groups or args.devices % args.groups:
        raise ConfigError(f"--devices {args.devices} cannot be split into {args.groups} equal "
                          "worker groups", field="devices", value=args.devices,
                          fix="give --devices a multiple of --groups (--devices 4 --groups 2: "
                              "two groups of two)")
    each = args.devices // args.groups
    settings = {"worker_groups": tuple(WorkerGroupConfig(f"wg{i}", each)
                                       for i in range(args.groups))}
    for key in ("device_bytes", "host_bytes", "lease_s", "queue_policy"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    return RuntimeConfig(**settings)


def _answers(state) -> bool:
    from plexrl.runtime import head
    try:
        head.connect_ray(state.address)
        controller = head.find_controller(state.controller)
        if controller is None:
            return False
        head.call(controller.info, timeout_s=30)
        return True
    except Exception:
        return False


def _down(args) -> int:
    from plexrl.runtime import head
    state = head.read_state()
    if state is None:
        return _emit(args, {"stopped": False, "reason": "not up"},
                     f"PlexRL is not up (no {head.run_dir() / head.STATE_FILE})")
    cancelled = 0
    try:
        head.connect_ray(state.address)
        controller = head.find_controller(state.controller)
        if controller is not None:
            cancelled = head.call(controller.stop_service, head.read_token())
            head.kill(controller)
    except ConnectionError:
        pass                       # the head is gone already
    finally:
        head.stop_head(state)
        head.clear_state()
    return _emit(args, {"stopped": True, "cancelled_jobs": cancelled,
                        "stopped_head": state.started_head},
                 f"PlexRL is down ({cancelled} job(s) cancelled"
                 + ("; Ray head stopped)" if state.started_head else "; Ray cluster left running)"))


# -- read commands ---------------------------------------------------------------------------
def _controller():
    from plexrl.errors import ConfigError
    from plexrl.runtime import head
    state = head.read_state()
    if state is None:
        raise ConfigError("PlexRL is not up", field="run directory", value=str(head.run_dir()),
                          fix="run `plexrl up` (or set PLEXRL_HOME to its run directory)")
    head.connect_ray(state.address)
    controller = head.find_controller(state.controller)
    if controller is None:
        raise ConfigError("the controller is gone", field="controller", value=state.controller,
                          fix="run `plexrl down` then `plexrl up`")
    return controller, state


def _call(method, *args):
    from plexrl.runtime.head import call
    return call(method, *args)


def _status(args) -> int:
    from plexrl.runtime import head
    controller, state = _controller()
    status = _call(controller.service_status, head.read_token(args.token))
    try:
        status["endpoints"] = _call(controller.inspect, "endpoints")
    except Exception:
        status["endpoints"] = None         # this controller has no such record
    lines = [f"PlexRL up at {state.address}: controller {state.controller}, session "
             f"{status['session']}, worker groups {', '.join(status['worker_groups'])}",
             "jobs: " + (", ".join(f"{n} {s}" for s, n in sorted(status["jobs"].items()))
                         or "none")]
    for item in status["queue"]:
        lines.append(f"  queued #{item['position']}: {item['job']} (priority {item['priority']})"
                     f": {item['reason']}")
    if status["endpoints"]:
        lines += [f"{k}: {v}" for k, v in dict(status["endpoints"]).items()]
    return _emit(args, status, "\n".join(lines))


def _jobs(args) -> int:
    from plexrl.runtime import head
    controller, _ = _controller()
    jobs = _call(controller.list_jobs, head.read_token(args.token))
    rows = [("JOB", "STATE", "PRI", "POS", "EXIT", "REASON")]
    rows += [(j["job"], j["state"], str(j["priority"]), str(j["position"] or "-"),
              str("-" if j.get("exit_code") is None else j["exit_code"]), j["reason"] or "")
             for j in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5] for r in rows)
    return _emit(args, {"jobs": jobs}, text)


def _logs(args) -> int:
    from plexrl.runtime import head
    controller, _ = _controller()
    token = head.read_token(args.token)
    offset, texts = 0, []
    while True:
        got = _call(controller.job_log, args.job, token, offset)
        offset = got["offset"]
        if args.format == "json":
            texts.append(got["text"])
        elif got["text"]:
            sys.stdout.write(got["text"])
            sys.stdout.flush()
        if got["text"]:
            continue               # more may be there already
        if not args.follow or got["done"]:
            break
        time.sleep(0.5)
    if args.format == "json":
        print(json.dumps({"job": args.job, "state": got["state"], "text": "".join(texts)}))
    return 0


def _cancel(args) -> int:
    from plexrl.runtime import head
    controller, _ = _controller()
    view = _call(controller.cancel_job, args.job, head.read_token(args.token))
    return _emit(args, view, f"{view['job']}: {view['state']}"
                 + (f" (exit status {view['exit_code']})" if view.get("exit_code") is not None
                    else ""))


def _submit(args) -> int:
    from plexrl.runtime import head
    from plexrl.runtime.submitted.jobspec import load_job_file
    job_file = load_job_file(args.job_file)       # every error before anything is sent
    submission = job_file.submission()
    token = head.read_token(args.token)
    controller, _ = _controller()
    ticket = _call(controller.submit_job, submission, token)
    return _emit(args, {"job": ticket.job, "token": ticket.token},
                 f"submitted {ticket.job}\njob token: {ticket.token} (sees and cancels only "
                 "this job: plexrl jobs --token ...)")


def _emit(args, obj: dict, text: str) -> int:
    if getattr(args, "format", "table") == "json":
        print(json.dumps(obj, default=str))
    else:
        print(text)
    return 0
