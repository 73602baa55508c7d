"""Word error rate of a speech-recognition round trip: do callers hear the numbers of a prompt?

Each IVR prompt of bench/corpora/wer_prompts.txt (the written prompt, then the words a caller
expects to hear) is synthesized by a real gateway (``voxgate serve`` on a loopback port, a temp
cache dir, the bundled Piper voice ``joe``, WAV at 16 kHz), once per front end:

- ``none``: ``"normalize": "none"``, the text as written (the voice's phonemizer reads digits);
- ``numbers``: ``"normalize": "numbers"``, the gateway's readings;
- ``default``: no ``normalize`` field, whatever the server's ``normalize`` setting is.

pocketsphinx (its US English model, shipped in the wheel; the ``asr`` extra) recognizes each
take, as the take checks' ``asr`` level does (synth/takecheck.py: default model and language
model, no grammar). The word error rate is against the closest of the prompt's expected
readings (lower case, punctuation dropped: ``bench.normalize_eval.canon``), and over a variant it
is the edits of all prompts over all their reference words. Computed by jiwer where it is
installed; the dev install does not carry it, and the take checks' own word-level Levenshtein
(``synth.takecheck.word_error_rate``, the same measure) stands in. Piper samples its own noise, so
a take (and the figures) can move a little from run to run; ``--rounds`` pools several.

    python -m bench.wer_roundtrip                 # writes docs/bench/wer.json and wer.png
    python -m bench.wer_roundtrip --prompts 5 --no-write
    python -m bench.wer_roundtrip --rounds 3        # each round a fresh gateway: new takes
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import bar_plot, post, provenance, start_gateway, stop, write_results
from bench.harness import free_port, speech_body
from bench.normalize_eval import Case, canon, load_corpus
from synth.takecheck import word_error_rate

VARIANTS: dict[str, dict[str, str]] = {
    "none": {"normalize": "none"},
    "numbers": {"normalize": "numbers"},
    "default": {},
}
RATE = 16000  # pocketsphinx's model rate: the gateway resamples, not the bench


def words(text: str) -> list[str]:
    """What is compared: lower-case words, punctuation and hyphens aside."""
    return canon(text, "en").split()


def closest(case: Case, heard: list[str]) -> list[str]:
    """The expected reading of ``case`` nearest to what was ``heard`` (fewest word edits)."""
    return min((words(r) for r in case.readings), key=lambda ref: word_error_rate(ref, heard))


def corpus_wer(references: Sequence[list[str]], heard: Sequence[list[str]]) -> tuple[float, str]:
    """All edits over all reference words, and what computed it."""
    try:
        import jiwer
    except ImportError:
        edits = sum(word_error_rate(r, h) * len(r) for r, h in zip(references, heard, strict=True))
        return edits / sum(len(r) for r in references), "synth.takecheck.word_error_rate"
    value = jiwer.wer([" ".join(r) for r in references], [" ".join(h) for h in heard])
    return float(value), "jiwer"


class Recognizer:
    """pocketsphinx with its own US English model, as the take checks' ``asr`` level runs it."""

    def __init__(self) -> None:
        from pocketsphinx import Config, Decoder

        self.decoder = Decoder(Config(loglevel="FATAL"))

    def hear(self, wav: bytes) -> str:
        with wave.open(io.BytesIO(wav)) as w:
            if (w.getframerate(), w.getsampwidth(), w.getnchannels()) != (RATE, 2, 1):
                raise ValueError(f"expected 16-bit mono {RATE} Hz WAV, got {w.getparams()}")
            pcm = w.readframes(w.getnframes())
        self.decoder.start_utt()
        self.decoder.process_raw(pcm, False, True)
        self.decoder.end_utt()
        hyp = self.decoder.hyp()
        return hyp.hypstr if hyp is not None else ""


def default_normalize() -> str:
    """The server's ``normalize`` setting when nothing overrides it (the ``default`` variant)."""
    from gateway.runtime.settings import Settings

    return str(Settings.model_fields["normalize"].default)


