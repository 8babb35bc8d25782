"""The workload service as a real multi-process HTTP service on the emulated NPU."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.servicekit import SMALL, alive, decisions, http, service

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
    with service(tmp_path, "--arm", "candidate", "--ranks", "1", *SMALL) as (proc, url, _):
        results = {}
        slow = threading.Thread(target=lambda: results.setdefault(
            "slow", http("POST", url + "/v1/generate", {"steps": 400, "seed": 1})))
        slow.start()
        time.sleep(1.0)
        second = http("POST", url + "/v1/generate", {"steps": 1, "seed": 2})
        slow.join(timeout=300)
        assert results["slow"][0] == 200
        assert second[0] in (200, 429)
        if second[0] == 200:  # it ran after the first: never interleaved
            assert second[1]["request_id"] > results["slow"][1]["request_id"]


def test_rank_death_fails_fast_and_exits_nonzero(tmp_path) -> None:
    with service(tmp_path, "--arm", "candidate", "--ranks", "2", *SMALL) as (proc, url, _):
        health = http("GET", url + "/health")[1]
        import os

        os.kill(health["rank_pids"][1], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            code, body = http("GET", url + "/health")
            if code == 503:
                break
            time.sleep(0.1)
        assert code == 503 and "rank 1" in body["error"]
        code, body = http("POST", url + "/v1/generate", {"steps": 1, "seed": 1})
        assert code == 503 and "rank 1" in body["error"]
        assert proc.wait(timeout=60) != 0
        assert not any(alive(pid) for pid in health["rank_pids"])
