"""The benchmarks run end to end at tiny sizes and report consistent figures; their helpers do
what the results rely on."""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import arena, common, hit_path, hostshare, marks_cost, miss_path, speed, takes, ttfa
from gateway.runtime.hostshare import HostTable
from tests.support import shortest_audio_s


@pytest.mark.slow
async def test_ttfa_bench_one_round() -> None:
    report = await ttfa.run(rounds=1)
    med = report["median_s"]
    assert set(med) == {"stream_ttfa_s", "first_sentence_s", "full_response_s"}
    assert all(v > 0 for v in med.values())
    assert report["ttfa_over_full_response"] == med["stream_ttfa_s"] / med["full_response_s"]


@pytest.mark.slow
async def test_ttfa_bench_sse_one_round() -> None:
    report = await ttfa.run(rounds=1, sse=True)
    assert report["benchmark"] == "ttfa_sse"
    assert report["sentences"] == 3 and report["format"] == "pcm"
    assert all(v > 0 for v in report["median_s"].values())


def test_results_record_command_date_and_commit(tmp_path: Path, monkeypatch: Any) -> None:
    """Every JSON written through ``write_results`` starts with how it was made."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    path = common.write_results("smoke", {"figure": 1.5})
    data = json.loads(path.read_text())
    assert data["figure"] == 1.5
    assert data["command"].startswith("python ")
    assert datetime.datetime.fromisoformat(data["date"]).tzinfo is not None
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=common.ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert data["git_commit"].removesuffix("+dirty") == commit


def test_zipf_prompts_are_distinct_and_share_sentences() -> None:
    prompts = hit_path.zipf_prompts(64)
    assert len(set(prompts)) == 64
    sentences = {s for p in prompts for s in p.split(". ")}
    assert len(sentences) <= 3 * 4  # three lists of ceil(64 ** (1/3)) = 4
    with pytest.raises(ValueError):
        hit_path.zipf_prompts(30**3 + 1)


def test_zipf_sequence_favours_low_ranks() -> None:
    seq = hit_path.zipf_sequence(1000, 1.0, 20_000)
    assert set(seq) <= set(range(1000))
    first = seq.count(0)
    assert first > 5 * seq.count(9)  # P(1) / P(10) = 10 for s = 1
    assert len(set(seq)) > 500


def test_memo_miss_rate_matches_a_fifo_memo() -> None:
    cycling = list(range(5)) * 40
    assert hit_path.memo_miss_rate(cycling, 5) == 0.0
    assert hit_path.memo_miss_rate(cycling, 4) == 1.0  # oldest-first eviction thrashes a cycle


@pytest.mark.slow
def test_hit_path_bench_every_workload_tiny() -> None:
    """Every workload (one body, Zipf with a tiny set, say URL) runs end to end (results not
    written; no unmeasured warm-up runs: the figures are not what is tested)."""
    assert shutil.which("wrk") is not None, "wrk missing: bash .ci/install installs it"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.hit_path",
            "--rounds",
            "1",
            "--seconds",
            "1",
            "--connections",
            "4",
            "--zipf-prompts",
            "8",
            "--say-url",
            "--no-write",
            "--no-warm-up",
        ],
        cwd=common.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "one-body: ratio gateway/bare" in out.stdout
    assert "zipf: ratio gateway/bare" in out.stdout
    assert "say-url: ratio gateway/bare" in out.stdout


@pytest.mark.slow
def test_miss_path_bench_every_row_tiny() -> None:
    """Every row of the miss-path bench answers the same texts; the ratios are consistent."""
    args = argparse.Namespace(clients=2, per_client=1, rounds=1, workers=1)
    result = miss_path.run(args)
    rows = result["servers"]
    assert set(rows) == set(miss_path.ROWS)
    assert all(r["requests"] == 2 and r["throughput_rps"] > 0 for r in rows.values())
    ratio = result["summary"]["vs_pool_direct"]["throughput_ratio"]
    gw, pd = rows["voxgate"]["throughput_rps"], rows["pool-direct"]["throughput_rps"]
    assert ratio == round(gw / pd, 3)
    assert rows["voxgate"]["gateway_process_cpu_ms_per_request"] > 0


@pytest.mark.slow
def test_marks_cost_bench_tiny() -> None:
    """Both gateways (marks on and off) answer the same texts as misses, then as hits; the
    ratios are the rows' (the bench itself checks that only the "on" gateway stored marks)."""
    args = argparse.Namespace(clients=2, per_client=1, rounds=2, workers=1)
    result = marks_cost.run(args)
    rows = result["servers"]
    assert set(rows) == set(marks_cost.ROWS)
    for kinds in rows.values():
        assert all(k["requests"] == 4 and k["throughput_rps"] > 0 for k in kinds.values())
    on, off = rows["marks-on"]["miss"], rows["marks-off"]["miss"]
    ratio = result["summary"]["miss"]["throughput_ratio"]
    assert ratio == round(on["throughput_rps"] / off["throughput_rps"], 3)


