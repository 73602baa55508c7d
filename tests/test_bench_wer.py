"""The recognition round-trip bench: its prompts, its scoring, and a two-prompt run end to end."""

from __future__ import annotations

import pytest

from bench import wer_roundtrip
from bench.normalize_eval import Case, load_corpus
from synth.takecheck import word_error_rate


def test_prompts_have_numbers_and_expected_words_without_digits() -> None:
    cases = load_corpus("wer_prompts")
    assert len(cases) == 40
    for case in cases:
        assert any(ch.isdigit() for ch in case.text), case.text
        assert not any(ch.isdigit() for r in case.readings for ch in r), case.readings


def test_the_closest_reading_is_the_reference() -> None:
    case = Case("", "Call 0.", ("call zero", "call oh"))
    assert wer_roundtrip.closest(case, ["call", "oh"]) == ["call", "oh"]
    assert wer_roundtrip.closest(case, ["call", "zero", "now"]) == ["call", "zero"]


def test_corpus_wer_is_all_edits_over_all_reference_words() -> None:
    refs = [["a", "b", "c", "d"], ["e", "f"]]
    heard = [["a", "b", "c", "d"], ["e", "x", "y"]]  # one substitution, one insertion
    value, _ = wer_roundtrip.corpus_wer(refs, heard)
    assert value == pytest.approx(2 / 6)
    assert value != pytest.approx((0 + word_error_rate(refs[1], heard[1])) / 2)


@pytest.mark.slow
def test_two_prompts_round_trip_in_every_variant() -> None:
    report = wer_roundtrip.run(2)
    assert report["setup"]["prompts"] == 2
    assert set(report["variants"]) == set(wer_roundtrip.VARIANTS)
    for row in report["variants"].values():
        assert len(row["prompts"]) == 2 and row["takes"] == 2
        assert all(h for p in row["prompts"] for h in p["heard"]), row["prompts"]
        assert 0 <= row["wer"] <= 2 and row["wer_per_round"] == [row["wer"]]
        mean = sum(w for p in row["prompts"] for w in p["wer"]) / 2
        assert row["mean_prompt_wer"] == pytest.approx(mean, abs=1e-3)
    numbers = report["variants"]["numbers"]["request"]
    assert numbers == {"normalize": "numbers"}
    assert "absent" in report["variants"]["default"]["request"]["normalize"]
    assert all(v in wer_roundtrip.table(report) for v in report["variants"])
