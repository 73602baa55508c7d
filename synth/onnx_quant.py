"""int8 versions of ONNX voice graphs (``synthesis_precision = "int8"``).

The recipe (static QDQ int8 of every convolution, the rest fp32: about 1.4x the fp32 speed on the
joe voice), the ones tried and left out, and how the graph is derived once, cached and
fingerprinted: docs/synthesis.md, "Precision".
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("voxgate.synth.quant")

PRECISIONS = ("fp32", "int8")

# Changes whenever the recipe below changes what it writes (a new recipe is a new graph: new
# content addresses).
RECIPE = "qdq-conv-s8w-perchannel-u8a-minmax-v1"

# What the activation ranges are calibrated on: sentences of the kinds voxgate serves (IVR
# prompts, a bot's answers, numbers and names), with questions and exclamations, so the ranges
# cover loud and quiet phones. Fixed: a changed set is a changed graph (bump RECIPE).
CALIBRATION_TEXTS = (
    "Thank you for calling. Please hold while we connect your call.",
    "Your account balance is forty two dollars and ten cents.",
    "Press one for sales, two for support, or stay on the line for an operator.",
    "Is there anything else I can help you with today?",
    "Our offices are open Monday through Friday, from nine in the morning to five.",
    "I'm sorry, I didn't catch that!",
    "The quick brown fox jumps over the lazy dog.",
    "Your appointment with Doctor Smith is confirmed for June third at ten thirty.",
)

QUANTIZED_OPS = ("Conv", "ConvTranspose")


def onnxruntime_minor() -> str:
    """``major.minor`` of the installed onnxruntime, read from its metadata (no import)."""
    try:
        version = importlib.metadata.version("onnxruntime")
    except importlib.metadata.PackageNotFoundError:  # a GPU build is named differently
        version = importlib.metadata.version("onnxruntime-gpu")
    return ".".join(version.split(".")[:2])


def int8_fingerprint(source_fingerprint: str) -> str:
    """The fingerprint of the int8 graph derived from a source of ``source_fingerprint``.

    It differs from the source's: int8 audio is not fp32 audio, so it gets its own content
    addresses, and a different recipe or quantizer gets others again.
    """
    h = hashlib.blake2b(digest_size=32)
    h.update(f"{source_fingerprint}\0{RECIPE}\0onnxruntime {onnxruntime_minor()}".encode())
    return h.hexdigest()


def made_once(path: Path, make: Callable[[Path], None]) -> Path:
    """``path``, made by ``make`` into a temporary file (then renamed) unless it is there: the
    workers that start together make it once between them (an exclusive lock on the file
    ``<path's first name>.lock`` beside it)."""
    import fcntl

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_name(f"{path.name.split('.')[0]}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not path.is_file():  # another worker made it while this one waited
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            try:
                make(tmp)
                tmp.replace(path)
            finally:
                tmp.unlink(missing_ok=True)
    return path


class _Feeds:
    """``onnxruntime.quantization.CalibrationDataReader`` over a list of input feeds."""

    def __init__(self, feeds: Iterable[Mapping[str, np.ndarray[Any, Any]]]) -> None:
        self._it = iter(list(feeds))

    def get_next(self) -> dict[str, np.ndarray[Any, Any]] | None:
        feed = next(self._it, None)
        return dict(feed) if feed is not None else None

    def rewind(self) -> None:  # part of the reader's interface; calibration reads once
        pass


def quantize_file(
    source: Path, target: Path, feeds: Iterable[Mapping[str, np.ndarray[Any, Any]]]
) -> int:
    """Write the int8 QDQ graph of ``source`` to ``target``; returns the convolutions quantized."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    model = onnx.load(str(source), load_external_data=False)
    nodes = [n.name for n in model.graph.node if n.op_type in QUANTIZED_OPS]
    del model
    # onnxruntime's quantizer writes "<input>-inferred.onnx" beside its input and deletes it:
    # beside a private copy, never in the installed voice package (read-only where installed
    # system-wide, and shared by processes that may quantize it at the same time).
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".quantize-") as tmp:
        private = Path(tmp) / "source.onnx"
        shutil.copyfile(source, private)
        quantize_static(
            str(private),
            str(target),
            _Feeds(feeds),  # duck-typed CalibrationDataReader
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            op_types_to_quantize=list(QUANTIZED_OPS),
            nodes_to_quantize=nodes,
        )
    return len(nodes)


def derived_int8(
    source: Path,
    source_fingerprint: str,
    directory: Path,
    feeds: Callable[[], Iterable[Mapping[str, np.ndarray[Any, Any]]]],
) -> Path:
    """The cached int8 graph of ``source``, derived (calibrated on ``feeds()``) if not yet there.

    ``feeds`` is called only when the graph is derived here: a cached graph costs one stat.
    """
    path = directory / f"{int8_fingerprint(source_fingerprint)}.int8.onnx"

    def derive(tmp: Path) -> None:
        started = time.perf_counter()
        log.info("deriving the int8 graph of %s (once per model): %s", source.name, path)
        count = quantize_file(source, tmp, feeds())
        log.info("int8: %d convolutions quantized in %.1fs", count, time.perf_counter() - started)

    return made_once(path, derive)