def test_speed_bench_two_prompts() -> None:
    """The speed bench on two prompts (one of two sentences, joined with the pause at the speed)
    with the Piper voice: speed 1 is its own reference, every speed's figures are its
    renditions', and no phoneme is without a frame."""
    rows = speed.measure(speed.Piper(noise=False), ["Hello.", "Please hold. Thank you."])
    assert rows["1"]["max_error_pct"] == 0 and rows["1"]["ratios"] == [1.0, 1.0]
    for s in speed.SPEEDS:
        r = rows[f"{s:g}"]
        assert r["renditions"] == 2 and r["min_ratio"] <= r["mean_ratio"] <= r["max_ratio"]
        assert r["max_error_pct"] < 100 * speed.TOLERANCE and r["zero_frame_phonemes"] == 0
        assert r["phonemes"] == rows["1"]["phonemes"] > 0
    assert rows["frames_per_phoneme_at_speed_1"]["min"] > 3


def test_takes_bench_two_sentences() -> None:
    """The take-check bench's corpus and figures on two sentences (the Piper voice only): every
    clean rendering is counted, each defect class made from every take, and each rate is its
    counts'."""
    report = takes.run(2, coqui=None, upstream=False, asr=0, prompts=False)
    clean = report["clean"]["piper/joe"]
    assert clean["takes"] == 2 * len(takes.SPEEDS) * len(report["renderings"])
    assert report["false_flag_rate"] == clean["flagged"] / clean["takes"]
    rows = report["signal"]
    assert {"silence", "hole", "tone", "wrong_container", "babble"} <= set(rows)
    assert rows["silence"]["takes"] == 2 * len(takes.SPEEDS)
    assert all(r["rate"] == r["caught"] / r["takes"] for r in rows.values())
    assert rows["truncated (all points)"]["takes"] == 4 * rows["silence"]["takes"]
    cost = report["cost"]["piper/joe"]
    assert cost["signal_over_synthesis"] == cost["signal_checks_cpu_s"] / cost["synthesis_cpu_s"]


def test_arena_bench_one_round_of_one_sentence() -> None:
    """Every policy measured on the same texts; the ratios are the medians'."""
    result = arena.run(rounds=1, sentences=1)
    med = result["median_cpu_ms_per_sentence"]
    assert set(med) == set(arena.POLICIES) and all(v > 0 for v in med.values())
    ratio = result["shrink_every_run_over_keep_below_bound_cpu"]
    assert ratio == round(med["shrink_every_run"] / med["keep_below_bound"], 3)
    assert all(len(v) == 1 for v in result["rss_above_rest_mb_after_long_run"].values())


