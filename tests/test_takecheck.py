"""The take checks on real takes of the bundled voice (synthesized once for the module, through
the engine) and on defects made from them: each reason is raised by the defect it names, and
clean takes, in every output format, pass."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from bench.takes import Take as BenchTake
from bench.takes import decode, defects, renditions
from synth.audio import to_int16, wav_pcm16
from synth.engine import SynthesisItem
from synth.piper_engine import PiperEngine
from synth.takecheck import (
    PAUSE_TRIAL_TAKES,
    Limits,
    SpeakingRates,
    TakeChecker,
    TakeFacts,
    Verdict,
    clause_breaks,
    recognizable,
    word_error_rate,
)

pytestmark = pytest.mark.xdist_group("takecheck")

TEXTS = (
    "Thank you for calling, your order will arrive within three business days.",
    "Press one to speak with a member of our billing team.",
)
VOICE = "piper/joe"


@pytest.fixture(scope="module")
def takes(piper_engine: PiperEngine) -> dict[tuple[str, float], BenchTake]:
    # Piper samples noise (noise_scale, noise_w) unseeded: off, the takes are the same every run.
    quiet = {**piper_engine.default_params("joe"), "noise_scale": 0.0, "noise_w": 0.0}
    out = {}
    for text in TEXTS:
        for speed in (0.5, 1.0, 2.0):
            item = SynthesisItem(text, "joe", speed=speed, params=quiet)
            (audio,) = piper_engine.synthesize_batch([item])
            out[text, speed] = BenchTake(VOICE, text, speed, audio.pcm, audio.sample_rate, 0.0)
    return out


@pytest.fixture(scope="module")
def checker(takes: dict[tuple[str, float], BenchTake]) -> TakeChecker:
    """A checker that has learned the voice's rate from the clean takes, as the seam would."""
    checker = TakeChecker("signal")
    for take in takes.values():
        facts = _facts(take)
        verdict = checker.check(facts)
        assert verdict.ok, verdict
        checker.accepted(facts, verdict)
    return checker


def _facts(take: BenchTake, pcm: np.ndarray | None = None, **changes: Any) -> TakeFacts:
    samples = take.pcm if pcm is None else pcm.astype(np.float32)
    facts = TakeFacts(samples, take.rate, take.text, speed=take.speed, voice=VOICE)
    return dataclasses.replace(facts, **changes)


def reasons(checker: TakeChecker, facts: TakeFacts) -> tuple[str, ...]:
    return checker.check(facts).reasons


