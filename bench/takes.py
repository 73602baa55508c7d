"""How well the take checks (synth/takecheck.py) tell bad takes from good ones, and what they cost.

Real takes of the bundled Piper voice (joe) and of a Coqui VITS (the random-weight model the
tests build, bench/harness.py) at speeds 0.5-2 are the clean corpus, each also rendered through
every output format and decoded back. Defects are made from the Piper takes, one class at a time:
silence, truncation at several points, holes, noise, hum, tone, a WAV read as raw pcm, speed
ignored, clipping, runaway repeats, babble spliced from other takes. For each class the catch
rate at the ``signal`` level (and at ``asr`` for babble and a sample of clean takes), the false
flags over the clean takes, and the checks' CPU beside the synthesis CPU they guard (same
process, same takes, one thread). The texts and the defects are seeded; the takes are not quite:
Piper samples its own noise (noise_scale), so figures move a little from run to run.

    python -m bench.takes            # writes docs/bench/takes.json and takes.png
    python -m bench.takes --texts 6 --no-write
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.common import RESULTS, provenance, write_results
from bench.plots import label_bars, pyplot, save_figure
from synth.audio import FORMATS, output_rate, render, to_int16, wav_pcm16
from synth.engine import SynthesisItem
from synth.takecheck import (
    MIN_SPEED_EVIDENCE_S,
    Limits,
    TakeChecker,
    TakeFacts,
    Verdict,
    recognizable,
)

PCM = npt.NDArray[np.float32]
SPEEDS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)

_OPENINGS = [
    "Thank you for calling",
    "Your order",
    "Press one",
    "Our office",
    "The next train",
    "Please hold while",
    "Your balance",
    "Welcome back",
    "The meeting",
    "Your appointment",
]
_MIDDLES = [
    "is confirmed for Tuesday at ten in the morning",
    "will arrive within three business days",
    "to speak with a member of our billing team",
    "is closed on public holidays and weekends",
    "leaves from platform four in twelve minutes",
    "we connect you to the next available agent",
    "is forty two dollars and seventeen cents",
    "we saved your place in the queue",
    "has moved to the large room on the second floor",
    "can be changed online or by calling us back",
]
_ENDINGS = ["", ", thank you", ", and have a nice day", ". Goodbye", "; we are sorry for the wait"]
_SHORT = ["Hello.", "Yes.", "Goodbye for now.", "Please hold.", "One moment please."]
# Short IVR prompts as callers hear them, numbers as they are written: the texts whose length
# is least told by their characters ("Your order shipped." is said in 0.6 s, 17 letters).
PROMPTS = [
    "Your order shipped.",
    "Good morning.",
    "Goodbye.",
    "Thank you.",
    "Press two for billing.",
    "Your call is important to us.",
    "Sorry, I did not get that.",
    "Please try again.",
    "Main menu.",
    "Your PIN is 0042.",
    "Call 1-800-555-0199.",
    "Your balance is $42.50.",
    "It arrives on Friday.",
    "No.",
    "Okay.",
    "Transferring you now.",
    "Please enter your account number.",
    "That is not a valid option.",
    "Your appointment is at 3:30 PM.",
    "Dial 911 for emergencies.",
    "Your code is 7 7 3 9.",
    "We are open 9 to 5.",
    "Invalid entry.",
    "Thanks for calling Acme Corp.",
]


def texts(count: int, seed: int = 0, prompts: bool = True) -> list[str]:
    """The short IVR :data:`PROMPTS` (with ``prompts``), then ``count`` distinct sentences of one
    to about twenty words, the same for a seed."""
    rng = np.random.default_rng(seed)
    out: list[str] = list(_SHORT[: max(1, count // 10)])
    while len(out) < count:
        opening = _OPENINGS[rng.integers(len(_OPENINGS))]
        middle = _MIDDLES[rng.integers(len(_MIDDLES))]
        ending = _ENDINGS[rng.integers(len(_ENDINGS))]
        sentence = f"{opening} {middle}{ending}."
        if rng.random() < 0.25:  # two sentences in one take: a pause between them
            sentence += f" {_SHORT[rng.integers(len(_SHORT))]}"
        if sentence not in out:
            out.append(sentence)
    return (PROMPTS if prompts else []) + out


@dataclass
class Take:
    voice: str
    text: str
    speed: float
    pcm: PCM
    rate: int
    synth_cpu_s: float


def synthesize(engine: Any, voice: str, name: str, sentences: Sequence[str]) -> list[Take]:
    """Every sentence at every speed, one at a time, with the CPU each took."""
    takes = []
    for text in sentences:
        for speed in SPEEDS:
            start = time.process_time()
            (audio,) = engine.synthesize_batch([SynthesisItem(text, voice, speed=speed)])
            cpu = time.process_time() - start
            takes.append(Take(name, text, speed, audio.pcm, audio.sample_rate, cpu))
    return takes


def decode(data: bytes, fmt: str, rate: int) -> tuple[PCM, int]:
    """A rendition back to float PCM and its rate, through FFmpeg (PyAV) as a player would
    (Opus decodes at 48 kHz whatever it was made at)."""
    import av

    raw = {"pcm": "s16le", "ulaw": "mulaw", "alaw-raw": "alaw", "gsm": "gsm", "g722": "g722"}
    options = {"sample_rate": str(rate), "ch_layout": "mono"} if fmt in raw else {}
    chunks = []
    with av.open(io.BytesIO(data), format=raw.get(fmt), options=options) as container:
        for frame in container.decode(audio=0):
            chunks.append(frame.to_ndarray().astype(np.float32).reshape(-1))
            rate = frame.sample_rate
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if pcm.size and np.abs(pcm).max() > 2.0:  # integer samples
        pcm /= 32768.0
    return pcm, rate


def renditions(take: Take) -> list[tuple[str, PCM, int]]:
    """The take rendered in every output format and decoded back."""
    out = []
    for name, fmt in FORMATS.items():
        rate = output_rate(fmt, take.rate, None)
        out.append((name, *decode(render(take.pcm, take.rate, fmt, rate), name, rate)))
    return out


# ---- defects -------------------------------------------------------------------------------------


@dataclass
class Case:
    label: str
    facts: TakeFacts


def _facts(take: Take, pcm: PCM, rate: int | None = None, speed: float | None = None) -> TakeFacts:
    return TakeFacts(
        np.asarray(pcm, dtype=np.float32),
        rate or take.rate,
        take.text,
        speed=take.speed if speed is None else speed,
        voice=take.voice,
    )


def _level(rng: np.random.Generator) -> float:
    return float(10 ** (rng.uniform(-30, -6) / 20))


def defects(takes: Sequence[Take], ones: dict[str, Take], rng: np.random.Generator) -> list[Case]:
    """Bad takes made from ``takes`` (their clean versions), each class on every take."""
    cases: list[Case] = []
    for take in takes:
        pcm, rate, n = take.pcm, take.rate, take.pcm.size
        t = np.arange(n) / rate
        silent = np.zeros(n, np.float32)
        if rng.random() < 0.5:
            silent = (rng.standard_normal(n) * 10 ** (-70 / 20)).astype(np.float32)
        cases.append(Case("silence", _facts(take, silent)))
        cases.append(Case("near_silence", _facts(take, pcm * 10 ** (-60 / 20))))
        # Cut at a share of the speech (first to last sound above -50 dB), not of the take:
        # cutting only its closing silence leaves nothing wrong.
        sounding = np.flatnonzero(np.abs(pcm) > 10 ** (-50 / 20))
        first, last = int(sounding[0]), int(sounding[-1])
        for cut in (0.25, 0.5, 0.75, 0.9):
            end = first + int((last - first) * cut)
            cases.append(Case(f"truncated_{int(cut * 100)}", _facts(take, pcm[:end])))
        at = int(n * rng.uniform(0.3, 0.7))
        hole = np.zeros(int(rate * rng.uniform(2.5, 5.0)), np.float32)
        cases.append(Case("hole", _facts(take, np.concatenate([pcm[:at], hole, pcm[at:]]))))
        white = rng.standard_normal(n)
        pink = np.cumsum(rng.standard_normal(n))
        pink -= np.convolve(pink, np.ones(64) / 64, mode="same")  # no drift: brown-ish hiss
        noise = white if rng.random() < 0.5 else pink
        noise = noise / np.abs(noise).max() * _level(rng)
        cases.append(Case("noise", _facts(take, noise.astype(np.float32))))
        mains = rng.choice([50.0, 60.0])
        hum = sum(np.sin(2 * np.pi * mains * k * t) / k for k in (1, 2, 3, 5, 7))
        cases.append(
            Case("hum", _facts(take, (hum / np.abs(hum).max() * _level(rng)).astype(np.float32)))
        )
        tone = np.sin(2 * np.pi * rng.uniform(300, 3000) * t)
        if rng.random() < 0.5:  # beeping: on and off every half second
            tone *= (t % 1.0) < 0.5
        cases.append(Case("tone", _facts(take, (tone * _level(rng)).astype(np.float32))))
        # A WAV answer read as raw 16-bit pcm at OpenAI's 24 kHz: its header plays as samples.
        body = wav_pcm16(to_int16(pcm), rate)
        raw = np.frombuffer(body[: len(body) // 2 * 2], dtype="<i2").astype(np.float32) / 32768
        cases.append(Case("wrong_container", _facts(take, raw, rate=24000)))
        gain = rng.choice([2.0, 4.0, 8.0])
        cases.append(Case("clipped", _facts(take, np.clip(pcm * gain, -1, 1))))
        start = int(n * rng.uniform(0.3, 0.6))
        loops = [pcm[start:]] * int(rng.integers(2, 5))
        cases.append(Case("runaway_repeats", _facts(take, np.concatenate([pcm, *loops]))))
        if take.speed != 1.0:
            # Speed 1's take under the asked speed's address. Within 0.75-1.25 the length alone
            # cannot tell (a sentence's own pace varies as much): reported as a class apart.
            # Nor can it for a text said in under MIN_SPEED_EVIDENCE_S (2 s) at speed 1: a short
            # prompt's own pace varies as much (synth/takecheck.py).
            label = "speed_ignored"
            if abs(np.log(take.speed)) < 0.4:
                label = "speed_ignored_0.75_1.25"
            elif ones[take.text].pcm.size < MIN_SPEED_EVIDENCE_S * ones[take.text].rate:
                label = "speed_ignored_short_text"
            cases.append(Case(label, _facts(take, ones[take.text].pcm)))
    return cases


def babble(takes: Sequence[Take], rng: np.random.Generator) -> list[Case]:
    """Each take's length of pieces (0.2-0.6 s) cut from the other sentences' takes."""
    cases = []
    for take in takes:
        others = [o for o in takes if o.text != take.text]
        pieces: list[PCM] = []
        length = 0
        while length < take.pcm.size:
            source = others[rng.integers(len(others))].pcm
            size = int(take.rate * rng.uniform(0.2, 0.6))
            at = int(rng.integers(0, max(1, source.size - size)))
            pieces.append(source[at : at + size])
            length += pieces[-1].size
        cases.append(Case("babble", _facts(take, np.concatenate(pieces)[: take.pcm.size])))
    return cases


# ---- measuring -----------------------------------------------------------------------------------


def timed_checks(checker: TakeChecker, cases: Sequence[Case]) -> tuple[list[Verdict], float]:
    start = time.process_time()
    verdicts = [checker.check(c.facts, Limits()) for c in cases]
    return verdicts, time.process_time() - start


def rates_by_label(cases: Sequence[Case], verdicts: Sequence[Verdict]) -> dict[str, Any]:
    caught: Counter[str] = Counter()
    total: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = {}
    for case, verdict in zip(cases, verdicts, strict=True):
        total[case.label] += 1
        caught[case.label] += not verdict.ok
        reasons.setdefault(case.label, Counter()).update(verdict.reasons)
    return {
        label: {
            "takes": total[label],
            "caught": caught[label],
            "rate": caught[label] / total[label],
            "reasons": dict(reasons[label].most_common()),
        }
        for label in total
    }


def piper_engine() -> Any:
    from synth.piper_engine import PiperEngine, PiperVoiceFiles

    engine = PiperEngine([PiperVoiceFiles.bundled_joe()], intra_op_threads=1)
    engine.load()
    return engine


def coqui_engine(size: str) -> Any:
    """The Coqui VITS the tests build (bench/harness.py), with random weights: what it says is
    not speech, but it costs what a Coqui model of its size costs."""
    import tempfile

    import torch

    from bench.harness import build_vits
    from synth.coqui_engine import CoquiEngine

    torch.set_num_threads(1)  # one core, as the Piper voice
    model, config = build_vits(Path(tempfile.mkdtemp(prefix="voxgate-takes-vits-")), size=size)
    engine = CoquiEngine(model, config, intra_op_threads=1)
    engine.load()
    return engine


def upstream_takes(sentences: Sequence[str]) -> tuple[list[Take], list[Take], list[Case]]:
    """Takes from a real third-party server, local-tts-studio (PyPI; Piper voices, here joe),
    as an upstream: its speed-1 WAV answers (clean), its answers to speed 0.5 and 2 (it drops
    ``speed``), and its WAV bodies read as raw pcm at 24 kHz (what an upstream with
    ``format = "pcm"`` did with a server that answers WAV)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    import urllib.request

    import soundfile as sf

    from bench.harness import free_port
    from synth.piper_engine import PiperVoiceFiles

    data = Path(tempfile.mkdtemp(prefix="voxgate-takes-lts-"))
    (data / "voices").mkdir()
    joe = PiperVoiceFiles.bundled_joe()
    for src in (joe.model_path, joe.config_path):
        (data / "voices" / src.name).write_bytes(src.read_bytes())
    settings = {"api_default_voice": joe.model_path.stem, "device": "cpu"}
    (data / "settings.json").write_text(json.dumps(settings))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_tts.cli", "--port", str(port)],
        env={**os.environ, "LOCAL_TTS_DATA_DIR": str(data)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    clean: list[Take] = []
    ignored: list[Take] = []
    as_pcm: list[Case] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("local-tts-studio did not start") from None
                time.sleep(0.1)
        for text in sentences:
            for speed in (0.5, 1.0, 2.0):
                body = {"model": "tts-1", "input": text, "voice": "alloy", "speed": speed}
                request = urllib.request.Request(
                    f"{url}/audio/speech",
                    data=json.dumps({**body, "response_format": "wav"}).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=120) as resp:
                    wav = resp.read()
                pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
                take = Take("upstream/local-tts-studio", text, speed, pcm, rate, 0.0)
                (clean if speed == 1.0 else ignored).append(take)
                if speed == 1.0:
                    raw = np.frombuffer(wav[: len(wav) // 2 * 2], dtype="<i2") / np.float32(32768)
                    as_pcm.append(Case("upstream_wav_as_pcm", _facts(take, raw, rate=24000)))
    finally:
        proc.terminate()
        proc.wait(30)
    return clean, ignored, as_pcm


def learn_and_time(checker: TakeChecker, takes: Sequence[Take]) -> tuple[list[Verdict], float]:
    """Check each take as the seam would, the accepted ones teaching their voice's rate; the
    CPU of the pass."""
    verdicts = []
    start = time.process_time()
    for take in takes:
        facts = _facts(take, take.pcm)
        verdict = checker.check(facts)
        if verdict.ok:
            checker.accepted(facts, verdict)
        verdicts.append(verdict)
    return verdicts, time.process_time() - start


def cost_of(takes: Sequence[Take], check_cpu: float) -> dict[str, float]:
    synth_cpu = sum(t.synth_cpu_s for t in takes)
    audio_s = sum(t.pcm.size / t.rate for t in takes)
    return {
        "takes": len(takes),
        "audio_s": audio_s,
        "synthesis_cpu_s": synth_cpu,
        "synthesis_ms_per_audio_s": 1000 * synth_cpu / audio_s,
        "signal_checks_cpu_s": check_cpu,
        "signal_ms_per_audio_s": 1000 * check_cpu / audio_s,
        "signal_over_synthesis": check_cpu / synth_cpu,
    }


def clean_row(cases: Sequence[Case], verdicts: Sequence[Verdict]) -> dict[str, Any]:
    flagged = [(c, v) for c, v in zip(cases, verdicts, strict=True) if not v.ok]
    return {
        "takes": len(cases),
        "flagged": len(flagged),
        "false_flag_rate": len(flagged) / len(cases),
        "reasons": dict(Counter(r for _, v in flagged for r in v.reasons).most_common()),
        "flagged_by_rendering": dict(Counter(c.label for c, _ in flagged)),
        "flagged_examples": [
            {
                "rendering": c.label,
                "speed": c.facts.speed,
                "words": len(c.facts.text.split()),
                "reasons": list(v.reasons),
                **{k: round(x, 3) for k, x in v.measured.items()},
            }
            for c, v in flagged[:12]
        ],
    }


def run(
    count: int,
    *,
    coqui: str | None = "tiny",
    upstream: bool = True,
    asr: int = 60,
    seed: int = 0,
    prompts: bool = True,
) -> dict[str, Any]:
    provenance()
    sentences = texts(count, seed, prompts)
    rng = np.random.default_rng(seed)
    report: dict[str, Any] = {
        "texts": len(sentences),
        "speeds": list(SPEEDS),
        "renderings": ["engine", *FORMATS],
        "seed": seed,
        "limits": Limits().__dict__ | {"skip": []},
    }
    signal = TakeChecker("signal")
    piper = synthesize(piper_engine(), "joe", "piper/joe", sentences)
    verdicts, check_cpu = learn_and_time(signal, piper)
    report["cost"] = {"piper/joe": cost_of(piper, check_cpu)}
    cases = [Case("engine", _facts(t, t.pcm)) for t in piper]
    cases += [
        Case(fmt, TakeFacts(pcm, rate, t.text, t.speed, t.voice))
        for t in piper
        for fmt, pcm, rate in renditions(t)
    ]
    verdicts, _ = timed_checks(signal, cases)
    report["clean"] = {"piper/joe": clean_row(cases, verdicts)}

    ones = {t.text: t for t in piper if t.speed == 1.0}
    bad = defects(piper, ones, rng) + babble(piper, rng)
    if coqui:
        # Its takes are random-weight buzz: a class of bad takes, and a cost beside its synthesis.
        vits = synthesize(coqui_engine(coqui), "default", f"coqui/vits-{coqui}", sentences)
        verdicts, check_cpu = learn_and_time(signal, vits)
        report["cost"][f"coqui/vits-{coqui}"] = cost_of(vits, check_cpu)
        bad += [Case("coqui_random_weights", _facts(t, t.pcm)) for t in vits]
    if upstream:
        generated = sentences[len(PROMPTS) :] if prompts else sentences
        clean, ignored, as_pcm = upstream_takes(generated[: max(4, count // 4)])
        cases = [Case("wav", _facts(t, t.pcm)) for t in clean]
        verdicts, _ = learn_and_time(signal, clean)
        report["clean"]["upstream/local-tts-studio"] = clean_row(cases, verdicts)
        long_enough = [
            t for t in ignored if ones[t.text].pcm.size >= MIN_SPEED_EVIDENCE_S * ones[t.text].rate
        ]
        bad += [Case("upstream_speed_ignored", _facts(t, t.pcm)) for t in long_enough]
        bad += as_pcm
    verdicts, _ = timed_checks(signal, bad)
    report["signal"] = rates_by_label(bad, verdicts)
    truncated = [
        (c, v) for c, v in zip(bad, verdicts, strict=True) if c.label.startswith("truncated")
    ]
    report["signal"]["truncated (all points)"] = rates_by_label(
        [Case("truncated (all points)", c.facts) for c, _ in truncated], [v for _, v in truncated]
    )["truncated (all points)"]
    all_clean = sum(r["takes"] for r in report["clean"].values())
    all_flagged = sum(r["flagged"] for r in report["clean"].values())
    report["false_flag_rate"] = all_flagged / all_clean
    report["clean_takes"] = all_clean
    if asr:
        spliced = [c for c in bad if c.label == "babble"]
        report["asr"] = asr_level(piper, spliced, asr, rng)
    return report


def asr_level(
    takes: Sequence[Take], spliced: Sequence[Case], count: int, rng: np.random.Generator
) -> dict[str, Any]:
    """The ``asr`` level on ``count`` clean Piper takes the recognizer can judge (English, up to
    1.5x, three words or more) and on the babble made of the same: catch rate, false flags, the
    word error rates behind the threshold, and its CPU per second of audio."""
    checker = TakeChecker("asr")
    for take in takes:
        checker.accepted(_facts(take, take.pcm))
    judged = [i for i, t in enumerate(takes) if recognizable(_facts(t, t.pcm))]
    picks = rng.choice(judged, size=min(count, len(judged)), replace=False)
    clean = [Case("clean", _facts(takes[i], takes[i].pcm)) for i in picks]
    babbled = [spliced[i] for i in picks]
    clean_verdicts, cpu = timed_checks(checker, clean)
    babble_verdicts, _ = timed_checks(checker, babbled)
    audio_s = sum(c.facts.pcm.size / c.facts.sample_rate for c in clean)
    clean_wer = [v.measured.get("wer", 0.0) for v in clean_verdicts]
    babble_wer = [v.measured.get("wer", 0.0) for v in babble_verdicts]
    synth = sum(takes[i].synth_cpu_s for i in picks)
    return {
        "takes": len(clean),
        "babble_caught_rate": float(np.mean([not v.ok for v in babble_verdicts])),
        "babble_caught_by_asr_rate": float(
            np.mean(["asr_mismatch" in v.reasons for v in babble_verdicts])
        ),
        "clean_false_flag_rate": float(np.mean([not v.ok for v in clean_verdicts])),
        "clean_wer_p50_p95_max": [float(np.percentile(clean_wer, q)) for q in (50, 95, 100)],
        "babble_wer_min_p5_p50": [float(np.percentile(babble_wer, q)) for q in (0, 5, 50)],
        "max_wer": Limits().max_wer,
        "asr_ms_per_audio_s": 1000 * cpu / audio_s,
        "asr_over_synthesis": cpu / synth,
    }


def plot(report: dict[str, Any]) -> Path:
    plt = pyplot()
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 1.2]}
    )
    labels = list(report["signal"])
    values = [100 * report["signal"][k]["rate"] for k in labels]
    if "asr" in report:
        labels.append("babble (asr)")
        values.append(100 * report["asr"]["babble_caught_rate"])
    bars = left.bar(labels, values, color="#3b7dd8")
    label_bars(left, bars, values, small=".0f", fontsize=7)
    left.axhline(95, color="red", linestyle="--", label="target 95%")
    left.set_ylabel("caught (%)")
    left.set_ylim(0, 112)
    left.tick_params(axis="x", rotation=70, labelsize=7)
    left.legend(loc="lower left", fontsize=8)
    left.set_title("Bad takes caught (signal level; babble also at asr)")
    names = [f"false flags\n{n}" for n in report["clean"]]
    values = [100 * r["false_flag_rate"] for r in report["clean"].values()]
    names += [f"CPU / synthesis\n{n}" for n in report["cost"]]
    values += [100 * r["signal_over_synthesis"] for r in report["cost"].values()]
    colors = ["#e07b39"] * len(report["clean"]) + ["#5aa469"] * len(report["cost"])
    bars = right.bar(range(len(names)), values, color=colors)
    label_bars(right, bars, values, fontsize=7)
    right.set_xticks(range(len(names)), names, fontsize=6, rotation=30, ha="right")
    right.axhline(0.5, color="#e07b39", linestyle=":", label="false flags target 0.5%")
    right.axhline(5, color="#5aa469", linestyle=":", label="CPU target 5%")
    right.set_ylabel("%")
    right.legend(fontsize=7)
    right.set_title("Clean takes and cost")
    return save_figure(fig, RESULTS / "takes.png")


def table(report: dict[str, Any]) -> str:
    lines = [f"{'class':<26} {'takes':>6} {'caught':>8}  reasons"]
    for label, row in report["signal"].items():
        reasons = ", ".join(f"{k} {v}" for k, v in row["reasons"].items())
        lines.append(f"{label:<26} {row['takes']:>6} {100 * row['rate']:>7.1f}%  {reasons}")
    if "asr" in report:
        a = report["asr"]
        lines.append(
            f"{'babble (asr level)':<26} {a['takes']:>6} {100 * a['babble_caught_rate']:>7.1f}%"
            f"  clean flagged {100 * a['clean_false_flag_rate']:.1f}% of {a['takes']};"
            f" {a['asr_ms_per_audio_s']:.0f} ms CPU per audio s"
            f" ({100 * a['asr_over_synthesis']:.0f}% of synthesis)"
        )
    for name, row in report["clean"].items():
        lines.append(
            f"clean {name:<20} {row['takes']:>6} flagged {100 * row['false_flag_rate']:.2f}%"
            f" {row['reasons']}"
        )
    for name, c in report["cost"].items():
        lines.append(
            f"cost  {name:<20} checks {c['signal_ms_per_audio_s']:.2f} ms per audio s,"
            f" synthesis {c['synthesis_ms_per_audio_s']:.1f}:"
            f" {100 * c['signal_over_synthesis']:.2f}% of synthesis CPU"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--texts", type=int, default=40, help="sentences, each at 6 speeds")
    parser.add_argument("--asr", type=int, default=60, help="takes checked at asr (0: none)")
    parser.add_argument(
        "--coqui", default="tiny", choices=["tiny", "ljspeech", "none"], help="the VITS size"
    )
    parser.add_argument("--no-upstream", action="store_true", help="no local-tts-studio")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--verbose", action="store_true", help="print the flagged clean takes")
    args = parser.parse_args(argv)
    report = run(
        args.texts,
        coqui=None if args.coqui == "none" else args.coqui,
        upstream=not args.no_upstream,
        asr=args.asr,
        seed=args.seed,
    )
    print(table(report))
    if args.verbose:
        print(json.dumps({n: r["flagged_examples"] for n, r in report["clean"].items()}, indent=1))
    if not args.no_write:
        print(write_results("takes", report), plot(report))


if __name__ == "__main__":
    main()
