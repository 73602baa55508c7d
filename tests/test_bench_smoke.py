"""The TTFA benchmark runs end to end (one round) and reports consistent figures."""

from __future__ import annotations

import pytest

from bench import ttfa


@pytest.mark.slow
async def test_ttfa_bench_one_round() -> None:
    report = await ttfa.run(rounds=1)
    med = report["median_s"]
    assert set(med) == {"stream_ttfa_s", "first_sentence_s", "full_response_s"}
    assert all(v > 0 for v in med.values())
    assert report["ttfa_over_full_response"] == med["stream_ttfa_s"] / med["full_response_s"]