def test_clean_takes_pass_in_every_format(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    for take in takes.values():
        for fmt, pcm, rate in renditions(take):
            verdict = checker.check(_facts(take, pcm, sample_rate=rate))
            assert verdict.ok, (fmt, take.speed, verdict.reasons, verdict.measured)


def test_each_defect_is_refused_for_its_own_reason(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    take = takes[TEXTS[0], 1.0]
    ones = {t.text: t for t in takes.values() if t.speed == 1.0}
    cases = defects([take, takes[TEXTS[0], 2.0]], ones, np.random.default_rng(7))
    expected = {
        "silence": "silent",
        "near_silence": "silent",
        "truncated_25": "too_short",
        "truncated_50": "too_short",
        "hole": "hole",
        "noise": "not_speech",
        "hum": "not_speech",
        "tone": "not_speech",
        "wrong_container": "not_audio",
        "clipped": "clipped",
        "speed_ignored": "speed_ignored",
    }
    seen = set()
    for case in cases:
        if case.label in expected:
            got = checker.check(case.facts).reasons
            assert expected[case.label] in got, (case.label, got)
            seen.add(case.label)
    assert seen == set(expected)


def test_runaway_repeats_are_too_long(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    take = takes[TEXTS[1], 1.0]
    looped = np.concatenate([take.pcm, take.pcm[take.pcm.size // 2 :]] + [take.pcm] * 2)
    assert reasons(checker, _facts(take, looped)) == ("too_long",)


def test_a_cut_mid_word_is_too_short_even_when_its_length_is_plausible(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    take = takes[TEXTS[0], 1.0]
    level = np.abs(take.pcm)
    # The loudest point of the last tenth of the speech: cutting there leaves a word unfinished.
    start = int(take.pcm.size * 0.8)
    cut = start + int(np.argmax(level[start : int(take.pcm.size * 0.95)]))
    verdict = checker.check(_facts(take, take.pcm[:cut]))
    assert verdict.reasons == ("too_short",)
    assert verdict.measured["duration_ratio"] > Limits().min_duration_ratio
    assert verdict.measured["end_db"] > Limits().max_end_db


def test_a_pause_the_text_asks_for_is_no_hole(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    take = takes[TEXTS[0], 1.0]
    # A <break> falls between words: here in the voice's own pause at the comma (the quietest
    # point of the first half).
    at = _quietest(take.pcm, take.rate, 0.2, 0.5)
    pause = np.zeros(take.rate * 3, np.float32)
    spliced = np.concatenate([take.pcm[:at], pause, take.pcm[at:]])
    assert "hole" in reasons(checker, _facts(take, spliced))
    assert reasons(checker, _facts(take, spliced, pause_s=3.0)) == ()


def _quietest(pcm: np.ndarray, rate: int, start: float, end: float) -> int:
    """The middle of the quietest 30 ms between shares ``start`` and ``end`` of ``pcm``."""
    frame = rate * 3 // 100
    first, last = int(pcm.size * start) // frame, int(pcm.size * end) // frame
    frames = pcm[first * frame : last * frame].reshape(-1, frame)
    return (first + int(np.argmin(np.mean(frames * frames, axis=1)))) * frame + frame // 2


def test_a_take_without_its_closing_silence_was_cut_off(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    """Synthesis ends a sentence on its own silence; a cut just after the last sound's loud
    part (where the level check alone hears a decay) leaves too little of it."""
    take = takes[TEXTS[1], 1.0]
    level = np.abs(take.pcm)
    last = int(np.flatnonzero(level > level.max() / 30)[-1])
    verdict = checker.check(_facts(take, take.pcm[: last + take.rate // 100]))
    assert verdict.reasons == ("too_short",)
    assert verdict.measured["end_quiet_s"] < Limits().min_end_quiet_s


def test_a_cut_in_a_pause_is_too_short_for_a_voice_that_pauses_at_each_break(
    piper_engine: PiperEngine,
) -> None:
    """Cut in the last comma's pause, the take ends on silence at a plausible length: the
    clause after the comma is missing. A voice that paused at every break in its first takes is
    held to it; before that, the take passes."""
    text = "Your order will arrive within three business days, thank you."
    quiet = {**piper_engine.default_params("joe"), "noise_scale": 0.0, "noise_w": 0.0}
    (audio,) = piper_engine.synthesize_batch([SynthesisItem(text, "joe", params=quiet)])
    take = BenchTake(VOICE, text, 1.0, audio.pcm, audio.sample_rate, 0.0)
    assert clause_breaks(text) == 1
    cut = take.pcm[: _quietest(take.pcm, take.rate, 0.65, 0.9)]
    learner = TakeChecker("signal")
    for _ in range(PAUSE_TRIAL_TAKES - 1):
        learner.accepted(_facts(take), learner.check(_facts(take)))
    assert not learner.rates.keeps_pauses(VOICE)
    assert learner.check(_facts(take, cut)).ok  # its length and its end alone are plausible
    learner.accepted(_facts(take), learner.check(_facts(take)))
    assert learner.rates.keeps_pauses(VOICE)
    verdict = learner.check(_facts(take, cut))
    assert verdict.reasons == ("too_short",) and verdict.measured["pauses"] == 0


def test_clause_breaks_count_pauses_not_abbreviations_or_numbers() -> None:
    assert clause_breaks("Hello, world.") == 1
    assert clause_breaks("Yes. No. Maybe") == 2
    assert clause_breaks("Dr. Smith will see you at 3:30 on Jan. 5, 2027.") == 1
    assert clause_breaks("It costs 1,000 dollars; see example.com now!") == 1
    assert clause_breaks("你好，世界。再见") == 2


def test_digits_are_expected_as_they_are_read(piper_engine: PiperEngine) -> None:
    """A digit run is expected at the length of its English readings (digit by digit, as a
    number, as a year), not at a guess per digit: the speed-1 takes of a spoken code and of a
    phone number, under the addresses of other speeds, are caught; their own takes pass."""
    quiet = {**piper_engine.default_params("joe"), "noise_scale": 0.0, "noise_w": 0.0}

    def take(text: str, speed: float) -> TakeFacts:
        (audio,) = piper_engine.synthesize_batch([SynthesisItem(text, "joe", speed, quiet)])
        return TakeFacts(audio.pcm, audio.sample_rate, text, speed, VOICE)

    checker = TakeChecker("signal")
    for text in TEXTS:  # the voice's rate, learned from takes without digits
        for speed in (0.5, 1.0):
            facts = take(text, speed)
            checker.accepted(facts, checker.check(facts))
    for text, speeds in (
        ("Your code is 4 8 1 5 2 6.", (0.5, 1.5)),
        ("Call 1-800-555-0199.", (0.5,)),
    ):
        one = take(text, 1.0)
        for speed in (1.0, *speeds):
            own = take(text, speed)
            assert checker.check(own).ok, (text, speed, checker.check(own))
        for speed in speeds:
            ignored = dataclasses.replace(one, speed=speed)
            assert checker.check(ignored).reasons == ("speed_ignored",), (text, speed)


def test_a_letter_said_by_its_name_is_not_too_long(
    checker: TakeChecker, piper_engine: PiperEngine
) -> None:
    """A letter on its own, or in a short word the voice cannot read, is said by its name ("S"
    as "ess", "á" as "a acute", "cÄ" as "see a umlaut"), a lone "!" as "exclamation mark", and
    an English voice says a Chinese character as "Chinese letter": such a take is not
    refused as too long, which would refuse every retake too (a 502 for that text every
    time)."""
    quiet = {**piper_engine.default_params("joe"), "noise_scale": 0.0, "noise_w": 0.0}
    for text in ("S", "W.", "á", "ß", "Ω", "ñ.", "cÄ", "é6", "!", ";\n!\t\tá", "中", "\t\t𢓁"):
        for speed in (1.0, 0.37):
            (audio,) = piper_engine.synthesize_batch([SynthesisItem(text, "joe", speed, quiet)])
            facts = TakeFacts(audio.pcm, audio.sample_rate, text, speed, VOICE)
            assert checker.check(facts).ok, (text, speed, checker.check(facts))


def test_a_dropout_inside_speech_is_spliced(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    """A sound that stops dead (a dropout, or pieces joined) where the voice's sounds decay."""
    take = takes[TEXTS[1], 1.0]
    loudest = int(np.argmax(np.abs(take.pcm[: take.pcm.size // 2])))
    dropped = take.pcm.copy()
    dropped[loudest : loudest + take.rate // 5] = 0.0
    assert "spliced" in reasons(checker, _facts(take, dropped))


def test_signal_defects_without_a_take(checker: TakeChecker) -> None:
    rate = 22050
    text = "Your appointment is confirmed."
    nan = np.zeros(rate, np.float32)
    nan[100] = np.nan
    assert reasons(checker, TakeFacts(nan, rate, text)) == ("non_finite",)
    assert reasons(checker, TakeFacts(np.zeros(rate, np.float32), 4000, text)) == ("bad_rate",)
    assert reasons(checker, TakeFacts(np.zeros(rate, np.float32), 96000, text)) == ("bad_rate",)
    empty = TakeFacts(np.zeros(0, np.float32), rate, text)
    assert reasons(checker, empty) == ("silent",)


def test_dc_offset(checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]) -> None:
    take = takes[TEXTS[1], 1.0]
    shifted = take.pcm * 0.5 + 0.2
    assert "dc_offset" in reasons(checker, _facts(take, shifted))


def test_wav_bytes_played_as_samples_are_not_audio(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    take = takes[TEXTS[1], 1.0]
    body = wav_pcm16(to_int16(take.pcm), take.rate)
    raw, _ = decode(body[: len(body) // 2 * 2], "pcm", 24000)
    assert reasons(checker, _facts(take, raw, sample_rate=24000)) == ("not_audio",)


def test_skipped_reasons_are_not_raised(
    checker: TakeChecker, takes: dict[tuple[str, float], BenchTake]
) -> None:
    take = takes[TEXTS[1], 1.0]
    clipped = np.clip(take.pcm * 4, -1, 1)
    assert "clipped" in reasons(checker, _facts(take, clipped))
    loose = Limits().loosened(skip=frozenset({"clipped"}))
    assert "clipped" not in checker.check(_facts(take, clipped), loose).reasons


def test_off_checks_nothing_and_levels_are_named() -> None:
    silent = TakeFacts(np.zeros(8000, np.float32), 8000, "Hello there.")
    assert TakeChecker("off").check(silent) == Verdict()
    with pytest.raises(ValueError, match="take_checks"):
        TakeChecker("loud")  # type: ignore[arg-type]


def test_speaking_rates_start_from_the_prior_and_learn_per_voice() -> None:
    rates = SpeakingRates({"en": 15.0})
    assert rates.chars_per_s("a", "en-US") == pytest.approx(15.0)
    assert rates.chars_per_s("a", "xx") == pytest.approx(13.0)  # no prior for the language
    facts = TakeFacts(np.zeros(1, np.float32), 16000, "x" * 300, speed=2.0, voice="a")
    rates.learn(facts, 5.0)  # 300 characters in 10 s at speed 1: a slow voice
    learned = rates.chars_per_s("a", "en")
    assert learned == pytest.approx((300 + 15 * 30) / (10 + 30))
    assert rates.chars_per_s("b", "en") == pytest.approx(15.0)


def test_word_error_rate() -> None:
    assert word_error_rate(["a", "b", "c"], ["a", "b", "c"]) == 0.0
    assert word_error_rate(["a", "b", "c"], ["a", "c"]) == pytest.approx(1 / 3)
    assert word_error_rate(["a", "b"], ["x", "y", "z"]) == pytest.approx(3 / 2)
    assert word_error_rate(["a"], []) == 1.0
    assert word_error_rate([], []) == 0.0


def test_asr_reads_a_clean_take_and_refuses_babble(
    takes: dict[tuple[str, float], BenchTake],
) -> None:
    pytest.importorskip("pocketsphinx")
    checker = TakeChecker("asr")
    take = takes[TEXTS[1], 1.0]
    verdict = checker.check(_facts(take))
    assert verdict.ok and verdict.measured["wer"] <= Limits().max_wer, verdict.measured
    # The other sentence's audio under this text: speech, plausible length, wrong words.
    other = takes[TEXTS[0], 1.0]
    wrong = _facts(other, text=take.text)
    got = checker.check(wrong, Limits().loosened(skip=frozenset({"too_long", "too_short"})))
    assert got.reasons == ("asr_mismatch",), got.measured


def test_asr_without_pocketsphinx_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pocketsphinx" else real(name, *a),
    )
    with pytest.raises(ValueError, match=r"voxgate\[asr\]"):
        TakeChecker("asr")


def test_asr_judges_english_words_at_speeds_it_reads() -> None:
    """Texts with digits (read one way or another, each time the same), fast takes and a word
    or two pass on the signal checks alone: the recognizer would refuse every retake of them."""
    pcm = np.zeros(16000, np.float32)
    said = TakeFacts(pcm, 16000, "Please hold while we connect you.")
    assert recognizable(said)
    assert not recognizable(dataclasses.replace(said, text="Call 1-800-555-0199 now please."))
    assert not recognizable(dataclasses.replace(said, speed=1.5))
    assert not recognizable(dataclasses.replace(said, text="Goodbye now."))
    assert not recognizable(dataclasses.replace(said, language="de"))