def test_hostshare_bench_tables_answer_alike(tmp_path: Path) -> None:
    """The bench's SQLite table answers every call as the host's table does, so the two are
    measured doing the same work: a window filled, refused, then rolled over; shares taken to
    the limit, refused, given back."""
    host = HostTable(HostTable.create(1, directory=str(tmp_path)), 0)
    lite = hostshare.SqliteTable(hostshare.SqliteTable.create("wal", str(tmp_path)), 0)
    answers = []
    for table in (host, lite):
        window = [table.hit_window("r:a", 3, 60, 1, 1000.0)[0] for _ in range(4)]
        window.append(table.hit_window("r:a", 3, 60, 2, 1061.0)[0])  # 3 weighted by 19/60
        window.append(table.hit_window("r:a", 3, 60, 3, 1062.0)[0])
        shares = [table.take_share("c", 2) for _ in range(3)]
        table.give_share("c")
        shares += [table.take_share("c", 2), table.waiting_for("c")]
        answers.append((window, shares))
        table.close()
    assert (
        answers[0]
        == answers[1]
        == (
            [True, True, True, False, True, False],
            [True, True, False, True, 2],
        )
    )


def test_hostshare_bench_tiny_run_counts_alike_from_two_processes() -> None:
    """Two processes at once on each table (the run fails if a count is lost); the ratio is the
    summary's."""
    result = hostshare.run(rounds=1, steps=300, processes=2, keys=10, clients=10)
    summary = result["summary"]
    assert set(summary) == set(hostshare.IMPLEMENTATIONS)
    assert all(s["steps_per_s"] > 0 for s in summary.values())
    assert all(set(s["p50_us"]) == set(hostshare.OPERATIONS) for s in summary.values())
    ratio = summary["hostshare"]["steps_per_s"] / summary["sqlite3"]["steps_per_s"]
    assert result["hostshare_over_sqlite3"] == round(ratio, 2)


@pytest.mark.slow
def test_soak_bench_runs_every_kind_of_load_for_a_few_seconds(tmp_path: Path) -> None:
    """bench/soak.py end to end at a tiny length (three catalogue prompts warmed, not 24): every
    client kind answered, the Redis restart done, samples of every server process taken, and no
    5xx."""
    from bench import soak

    args = argparse.Namespace(
        minutes=0.06,
        warmup_min=0.02,
        sample_s=0.1,
        workers=1,
        memory_mb=16,
        no_write=True,
        long_request=False,
        prompts=3,
    )
    result = soak.soak(args, tmp_path)
    load = result["load"]
    assert load["5xx"] == 0, load
    assert result["healthy_after"] is True
    responses = load["responses"]
    for kind in ("hit", "hit_by_key", "miss", "stream", "disconnect"):
        assert responses[kind].get("200", 0) >= 1, (kind, responses)
    assert set(responses["bad"]) <= {str(s) for s in range(400, 500)}, responses["bad"]
    assert result["redis_restart"]["down_s"] > 0
    samples = result["samples"]
    # Sampled before the kill and after it, to the end: not a count of samples, which a loaded
    # machine takes fewer of in the run's 3.6 s (each one scrapes /metrics and every process).
    assert samples[0]["t_s"] < result["redis_restart"]["killed_at_s"] < samples[-1]["t_s"]
    assert all(s["processes"] >= 2 and s["rss_mb"] > 0 and s["fds"] > 0 for s in samples)
    assert "rss_growth_pct" in result["steady_state"]
    assert result["tracebacks_in_server_log"] == 0
    assert result["setup"]["catalogue_prompts"] == 3


