"""The normalization bench: its corpora load, its scoring counts what it says, and a system that
cannot run is reported, not dropped."""

from __future__ import annotations

import pytest

from bench import normalize_eval as ne


@pytest.mark.parametrize(("name", "least"), [("ivr_en_heldout", 220), ("ivr_zh_heldout", 95)])
def test_held_out_corpora_load_with_sections_and_readings(name: str, least: int) -> None:
    cases = ne.load_corpus(name)
    assert len(cases) >= least
    assert all(c.section and c.readings for c in cases)
    lang = "zh" if "_zh" in name else "en"
    # Every reading says its digits: nothing a caller hears is left as written.
    assert not [r for c in cases for r in c.readings if any(ch.isdigit() for ch in r)]
    assert len({ne.canon(c.text, lang) for c in cases}) == len(cases)


def test_zeros_said_counts_repeats_and_mandarin_zeros() -> None:
    assert ne.zeros_said("double oh four seven", "en") == 2
    assert ne.zeros_said("triple zero", "en") == 3
    assert ne.zeros_said("one o five, zero", "en") == 2
    assert ne.zeros_said("zeroes", "en") == 0
    assert ne.zeros_said("零一〇", "zh") == 2


def test_leading_zeros_asked_only_where_every_reading_says_them() -> None:
    code = ne.Case("", "Your code is 0047.", ("zero zero four seven", "double oh four seven"))
    assert ne.zeros_needed(code, "en") == 2
    time = ne.Case("", "At 04:10.", ("at four ten", "at oh four ten"))
    assert ne.zeros_needed(time, "en") == 0
    money = ne.Case("", "Pay $0.99.", ("pay ninety nine cents",))
    assert ne.zeros_needed(money, "en") == 0


def test_score_counts_right_answers_sections_and_kept_zeros() -> None:
    cases = ne.load_corpus("ivr_en_heldout")
    readings = [c.readings[0] for c in cases]
    readings[0] = "wrong"
    raw = {"outputs": readings, "seconds": [0.001] * len(cases), "errors": []}
    got = ne.score("ivr_en_heldout", "en", raw)
    assert got["correct"] == len(cases) - 1
    assert got["sections"][cases[0].section] < 1.0
    assert got["leading_zero_kept"] == got["leading_zero_cases"] > 0
    assert got["latency_median_ms"] == pytest.approx(1.0)


def test_a_system_runs_in_its_own_process_and_one_that_cannot_is_reported() -> None:
    report = ne.run(["voxgate"], ["ivr_en_heldout"], None, 120)
    row = report["voxgate"]["corpora"]["ivr_en_heldout"]
    assert row["status"] == "ok" and row["cases"] >= 220
    assert report["voxgate"]["startup"]["en"]["total_s"] > 0
    broken = ne.run_worker("no-such-system", "en", ["ivr_en_heldout"], None, 120)
    assert "no-such-system" in broken["error"]