def hear_round(
    cases: Sequence[Case], variants: Sequence[str], recognizer: Recognizer
) -> dict[str, list[str]]:
    """One gateway (a fresh cache, so every take is synthesized anew): what was heard of each
    prompt in each variant."""
    heard: dict[str, list[str]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_gateway(
            port, Path(tmp) / "cache", "--log-level", "warning", log_path=Path(tmp) / "gateway.log"
        )
        try:
            url = f"http://127.0.0.1:{port}/v1/audio/speech"
            for case in cases:
                for variant in variants:
                    body = speech_body(
                        case.text, voice="joe", sample_rate=RATE, stream=False, **VARIANTS[variant]
                    )
                    status, _, wav = post(url, body)
                    if status != 200:
                        raise RuntimeError(f"{variant}: {status} for {case.text!r}")
                    heard[variant].append(recognizer.hear(wav))
        finally:
            stop(proc)
    return heard


def run(
    count: int = 40, variants: Sequence[str] = tuple(VARIANTS), rounds: int = 1
) -> dict[str, Any]:
    """Synthesize the first ``count`` prompts in every variant, ``rounds`` times (Piper's takes
    differ a little), recognize, score: WER pooled over the rounds, and each round's."""
    cases = load_corpus("wer_prompts")[:count]
    recognizer = Recognizer()
    started = time.perf_counter()
    heard = [hear_round(cases, variants, recognizer) for _ in range(rounds)]
    rows: dict[str, Any] = {}
    tool = ""
    for variant in variants:
        said = [[words(h) for h in r[variant]] for r in heard]
        refs = [[closest(c, h) for c, h in zip(cases, s, strict=True)] for s in said]
        value, tool = corpus_wer([x for r in refs for x in r], [x for s in said for x in s])
        per_round = [corpus_wer(r, s)[0] for r, s in zip(refs, said, strict=True)]
        per_prompt = [
            [word_error_rate(r, h) for r, h in zip(rr, ss, strict=True)]
            for rr, ss in zip(refs, said, strict=True)
        ]
        flat = [w for p in per_prompt for w in p]
        rows[variant] = {
            "request": VARIANTS[variant]
            or {"normalize": f"(absent: server default {default_normalize()!r})"},
            "wer": round(value, 4),
            "wer_per_round": [round(w, 4) for w in per_round],
            "mean_prompt_wer": round(sum(flat) / len(flat), 4),
            "prompts_heard_exactly": sum(w == 0 for w in flat),
            "takes": len(flat),
            "reference_words": sum(len(x) for r in refs for x in r),
            "prompts": [
                {
                    "text": c.text,
                    "heard": [r[variant][i] for r in heard],
                    "wer": [round(p[i], 3) for p in per_prompt],
                }
                for i, c in enumerate(cases)
            ],
        }
    return {
        "setup": {
            "prompts": len(cases),
            "rounds": rounds,
            "voice": "piper joe (bundled), WAV 16 kHz, a fresh gateway and temp cache per round",
            "recognizer": "pocketsphinx (en-us model and language model of its wheel)",
            "wer_by": tool,
            "server_default_normalize": default_normalize(),
        },
        "variants": rows,
        "runtime_s": round(time.perf_counter() - started, 1),
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{'variant':<9} {'WER':>7} {'per round':>18} {'mean/prompt':>12} {'exact':>9}  request"
    ]
    for variant, row in report["variants"].items():
        rounds = " ".join(f"{w:.3f}" for w in row["wer_per_round"])
        lines.append(
            f"{variant:<9} {row['wer']:>7.3f} {rounds:>18} {row['mean_prompt_wer']:>12.3f} "
            f"{row['prompts_heard_exactly']:>4}/{row['takes']:<4}  {row['request']}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=40, help="first N prompts of the corpus")
    parser.add_argument(
        "--rounds", type=int, default=1, help="fresh gateways, each synthesizing every take anew"
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--note", default="", help="recorded in the JSON (which trees ran)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = parser.parse_args(argv)
    provenance()
    report = run(args.prompts, args.variants, args.rounds)
    report["setup"]["note"] = args.note
    print(table(report))
    if args.no_write:
        return
    path = write_results("wer", report)
    variants = list(report["variants"])
    png = bar_plot(
        "wer",
        f"Recognition round trip: {report['setup']['prompts']} IVR prompts x "
        f"{report['setup']['rounds']} rounds (piper joe, pocketsphinx)",
        variants,
        [report["variants"][v]["wer"] for v in variants],
        "word error rate (lower is better)",
    )
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