@pytest.mark.slow
def test_vs_nginx_bench_tiny(tmp_path: Path) -> None:
    """bench/vs_nginx.py end to end at tiny sizes, both cache keys (one wrk thread count):
    nginx + the seed service and voxgate each answer a cold Zipf load from empty, then warm
    rounds interleaved between the two (no unmeasured warm-up: the figures are not what is
    tested), and voxgate synthesizes each one-sentence prompt once."""
    from bench import vs_nginx

    assert Path(vs_nginx.NGINX).is_file(), "nginx missing: bash .ci/install installs nginx-light"
    assert shutil.which("wrk") is not None, "wrk missing: bash .ci/install installs it"
    prompts = vs_nginx.ivr_prompts(12)
    assert len(set(prompts)) == 12 and all(p.count(".") == 1 for p in prompts)
    # Four prompts (every fill is a synthesis of each): the counts below are in terms of n,
    # and what they assert holds at any size of the set.
    n = 4
    args = argparse.Namespace(
        prompts=n,
        cold_s=1.0,
        warm_s=2.0,
        warm_rounds=2,
        warmup_s=0.0,
        clients=4,
        keys=["get", "post"],
        threads=[2],
    )
    report = vs_nginx.run(args, tmp_path)
    assert set(report["variants"]) == {"get_2t", "post_2t"}
    for variant in report["variants"].values():
        res = variant["results"]
        assert set(res) == {"nginx_seed", "voxgate"}
        for r in res.values():
            assert r["warm"]["rps"] > 0 and r["warm"]["p99_ms"] > 0
            assert [x["rps"] for x in r["cold"]["runs"]] == [r["cold"]["rps"]]
            rounds = r["warm"]["rounds"]
            assert len(rounds) == 2 and all(x["rps"] > 0 for x in rounds)
            assert r["warm"]["rps"] == round(sum(x["rps"] for x in rounds) / 2, 2)
            # Every prompt was fetched once after the cold phase: each synthesized at least once.
            assert r["syntheses"] >= n
            # The fill stored every prompt under the key the load asks for (a GET URL quoted
            # otherwise would have missed nginx's cache in the warm phase).
            assert r["hits_after_fill"] == n
        assert res["voxgate"]["syntheses"] == n  # one master per prompt, never twice
        assert "synthesis processes per model" in res["voxgate"]["topology"]
        s = variant["summary"]
        assert s["warm_qps_ratio"] == round(
            res["voxgate"]["warm"]["rps"] / res["nginx_seed"]["warm"]["rps"], 3
        )
        assert set(s["met"]) == {"warm_qps_ratio", "cold_qps_ratio", "cold_p99", "warm_p99"}
    assert report["all_met"] == all(
        all(v["summary"]["met"].values()) for v in report["variants"].values()
    )
    assert "GET key, 2 wrk thread(s)" in vs_nginx.table(report)


@pytest.mark.slow
def test_fast_path_bench_tiny(tmp_path: Path) -> None:
    """bench/fast_path.py end to end at a tiny size: both servers filled, then interleaved warm
    rounds (no unmeasured warm-up: the figures are not what is tested); only the one with the
    fast path on answered requests from their bytes, each prompt was synthesized once per
    server, and the ratios are those of the servers' figures."""
    from bench import fast_path

    assert shutil.which("wrk") is not None, "wrk missing: bash .ci/install installs it"
    args = argparse.Namespace(
        prompts=3,
        warm_s=2.0,
        warm_rounds=2,
        warmup_s=0.0,
        clients=4,
        keys=["post"],
        threads=[1],
    )
    report = fast_path.run(args, tmp_path)
    assert set(report["variants"]) == {"post_1t"}
    (variant,) = report["variants"].values()
    res = variant["results"]
    assert list(res) == ["fast_path_on", "fast_path_off"]
    for r in res.values():
        assert len(r["rounds"]) == 2 and r["rps"] == round(
            sum(x["rps"] for x in r["rounds"]) / 2, 2
        )
        assert all(x["cpu_us_per_request"] > 0 for x in r["rounds"])
    on, off = res["fast_path_on"], res["fast_path_off"]
    assert on["answered_from_bytes"] > 0 and off["answered_from_bytes"] == 0
    assert variant["summary"]["qps_on_over_off"] == round(on["rps"] / off["rps"], 3)
    cpu = off["cpu_us_per_request"] / on["cpu_us_per_request"]
    assert variant["summary"]["cpu_off_over_on"] == round(cpu, 3)
    assert report["syntheses"] == {"fast_path_on": 3, "fast_path_off": 3}
    assert "post_1t: QPS on / off" in fast_path.table(report)


