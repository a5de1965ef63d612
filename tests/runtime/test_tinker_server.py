"""The Tinker API server's sessions (D209), driven by the official ``tinker`` SDK, pinned in
requirements.txt: health, capabilities, a session's life, and bad keys and other tenants'
sessions refused with the SDK's own errors. Models and sampling: test_tinker_sdk.py."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import tinker

from plexrl.runtime.tinker.server import SDK_VERSION, TinkerServer


@pytest.fixture
def server():
    """A TinkerServer on its own event loop thread, allowing keys tml-a and tml-b."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    running = asyncio.run_coroutine_threadsafe(
        TinkerServer.start(keys=("tml-a", "tml-b")), loop).result(10)
    yield running
    asyncio.run_coroutine_threadsafe(running.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_the_pinned_sdk_is_the_one_served():
    assert tinker.__version__ == SDK_VERSION


def test_the_sdk_reads_the_servers_health_and_models(server):
    rest = tinker.RestClient(base_url=server.url, api_key="tml-a")
    models = rest.get_server_capabilities().result(timeout=30).supported_models
    assert [m.model_name for m in models] == ["small-qwen2", "tiny-llama", "tiny-qwen2"]
    assert all(m.trainable and m.sampleable and m.max_context_length for m in models)
    assert httpx.get(f"{server.url}/api/v1/healthz").json() == {"status": "ok"}


def test_a_key_the_server_does_not_know_is_the_sdks_authentication_error(server):
    with pytest.raises(tinker.AuthenticationError, match="unknown API key.*fix: set TINKER_API_KEY"):
        tinker.RestClient(base_url=server.url, api_key="tml-z").get_server_capabilities().result(
            timeout=30)


def test_a_session_is_its_keys_own(server):
    def post(path, key, **body):
        return httpx.post(f"{server.url}/api/v1{path}", json=body, headers={"X-API-Key": key})
    session = post("/create_session", "tml-a", type="create_session").json()["session_id"]
    assert post("/session_heartbeat", "tml-a", session_id=session).status_code == 200
    other = post("/session_heartbeat", "tml-b", session_id=session)   # another tenant
    assert other.status_code == 404 and "no session" in other.json()["detail"]
    assert post(f"/sessions/{session}/finish", "tml-b", reason={"type": "success"}).status_code == 404
    assert post(f"/sessions/{session}/finish", "tml-a", reason={"type": "success"}).status_code == 200
    assert post("/session_heartbeat", "tml-a", session_id=session).status_code == 410
    assert post("/telemetry", "tml-a", events=[]).json() == {"status": "accepted"}
    missing = post("/no_such_call", "tml-a")
    assert missing.status_code == 404 and "fix:" in missing.json()["detail"]


def test_the_controller_serves_the_tinker_api_at_its_endpoint(connect):
    runtime = connect()
    url = runtime.inspect("endpoints")["tinker"]
    assert url.startswith("http://127.0.0.1:")
    rest = tinker.RestClient(base_url=url, api_key="tml-any")
    assert rest.get_server_capabilities().result(timeout=30).supported_models
