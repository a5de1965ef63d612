"""The controller's endpoints during a shared run: two jobs on one worker group, each driven
by a thread that runs GRPO-like steps until the module's tests are done.

Scrapes the Prometheus endpoint twice and finds the counters moving; exports a trace with
``plexrl trace`` and finds both jobs' calls interleaved on the group's track; opens the
dashboard in Debian's headless chromium (selenium, /usr/bin/chromedriver) and finds both
jobs, their worker group and a non-zero utilisation, saving a screenshot under
``test-artifacts/`` (or ``$PLEXRL_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import grpo_like
from plexrl.cli.main import main as plexrl_main
from plexrl.client import Runtime
from plexrl.runtime.config import RuntimeConfig
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import RayTransport

SPEC = model_spec("policy", source="tiny-qwen2")
JOBS = ("obs-a", "obs-b")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("PLEXRL_TEST_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / "test-artifacts"))


@pytest.fixture(scope="module")
def shared_run(ray_session):
    """A runtime whose one worker group runs two jobs' steps until the module ends."""
    runtime = Runtime(RayTransport(config=RuntimeConfig(check_invariants=True)))
    jobs = [runtime.register_job(name, {"policy": SPEC}, seed=i) for i, name in enumerate(JOBS)]
    stop, errors = threading.Event(), []

    def drive(job):
        try:
            k = 0
            while not stop.is_set():
                grpo_like.step(job, k)
                k += 1
        except Exception as err:   # reported at teardown
            errors.append(err)
    threads = [threading.Thread(target=drive, args=(job,), daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    _wait_for(lambda: {c["job"] for c in runtime.inspect("calls")} == set(JOBS), 60)
    yield runtime
    stop.set()
    for thread in threads:
        thread.join(60)
    runtime.close()
    assert not errors, errors


def _wait_for(condition, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the metrics text: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(_get(url)) for s in family.samples}


def _total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


def test_the_endpoints_are_on_loopback_on_a_port_chosen_at_start(shared_run):
    urls = shared_run.inspect("endpoints")
    assert urls["metrics"].startswith("http://127.0.0.1:") and urls["metrics"].endswith("/metrics")
    assert urls["dashboard"] == urls["metrics"][:-len("metrics")]
    assert int(urls["metrics"].split(":")[2].split("/")[0]) > 0
    with pytest.raises(urllib.error.HTTPError) as missing:
        _get(urls["dashboard"] + "nothing-here")
    assert missing.value.code == 404


def test_scraped_counters_move_during_a_run(shared_run):
    url = shared_run.inspect("endpoints")["metrics"]
    before = _scrape(url)
    done = len(shared_run.inspect("calls"))
    _wait_for(lambda: len(shared_run.inspect("calls")) >= done + 20, 60)
    after = _scrape(url)
    for job in JOBS:
        assert _total(after, "plexrl_calls_total", job=job) > _total(before, "plexrl_calls_total",
                                                                      job=job)
        assert _total(after, "plexrl_call_wait_seconds_count", job=job) > \
            _total(before, "plexrl_call_wait_seconds_count", job=job)
        assert _total(after, "plexrl_job_slowdown", job=job) >= 1.0
    assert _total(after, "plexrl_busy_seconds_total", wg="wg0") > \
        _total(before, "plexrl_busy_seconds_total", wg="wg0")
    assert _total(after, "plexrl_switches_total", wg="wg0") > \
        _total(before, "plexrl_switches_total", wg="wg0")
    assert _total(after, "plexrl_moved_bytes_total", wg="wg0", src="host", dst="device") > 0
    assert _total(after, "plexrl_tier_bytes", wg="wg0", tier="device") > 0
    assert 0 < _total(after, "plexrl_worker_group_utilisation", wg="wg0") <= 1


def test_a_trace_of_the_shared_run_interleaves_both_jobs_on_the_group_track(shared_run, tmp_path,
                                                                            capsys):
    name = shared_run.transport.controller_name
    out = tmp_path / "shared.json"
    assert plexrl_main(["trace", "--controller", name, "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    events = json.loads(out.read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    track = next(key for key, n in names.items() if n == "wg0")
    jobs = [e["args"]["job"] for e in sorted(events, key=lambda e: e.get("ts", 0))
            if e["ph"] == "X" and (e["pid"], e["tid"]) == track and e["cat"] == "call"]
    runs = [j for i, j in enumerate(jobs) if i == 0 or jobs[i - 1] != j]   # one per switch
    assert set(runs) == set(JOBS) and len(runs) >= 3, runs   # a, b, a: interleaved
    assert any(n == "idle" for e in events if e["ph"] == "X"
               and (e["pid"], e["tid"]) == track for n in [e["name"]])
    assert {n for n in names.values() if not n.startswith("wg0")} >= set(JOBS)

    one = tmp_path / "one.json"
    assert plexrl_main(["trace", "--controller", name, "--job", JOBS[0], "--since", "-2",
                        "-o", str(one)]) == 0
    spans = [e for e in json.loads(one.read_text())["traceEvents"] if e["ph"] == "X"]
    assert spans and {e["args"]["job"] for e in spans if "job" in e["args"]} == {JOBS[0]}


_READ_PAGE = """
const all = sel => Array.from(document.querySelectorAll(sel));
return {jobs: all("#jobs td.job").map(e => e.innerText),
        util: document.querySelector("#groups td.util[data-wg='wg0']").innerText,
        groups: document.getElementById("groups").innerText,
        lanes: all(".lane[data-wg='wg0'] .span").map(e => e.title)};
"""


NO_BROWSER = "needs Debian's chromium-driver (.ci/run installs it: apt-get install -y " \
             "chromium chromium-driver)"


@pytest.mark.skipif(not CHROMEDRIVER.exists() and not os.environ.get("PLEXRL_REQUIRE_BROWSER"),
                    reason=NO_BROWSER)
def test_the_dashboard_shows_both_jobs_their_group_and_utilisation_in_a_browser(shared_run):
    assert CHROMEDRIVER.exists(), NO_BROWSER   # CI (PLEXRL_REQUIRE_BROWSER=1) must run it
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--window-size=1200,900"):
        options.add_argument(flag)
    profile = ARTIFACTS / "chromium-profile"
    options.add_argument(f"--user-data-dir={profile}")
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.get(shared_run.inspect("endpoints")["dashboard"])
        first = driver.find_element(By.TAG_NAME, "body").get_attribute("data-updated")
        WebDriverWait(driver, 30).until(   # the script polled and redrew at least once
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-updated") != first)
        page = driver.execute_script(_READ_PAGE)   # in one go: the script redraws every second
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    finally:
        driver.quit()
    assert set(page["jobs"]) == set(JOBS)
    assert "wg0" in page["groups"] and float(page["util"].rstrip("%")) > 0
    assert {title.split()[0] for title in page["lanes"]} == set(JOBS)   # the group's timeline
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 0
