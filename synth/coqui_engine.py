"""Coqui TTS models (coqui-tts) as an :class:`~synth.engine.Engine`.

A model is a zoo name or a local checkpoint + ``config.json``, loaded through Coqui's
``Synthesizer``, the code path ``tts --model_path`` takes, so a model that works with Coqui works
here. Models, voices, execution modes (``mode``) and ``precision``: docs/synthesis.md, "Coqui",
"Execution modes" and "Precision". In ``onnx`` mode the export's 1-D convolutions are recast as
2-D (:mod:`synth.onnx_layout`: same output, faster CPU kernels). Every item runs alone, its noise
drawn from its content address (:mod:`synth.seeded_noise`; docs/synthesis.md, "One sound per
address").
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
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
from synth.exact_speed import (
    RESCALED_DURATIONS,
    SPEED_RULE,
    rescaled_durations,
    rescaled_graph,
    vits_feeds,
)
from synth.onnx_layout import rewrite_file
from synth.onnx_memory import ShrinkingSession
from synth.onnx_quant import (
    CALIBRATION_TEXTS,
    PRECISIONS,
    derived_int8,
    int8_fingerprint,
    made_once,
)
from synth.seeded_noise import SeededNoise, noise_seed, seeded_graph, torch_noise, torch_seeded

log = logging.getLogger("voxgate.synth.coqui")

MODES = ("torch", "onnx", "int8", "fp16", "bf16")
DEFAULT_VOICE = "default"
# Words whose tokens an engine remembers for the speech marks (a phonemizing model runs espeak
# once per word otherwise; prompts repeat their words).
WORD_TOKENS_MEMO = 4096

# What this engine imports beyond a base install (the `coqui` extra in pyproject.toml): coqui-tts,
# torch and the packages they import, and onnx for the ``onnx`` mode's export.
REQUIRED_MODULES = ("TTS", "torch", "torchaudio", "torchcodec", "six", "onnx")


def missing_modules() -> list[str]:
    """The modules of :data:`REQUIRED_MODULES` that cannot be imported here, without importing any.

    ``find_spec`` only locates a top-level module: a process that serves no Coqui model (and the
    gateway process, which never loads the weights) never pays torch's import.
    """
    return [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]


def resolve_model_files(model: str, config: str | Path | None = None) -> tuple[Path, Path]:
    """``(checkpoint, config)`` for a local checkpoint path or a Coqui zoo name.

    A path that exists is a local checkpoint; its config is ``config`` or ``config.json`` beside it.
    Anything else is a zoo name handed to Coqui's ``ModelManager`` (downloads once, then cached).
    """
    path = Path(model).expanduser()
    if path.exists():
        cfg = Path(config).expanduser() if config else path.parent / "config.json"
        if not cfg.is_file():
            raise FileNotFoundError(f"coqui config not found: {cfg} (set coqui_config)")
        return path, cfg
    if "/" not in model:
        raise FileNotFoundError(f"coqui model {model!r} is neither a file nor a zoo name")
    from TTS.utils.manage import ModelManager

    model_path, config_path, _ = ModelManager(progress_bar=False).download_model(model)
    if config_path is None:
        raise EngineError(f"coqui zoo model {model!r} has no config file")
    return Path(model_path), Path(config_path)


class CoquiEngine:
    """One Coqui TTS model in one process (a worker loads its own copy).

    The constructor reads only the config (no torch import), so the gateway process can list voices
    and compute content keys while the workers load the weights.
    """

    name = "coqui"

    def __init__(
        self,
        model_path: str | Path,
        config_path: str | Path | None = None,
        *,
        mode: str = "torch",
        device: str = "cpu",
        intra_op_threads: int = 1,
        onnx_dir: str | Path | None = None,
        precision: str = "fp32",
        speech_marks: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"coqui mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "fp16" and not device.startswith("cuda"):
            raise ValueError("coqui mode fp16 needs a CUDA device (autocast fp16 is GPU-only)")
        if mode == "int8" and device != "cpu":
            raise ValueError(
                "coqui mode int8 runs on cpu only (dynamic quantization has no CUDA kernels)"
            )
        self.model_path, self.config_path = resolve_model_files(str(model_path), config_path)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.mode = mode
        # Only ONNX Runtime graphs have an int8 precision (torch's own int8 is mode "int8").
        self.precision = precision if mode == "onnx" else "fp32"
        self.device = device
        self.speech_marks = speech_marks
        self.intra_op_threads = intra_op_threads
        self.onnx_dir = Path(onnx_dir) if onnx_dir else self.model_path.parent / "onnx"
        with self.config_path.open(encoding="utf-8") as f:
            self._config: dict[str, Any] = json.load(f)
        audio_cfg = self._config.get("audio", {})
        self.sample_rate = int(audio_cfg.get("output_sample_rate") or audio_cfg["sample_rate"])
        self.source_fingerprint = fingerprint_files([self.model_path, self.config_path])
        self.fingerprint = (
            int8_fingerprint(f"{self.source_fingerprint}.conv2d.{SPEED_RULE}")
            if self.precision == "int8"
            else self.source_fingerprint
        )
        self.model_type = str(self._config.get("model", "")).lower()
        self._voices = self._voices_from_config()
        self._synth: Any = None
        self._onnx: Any = None
        self._noise = SeededNoise(())
        self._quantized_layers = 0
        # The ONNX graph's output holding each id's frames (its durations' Ceil), when found.
        self._onnx_durations: str | None = None
        self._tokens_of = functools.lru_cache(WORD_TOKENS_MEMO)(self._tokens_alone)
        # The model's noise/length scales are attributes set per batch: one batch at a time.
        self._lock = threading.Lock()

    def _read_names(self, path_value: object) -> list[str]:
        if not path_value:
            return []
        path = self.config_path.parent / str(path_value)  # (an absolute path stays itself)
        if not path.is_file():
            path = self.config_path.parent / path.name  # zoo configs carry training-machine paths
        if not path.is_file():
            return []
        if path.suffix == ".json":
            with path.open(encoding="utf-8") as f:
                return sorted(json.load(f))
        import torch

        return sorted(torch.load(path, map_location="cpu", weights_only=False))

    def _voices_from_config(self) -> dict[str, tuple[str | None, str | None]]:
        args = self._config.get("model_args", {}) or {}
        speakers, languages = (
            self._read_names(self._config.get(file) or args.get(file))
            or list(self._config.get(names, []) or [])
            for file, names in (("speakers_file", "speakers"), ("language_ids_file", "languages"))
        )
        multilingual = bool(args.get("use_language_embedding")) and len(languages) > 1
        out: dict[str, tuple[str | None, str | None]] = {}
        for spk in speakers if speakers else [None]:
            if multilingual:
                for lang in languages:
                    out[f"{spk or DEFAULT_VOICE}@{lang}"] = (spk, lang)
            else:
                out[spk or DEFAULT_VOICE] = (spk, languages[0] if languages else None)
        return out

    def voices(self) -> Sequence[VoiceInfo]:
        lang = str(self._config.get("phoneme_language") or "")
        return [
            VoiceInfo(name, language or lang, f"Coqui {self.model_type}")
            for name, (_, language) in self._voices.items()
        ]

    def default_params(self, voice: str) -> Mapping[str, ParamValue]:
        if self.model_type != "vits":
            return {}
        args = self._config.get("model_args", {}) or {}
        return {
            "noise_scale": float(args.get("inference_noise_scale", 0.667)),
            "noise_scale_dp": float(args.get("inference_noise_scale_dp", 1.0)),
            "length_scale": float(args.get("length_scale", 1.0)),
        }

    @property
    def max_exact_batch(self) -> int:
        """1: items run one at a time. A padded batch draws one noise tensor for all its rows,
        and its HiFi-GAN decoder sees its neighbours' padding at a shorter item's end: an
        item's audio would depend on its batch (docs/synthesis.md, "One sound per address")."""
        return 1

    @property
    def capabilities(self) -> EngineCapabilities:
        """Plain text, one item at a time; speech marks from a VITS model's duration predictor
        (docs/speech-marks.md)."""
        return EngineCapabilities(
            max_exact_batch=self.max_exact_batch,
            speech_marks=self.speech_marks and self.model_type == "vits",
        )

    def describe(self) -> Mapping[str, object]:
        out: dict[str, object] = {
            "engine": "coqui",
            "model_type": self.model_type,
            "mode": self.mode,
            "precision": self.precision,
            "runtime": "onnxruntime" if self.mode == "onnx" else "torch",
            "device": self.device,
            "intra_op_threads": self.intra_op_threads,
            "batching": "none (items run one at a time, each with its own noise)",
            "sample_rate": self.sample_rate,
            "fingerprint": self.fingerprint,
        }
        if self.mode == "int8" and self._synth is not None:
            out["quantized_layers"] = self._quantized_layers
        return out

    def load(self) -> None:
        if self._synth is not None:
            return  # load() is idempotent
        import torch
        from TTS.utils.synthesizer import Synthesizer

        torch.set_num_threads(max(1, self.intra_op_threads))
        # Coqui's tokenizer logs the whole text it was given (a warning) when a character is
        # not in the model's vocabulary: request text never goes to a log.
        logging.getLogger("TTS.tts.utils.text.tokenizer").setLevel(logging.ERROR)
        started = time.perf_counter()
        use_cuda = self.device.startswith("cuda")
        if use_cuda:
            torch.cuda.set_device(torch.device(self.device))
        self._synth = Synthesizer(
            tts_checkpoint=str(self.model_path),
            tts_config_path=str(self.config_path),
            use_cuda=use_cuda,
        )
        model = self._synth.tts_model
        model.eval()
        if self.mode == "onnx":
            if self.model_type != "vits":
                raise EngineError(f"coqui mode onnx needs a VITS model, got {self.model_type!r}")
            # The arena shrinks after each run: memory comes back after a long input.
            self._onnx = ShrinkingSession(self._onnx_session(model))
        elif self.mode == "int8":
            self._quantize(model)
        log.info(
            "coqui model loaded: %s mode=%s device=%s in %.1fs",
            self.model_path.name,
            self.mode,
            self.device,
            time.perf_counter() - started,
        )

    def _quantize(self, model: Any) -> None:
        import torch

        targets = (torch.nn.Linear, torch.nn.LSTM)
        self._quantized_layers = sum(isinstance(m, targets) for m in model.modules())
        if not self._quantized_layers:
            log.info(
                "coqui int8: the model has no Linear/LSTM layers, so dynamic quantization is a "
                "no-op; running eager fp32"
            )
            return
        # quantize_dynamic swaps modules in place on a CPU model (it has no CUDA kernels).
        torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            model, {torch.nn.Linear, torch.nn.LSTM}, dtype=torch.qint8, inplace=True
        )
        log.info("coqui int8: quantized %d Linear/LSTM layers", self._quantized_layers)

    def _onnx_session(self, model: Any) -> Any:
        import onnxruntime

        # ".conv2d": the export after synth.onnx_layout's rewrite; then the speed input of
        # synth.exact_speed, named by its rule (files from before either differ).
        path = self.onnx_dir / f"{self.source_fingerprint}.conv2d.{SPEED_RULE}.onnx"

        def export_to(tmp: Path) -> None:
            log.info("exporting coqui model to ONNX (once per fingerprint): %s", path)
            model.export_onnx(output_path=str(tmp), verbose=False)
            changed = rewrite_file(str(tmp), str(tmp))
            log.info("coqui onnx: %d 1-D convolutions recast as 2-D", changed)
            tmp.write_bytes(rescaled_graph(tmp.read_bytes(), blank_id=self._blank_id()))

        made_once(path, export_to)
        if self.precision == "int8":
            export = path
            path = derived_int8(
                export,
                f"{self.source_fingerprint}.conv2d.{SPEED_RULE}",
                self.onnx_dir,
                lambda: self._calibration_feeds(export),
            )
        graph, self._onnx_durations = (
            _with_durations(path) if self.speech_marks else (path.read_bytes(), None)
        )
        # The noise comes in as inputs drawn from each item's address (synth/seeded_noise.py).
        graph, noise = seeded_graph(graph)
        self._noise = SeededNoise(noise)
        opts = onnxruntime.SessionOptions()
        opts.use_deterministic_compute = True  # (CUDA's kernels; the CPU's already are)
        # Coqui's load_onnx() leaves ONNX Runtime's threads at "all cores"; workers x threads must
        # fit the cores, so the session is built here with the same providers and our thread count.
        opts.intra_op_num_threads = max(1, self.intra_op_threads)
        opts.inter_op_num_threads = 1
        providers: list[Any] = ["CPUExecutionProvider"]
        if self.device.startswith("cuda"):
            index = int(self.device.partition(":")[2] or 0)
            providers = [("CUDAExecutionProvider", {"device_id": index})]
        return onnxruntime.InferenceSession(graph, sess_options=opts, providers=providers)

    def _calibration_feeds(self, export: Path) -> list[dict[str, np.ndarray[Any, Any]]]:
        import onnx

        names = {i.name for i in onnx.load(str(export), load_external_data=False).graph.input}
        voice = next(iter(self._voices))
        noise_off = {"noise_scale": 0.0, "noise_scale_dp": 0.0}
        return [
            self._onnx_feeds(SynthesisItem(text, voice, params=noise_off), names)
            for text in CALIBRATION_TEXTS
        ]

    def warm_up(self) -> None:
        voice = next(iter(self._voices))
        self.synthesize_batch([SynthesisItem("Warming up the model.", voice)])

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        if self._synth is None:
            raise EngineError("coqui engine used before load()")
        if any(item.phonemes for item in items):
            # The gateway refuses SSML <phoneme> for engines without takes_phonemes; this is
            # the engine's own guard.
            raise EngineError("the coqui engine takes text, not phonemes")
        if not items:
            return []
        for item in items:
            if item.voice not in self._voices:
                raise EngineError(f"unknown coqui voice {item.voice!r}")
        with self._lock:
            return [self._synthesize_alone(item) for item in items]

    def _synthesize_alone(self, item: SynthesisItem) -> Audio:
        """``item`` in a run of its own, its noise drawn from what its address covers."""
        seed = noise_seed(
            self.fingerprint, item, {**self.default_params(item.voice), **item.params}
        )
        if self.model_type != "vits":
            with torch_seeded(seed, self.device):
                return self._synthesize_generic(item)
        if self.mode == "onnx":
            return self._synthesize_onnx(item, seed)
        with torch_noise(seed):
            return self._synthesize_vits(item)

    def _scales(self, item: SynthesisItem) -> tuple[float, float, float]:
        """Noise, length and duration-noise scales; the length scale is speed 1's (the speed
        divides the durations afterwards: synth/exact_speed.py)."""
        params: dict[str, Any] = {**self.default_params(item.voice), **item.params}
        return (
            float(params["noise_scale"]),
            float(params["length_scale"]),
            float(params["noise_scale_dp"]),
        )

    def _ids(self, item: SynthesisItem) -> tuple[list[int], int | None, int | None]:
        model = self._synth.tts_model
        ids = list(model.tokenizer.text_to_ids(item.text))
        if not ids:
            raise UnspeakableInput("the text has no characters this model can speak")
        speaker, language = self._voices[item.voice]
        sid = model.speaker_manager.name_to_id[speaker] if speaker is not None else None
        lid = (
            model.language_manager.name_to_id[language]
            if language is not None
            and model.language_manager is not None
            and model.language_manager.num_languages > 1
            else None
        )
        return ids, sid, lid

    def _blank_id(self) -> int | None:
        """The id the tokenizer puts between symbols (``add_blank``), if it puts one."""
        tokenizer = self._synth.tts_model.tokenizer
        blank = tokenizer.characters.blank_id if tokenizer.add_blank else None
        return None if blank is None else int(blank)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self.mode in ("fp16", "bf16"):
            dtype = torch.float16 if self.mode == "fp16" else torch.bfloat16
            return torch.autocast(self.device.partition(":")[0], dtype=dtype)
        return contextlib.nullcontext()

    def _synthesize_vits(self, item: SynthesisItem) -> Audio:
        """One forward pass for ``item`` alone (the engine runs items one at a time: a batch's
        noise would be one draw for all its rows, and the unmasked HiFi-GAN decoder would hear
        a longer neighbour's padding at a shorter item's end), cut at its predicted length
        (``y_mask``)."""
        import torch

        model = self._synth.tts_model
        noise, length, noise_dp = self._scales(item)
        ids, sid, lid = self._ids(item)
        device = next(model.parameters()).device
        x = torch.tensor([ids], dtype=torch.long)
        aux: dict[str, Any] = {
            "x_lengths": torch.tensor([len(ids)], dtype=torch.long).to(device),
            "d_vectors": None,
            "speaker_ids": torch.tensor([sid], device=device) if sid is not None else None,
            "language_ids": torch.tensor([lid], device=device) if lid is not None else None,
            "durations": None,
        }
        model.inference_noise_scale = noise
        blank_id = self._blank_id()
        blanks = None if blank_id is None else (x == blank_id).unsqueeze(1).to(device)
        model.length_scale = _LengthAtSpeed(length, item.speed, blanks)
        model.inference_noise_scale_dp = noise_dp
        with torch.inference_mode(), self._autocast():
            out = model.inference(x.to(device), aux_input=aux)
        wav = out["model_outputs"].float().cpu().numpy()[0, 0, :]
        frames = int(out["y_mask"].sum().long())
        hop = wav.shape[0] // out["y_mask"].shape[-1]
        # Each id's whole frames, as the alignment that made the audio used them.
        id_frames = out["durations"].float().cpu().numpy()[0, 0, : len(ids)]
        pcm = np.ascontiguousarray(wav[: frames * hop], dtype=np.float32)
        return Audio(pcm, self.sample_rate, self._words(item, ids, id_frames * hop, len(pcm)))

    def _synthesize_onnx(self, item: SynthesisItem, seed: int) -> Audio:
        names = {i.name for i in self._onnx.get_inputs()}
        feeds = self._onnx_feeds(item, names)
        outputs = ["output"] if self._onnx_durations is None else ["output", self._onnx_durations]
        result = self._noise.run(self._onnx, outputs, feeds, seed)
        pcm = np.ascontiguousarray(result[0].reshape(-1), dtype=np.float32)
        words = None
        if len(result) > 1:
            id_frames = np.asarray(result[1], dtype=np.float64).reshape(-1)
            total = round(float(id_frames.sum()))
            # The decoder's samples per frame (the graph returns no hop of its own).
            if total > 0 and len(pcm) % total == 0:
                ids = [int(i) for i in feeds["input"][0]]
                words = self._words(item, ids, id_frames * (len(pcm) // total), len(pcm))
        return Audio(pcm, self.sample_rate, words)

    def _words(
        self,
        item: SynthesisItem,
        ids: Sequence[int],
        id_samples: np.ndarray[Any, Any],
        samples: int,
    ) -> tuple[WordTiming, ...] | None:
        """Where each word of ``item``'s text is heard, from each input id's samples."""
        if not self.speech_marks:
            return None
        counts = np.rint(id_samples).astype(np.int64)
        if int(counts.sum()) != samples:
            return None  # not this audio's frames: no timings rather than wrong ones
        stream = token_stream(self._symbols(ids), [int(n) for n in counts])
        return align_words(item.text, stream, self._tokens_of)

    def _symbols(self, ids: Sequence[int]) -> list[str | None]:
        """Each id's symbol: None for the interspersed blank, "" for BOS/EOS/pad."""
        characters = self._synth.tts_model.tokenizer.characters
        blank = characters.blank_id if characters.blank else None
        silent = {getattr(characters, n, None) for n in ("bos_id", "eos_id", "pad_id")}
        return [
            None if i == blank else "" if i in silent else str(characters.id_to_char(i))
            for i in ids
        ]

    def _tokens_alone(self, word: str) -> list[str]:
        """The model's symbols for ``word`` said alone (its cleaner and phonemizer run)."""
        return [s for s in self._symbols(self._synth.tts_model.tokenizer.text_to_ids(word)) if s]

    def _onnx_feeds(self, item: SynthesisItem, names: set[str]) -> dict[str, np.ndarray[Any, Any]]:
        ids, sid, lid = self._ids(item)
        feeds = vits_feeds(ids, self._scales(item), item.speed)
        if "sid" in names:
            feeds["sid"] = np.asarray([sid or 0], dtype=np.int64)
        if "langid" in names:
            feeds["langid"] = np.asarray([lid or 0], dtype=np.int64)
        return feeds

    def _synthesize_generic(self, item: SynthesisItem) -> Audio:
        import torch

        speaker, language = self._voices[item.voice]
        with torch.inference_mode(), self._autocast():
            wav = self._synth.tts(
                item.text, speaker_name=speaker, language_name=language, split_sentences=False
            )
        pcm = np.asarray(wav, dtype=np.float32)
        if not len(pcm):
            raise UnspeakableInput(
                "the model produced no audio for this input: it has nothing to speak"
            )
        return Audio(pcm, self.sample_rate)


class _LengthAtSpeed:
    """Coqui's ``Vits.inference`` computes ``w = exp(logw) * x_mask * self.length_scale`` and then
    ``ceil(w)``. Set as ``length_scale``, this makes ``w`` the whole frames of speed 1 (at the
    model's own length scale) divided by the speed as :mod:`synth.exact_speed` does in a graph;
    the ceiling then leaves them as they are. (Dividing the length scale by the speed instead
    keeps the ceiling's round-up of every id: speech gentler than asked.)"""

    def __init__(self, length_scale: float, speed: float, blanks: Any = None) -> None:
        self.length_scale = length_scale
        self.speed = speed
        self.blanks = blanks  # where the batch's ids are the tokenizer's blank ([B, 1, T])

    def __rmul__(self, w: Any) -> Any:
        import torch

        frames = torch.ceil(w.float() * self.length_scale)
        return rescaled_durations(frames, self.speed, self.blanks).to(w.dtype)


def _with_durations(path: Path) -> tuple[bytes, str | None]:
    """The graph at ``path`` with each input id's frames (the output of its durations' ``Ceil``,
    which reads :mod:`synth.exact_speed`'s rescaled frames) as a second output, and that
    output's name; the graph as it is and None where it has no single such node. The frames
    cost nothing at run time: the graph computes them to make the audio."""
    import onnx

    model = onnx.load(str(path))
    ceils = [
        n for n in model.graph.node if n.op_type == "Ceil" and list(n.input) == [RESCALED_DURATIONS]
    ]
    if len(ceils) != 1 or len(ceils[0].output) != 1:
        log.warning("coqui onnx graph %s gives no durations: no single Ceil", path.name)
        return path.read_bytes(), None
    name = str(ceils[0].output[0])
    if all(output.name != name for output in model.graph.output):
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return model.SerializeToString(), name