def test_vs_nginx_cold_runs_summary() -> None:
    """Several cold minutes of one server make one figure: QPS the mean of the runs, p99 the
    median, each run kept; the worst run's syntheses and stored answers, not the best's."""
    from bench import vs_nginx

    def run(rps: float, p99: float, syntheses: int, hits: int) -> dict[str, Any]:
        cold = {"rps": rps, "p50_ms": 1.0, "p99_ms": p99, "requests": rps * 60}
        per = syntheses / 343
        return {
            "cold": cold,
            "fill_s": 0.1,
            "syntheses": syntheses,
            "syntheses_per_prompt": per,
            "hits_after_fill": hits,
        }

    out = vs_nginx.cold_summary(
        [run(100.0, 1900.0, 343, 343), run(400.0, 1400.0, 344, 342), run(130.0, 1500.0, 343, 343)]
    )
    assert out["cold"]["rps"] == 210.0
    assert out["cold"]["p99_ms"] == 1500.0
    assert [r["p99_ms"] for r in out["cold"]["runs"]] == [1900.0, 1400.0, 1500.0]
    assert out["cold"]["requests"] == 630 * 60
    assert out["syntheses"] == 344 and out["hits_after_fill"] == 342


@pytest.mark.slow
def test_handmade_bench_resp_one_round(tmp_path: Path) -> None:
    """bench/handmade.py's reader comparison end to end at a tiny size: both gateways serve the
    one stored entry from Redis under load, and the ratios are those of the rounds' figures."""
    from bench import handmade

    args = argparse.Namespace(rounds=1, seconds=1.0, connections=4)
    result = handmade.resp(args, tmp_path)
    runs = result["rounds"]
    assert set(runs) == {"lean_reader", "redis_py_hiredis"}
    assert all(len(r) == 1 and r[0]["rps"] > 0 for r in runs.values())
    # A WAV of several seconds (~5.7 s measured), read from Redis on every hit: at least the
    # voice's shortest rendering of the text (a fixed byte count was a bound on random audio).
    assert result["payload_bytes"] >= 2 * 22050 * shortest_audio_s(handmade.TEXT)
    lean, redis_py = runs["lean_reader"][0], runs["redis_py_hiredis"][0]
    assert result["speedup_rps"]["median"] == round(lean["rps"] / redis_py["rps"], 3)
    cpu = redis_py["cpu_us_per_request"] / lean["cpu_us_per_request"]
    assert result["speedup_cpu"]["median"] == round(cpu, 3)
    assert result["verdict"] == (
        "keep" if min(result["speedup_rps"]["median"], round(cpu, 3)) >= 1.15 else "drop"
    )


@pytest.mark.slow
async def test_upstream_bench_runs_and_voxgate_bills_only_new_sentences(tmp_path: Path) -> None:
    from bench import upstream

    # At least 24 requests whatever the machine's load (a loaded one answered 2 in 1.5 s): with 8
    # prompts, at least 16 of them repeat one.
    results = await upstream.run(
        seconds=1.5, clients=2, prompts=8, latency_ms=50, directory=tmp_path, min_requests=24
    )
    direct, voxgate = results["direct"], results["voxgate"]
    assert direct["errors"] == voxgate["errors"] == 0
    # Without a cache every request is a call, every character billed.
    assert direct["provider_calls"] == direct["requests"] > 0
    assert direct["chars_billed"] == direct["chars_requested"]
    # Through voxgate: 8 prompts of 2 x 2 x 2 sentences, each sentence billed once at most.
    assert voxgate["requests"] > voxgate["provider_calls"]
    assert voxgate["provider_calls"] <= 6


def test_free_ports_of_two_xdist_workers_never_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker walks its own slice, below the kernel's ephemeral range, and does not hand
    out a port twice in a row: no two servers of a run can be given one port."""
    from bench import harness

    taken: dict[str, list[int]] = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        monkeypatch.setattr(harness, "_walk", None)
        taken[worker] = [harness.free_port() for _ in range(200)]
    assert all(len(set(ports)) == 200 for ports in taken.values())
    assert not set(taken["gw0"]) & set(taken["gw1"])
    assert all(10000 <= p < 15000 for p in taken["gw0"])
    assert all(15000 <= p < 20000 for p in taken["gw1"])
