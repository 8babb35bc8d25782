"""The workload service as a real multi-process HTTP service on the emulated NPU."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from residency.protocol import MAX_STEPS
from residency.records.decisions import decisions_file
from tests.servicekit import SMALL, alive, decisions, http, post_when_free, service, wait_for

pytestmark = pytest.mark.slow


def test_candidate_three_requests_then_sigterm(tmp_path) -> None:
    with service(tmp_path, "--arm", "candidate", "--ranks", "2", *SMALL) as (proc, url, markers):
        code, health = http("GET", url + "/health")
        assert code == 200 and health["status"] == "ok"
        assert (health["ranks"], health["arm"], health["device_kind"]) == (2, "candidate",
                                                                            "emulated-npu")
        ids = []
        for seed in (1, 2, 3):
            code, body = http("POST", url + "/v1/generate", {"steps": 2, "seed": seed})
            assert code == 200, body
            ids.append(body["request_id"])
            assert [r["rank"] for r in body["per_rank"]] == [0, 1]
            for r in body["per_rank"]:
                assert r["normal"]["count"] == 1 and r["forced"] == {"count": 2, "released": 2}
                assert r["telemetry_errors"] == 0 and r["oom"] == 0
        # bad input keeps the service serving
        assert http("POST", url + "/v1/generate", b"{not json")[0] == 400
        assert http("POST", url + "/v1/generate", {"steps": 0})[0] == 400
        assert http("POST", url + "/v1/generate", {"steps": 1, "seed": 4})[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not any(alive(pid) for pid in health["rank_pids"])
    per_rank = decisions(markers)
    assert sorted(per_rank) == [0, 1]
    for rank, rows in per_rank.items():
        measured = [r for r in rows if r["request_id"] in ids]
        assert len(measured) == 9  # 3 requests x (1 normal + 2 forced)
        for rid in ids:
            kinds = sorted(r["kind"] for r in measured if r["request_id"] == rid)
            assert kinds == ["forced", "forced", "normal"]
        assert all(r["reason"] != "telemetry-unavailable" for r in rows)
        normal = [r for r in measured if r["kind"] == "normal"]
        assert all(r["outcome"] == "retained" and r["snapshot"] for r in normal), normal
        assert all(r["rank"] == rank for r in rows)


def test_baseline_normal_calls_hit_telemetry_failure(tmp_path) -> None:
    with service(tmp_path, "--arm", "baseline", "--ranks", "2", *SMALL) as (proc, url, markers):
        code, body = http("POST", url + "/v1/generate", {"steps": 2, "seed": 1})
        assert code == 200, body
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    for rows in decisions(markers).values():
        normal = [r for r in rows if r["kind"] == "normal"]
        assert normal and all(r["reason"] == "telemetry-unavailable" and
                              r["outcome"] == "released" for r in normal)
        assert all("not a DeviceAllocator" in r["error"] for r in normal)


def test_concurrent_request_gets_429(tmp_path) -> None:
    """A second request while one runs is 429. The first (MAX_STEPS, far longer than the
    test) is seen running through its rank's decision before the second is sent, then
    cancelled by closing its connection: no sleep, no race on who comes first."""
    with service(tmp_path, "--arm", "candidate", "--ranks", "1", *SMALL) as (proc, url,
                                                                          markers):
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"steps": MAX_STEPS, "seed": 1}).encode()
        slow = socket.create_connection((host, int(port)), timeout=60)
        slow.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        decisions_path = markers / decisions_file(0)
        wait_for(lambda: decisions_path.exists()
                 and '"request_id":"r0001"' in decisions_path.read_text(),
                 what="request r0001 running", proc=proc)
        code, reply = http("POST", url + "/v1/generate", {"steps": 1, "seed": 2})
        assert code == 429, reply
        slow.close()  # the client leaves: r0001 is cancelled, the next request runs
        code, reply = post_when_free(url + "/v1/generate", {"steps": 1, "seed": 3}, proc=proc)
        assert code == 200 and reply["request_id"] == "r0002", reply


def test_rank_death_fails_fast_and_exits_nonzero(tmp_path) -> None:
    with service(tmp_path, "--arm", "candidate", "--ranks", "2", *SMALL) as (proc, url, _):
        health = http("GET", url + "/health")[1]
        os.kill(health["rank_pids"][1], signal.SIGKILL)
        wait_for(lambda: http("GET", url + "/health")[0] == 503,
                 what="/health answering 503 after a rank was killed", proc=proc)
        code, body = http("GET", url + "/health")
        assert code == 503 and "rank 1" in body["error"]
        code, body = http("POST", url + "/v1/generate", {"steps": 1, "seed": 1})
        assert code == 503 and "rank 1" in body["error"]
        assert proc.wait(timeout=60) != 0
        assert not any(alive(pid) for pid in health["rank_pids"])
