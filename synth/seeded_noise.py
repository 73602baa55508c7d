"""One sound per address: a local engine's noise drawn from what the item's address covers.

VITS samples its durations and its latent from a normal distribution (the ``noise_w`` /
``noise_scale_dp`` and ``noise_scale`` parameters). Drawn fresh, one content address got other
audio (and another ETag) from every store that made it: two replicas without a shared Redis, a
fresh disk, a synthesis after eviction. Here every item's noise is a function of
:func:`noise_seed`, a hash of exactly what its address covers (engine fingerprint, voice, text,
parameters, IPA or not, take; not the speed: see noise_seed), so the audio depends on nothing else: not the batch it
lands in, the worker, the thread, or what that process ran before.

- ONNX graphs (Piper voices, Coqui's VITS export): :func:`seeded_graph` replaces each
  ``RandomNormalLike`` node by a graph input of values the caller draws with numpy's PCG64
  seeded from the item (:class:`SeededNoise`). ONNX Runtime's own generator cannot be used: a
  node's generator is made once, when the session is built, and advances with every run (its
  ``set_seed`` only seeds generators made after it), so a run's noise depends on the runs
  before it. The rewrite is done at the protobuf wire level, as :mod:`synth.exact_speed` does,
  so a Piper-only install needs no ``onnx`` package.
- Coqui eager (torch), one item at a time: :func:`torch_noise` hands a VITS the streams its
  ONNX export would be fed (eager and ONNX modes share an address, so they share the noise);
  :func:`torch_seeded` seeds torch's global generator for other models (synth/coqui_engine.py).

Why, the alternatives and the limits: docs/synthesis.md, "One sound per address".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synth.engine import ParamValue, SynthesisItem
from synth.errors import EngineError
from synth.onnx_wire import (
    ATTR_FLOAT,
    ATTR_INT,
    ATTR_NAME,
    GRAPH_INPUT,
    GRAPH_NODE,
    GRAPH_OUTPUT,
    INT64,
    MODEL_GRAPH,
    NODE_ATTRIBUTE,
    NODE_INPUT,
    NODE_OP_TYPE,
    NODE_OUTPUT,
    Buffer,
    field_value,
    fields,
    ld,
    node_field,
    read_varint,
    strings,
    tensor_attribute,
    tensor_info,
    with_graph,
)

log = logging.getLogger("voxgate.synth.noise")

PREFIX = "voxgate_noise/"
# A first run learns how many values each node takes per input id; a run given too few is run
# again with as many as it took (its result then is the one a large enough first guess gives).
_MARGIN = 1.25
_MAX_RUNS = 4

# TensorProto.DataType of a RandomNormalLike's ``dtype`` -> the values fed for it.
_DTYPES: dict[int, Any] = {1: np.float32, 10: np.float16, 11: np.float64}
_RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")
_RANDOM_WORDS = (b"Random", b"Multinomial", b"Bernoulli")


def noise_seed(fingerprint: str, item: SynthesisItem, params: Mapping[str, ParamValue]) -> int:
    """The 128-bit seed of ``item``'s noise: blake2b over what its content address covers
    (``params``: the engine's defaults with the item's own over them, as the address has
    them). The take is in it: a retake after the checks refused a take is other audio. The
    speed is not: a rendition at speed s draws speed 1's duration noise, so its phonemes last
    speed 1's durations divided by s and its length is exactly speed 1's over s (the speed
    figures with noise on, docs/bench/speed_noise.json, rest on this)."""
    material = {
        "fingerprint": fingerprint,
        "voice": item.voice,
        "text": item.text,
        "params": dict(params),
        "phonemes": item.phonemes,
        "take": item.take,
    }
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=16).digest(), "big")


# ---- the graph rewrite ---------------------------------------------------------------------


def _node(op: str, inputs: Sequence[str], output: str, attribute: bytes = b"") -> bytes:
    return node_field(op, inputs, [output], PREFIX + output, attribute)


def _int64_constant(name: str, value: int) -> bytes:
    return _node("Constant", [], name, tensor_attribute(INT64, struct.pack("<q", value)))


@dataclass(frozen=True)
class NoiseInput:
    """One random node made an input: ``feed`` takes its values (flat, any length, read
    cyclically), ``used`` is an output saying how many it read; its values are
    ``mean + scale * N(0, 1)`` in ``dtype``."""

    feed: str
    used: str
    mean: float
    scale: float
    dtype: Any


def _attributes(node: Buffer) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, _, raw in fields(node):
        if n != NODE_ATTRIBUTE:
            continue
        attribute = field_value(raw)
        name = ""
        value = 0.0
        for an, wire, araw in fields(attribute):
            if an == ATTR_NAME:
                name = bytes(field_value(araw)).decode()
            elif an == ATTR_FLOAT and wire == 5:
                (value,) = struct.unpack("<f", bytes(field_value(araw)))
            elif an == ATTR_INT and wire == 0:
                value = float(read_varint(araw, 1)[0])
        out[name] = value
    return out


def _replacement(index: int, node: Buffer) -> tuple[bytes, NoiseInput, bytes, bytes]:
    """Nodes making the output of ``RandomNormalLike`` ``node`` from a flat input, that input's
    description, its ``used`` output's, and the :class:`NoiseInput`."""
    (like,) = strings(node, NODE_INPUT)
    (out,) = strings(node, NODE_OUTPUT)
    attributes = _attributes(node)
    elem = int(attributes.get("dtype", 1))
    if elem not in _DTYPES:
        raise ValueError(f"RandomNormalLike of unsupported dtype {elem}")
    p = f"{PREFIX}{index}/"
    feed, used = p + "values", p + "used"
    nodes = b"".join(
        [
            _node("Shape", [like], p + "shape"),
            _node("Size", [like], used),
            _node("Size", [feed], p + "have"),
            _int64_constant(p + "zero", 0),
            _int64_constant(p + "one", 1),
            _node("Range", [p + "zero", used, p + "one"], p + "index"),
            _node("Mod", [p + "index", p + "have"], p + "wrapped"),
            _node("Gather", [feed, p + "wrapped"], p + "flat"),
            _node("Reshape", [p + "flat", p + "shape"], out),
        ]
    )
    noise = NoiseInput(
        feed, used, attributes.get("mean", 0.0), attributes.get("scale", 1.0), _DTYPES[elem]
    )
    # The values: 1-D, of a length named per input; how many were used: a scalar.
    graph_input = ld(GRAPH_INPUT, tensor_info(feed, elem, ld(1, ld(2, (p + "count").encode()))))
    graph_output = ld(GRAPH_OUTPUT, tensor_info(used, INT64, b""))
    return nodes, noise, graph_input, graph_output


def seeded_graph(model: bytes) -> tuple[bytes, tuple[NoiseInput, ...]]:
    """``model`` (a serialized ``ModelProto``) with each ``RandomNormalLike`` of its top graph
    fed from an input (:class:`NoiseInput`, in node order), and those inputs. The model as it
    is, and none, where it has no such node. A graph that draws its noise otherwise (other
    random ops, or inside a subgraph) keeps it, with a warning: its addresses are not one
    sound."""
    view = memoryview(model)
    graph_raw = [raw for n, w, raw in fields(view) if n == MODEL_GRAPH and w == 2]
    if len(graph_raw) != 1:
        raise ValueError("the model has no graph")
    parts: list[Buffer] = []
    inputs: list[bytes] = []
    outputs: list[bytes] = []
    noise: list[NoiseInput] = []
    others: set[str] = set()
    for n, _, raw in fields(field_value(graph_raw[0])):
        op = ""
        if n == GRAPH_NODE:
            node = bytes(raw)
            if any(word in node for word in _RANDOM_WORDS):
                ops = strings(field_value(node), NODE_OP_TYPE)
                op = ops[0] if ops else ""
        if op == "RandomNormalLike":
            nodes, source, graph_input, graph_output = _replacement(len(noise), field_value(raw))
            parts.append(nodes)
            noise.append(source)
            inputs.append(graph_input)
            outputs.append(graph_output)
        else:
            if op in _RANDOM_OPS:
                others.add(op)
            parts.append(raw)
    if others:
        log.warning("graph keeps random ops it draws itself (%s): not seeded", ", ".join(others))
    if not noise:
        return model, ()
    return with_graph(view, [*parts, *inputs, *outputs]), tuple(noise)


# ---- running a rewritten graph -------------------------------------------------------------


@dataclass
class SeededNoise:
    """The noise inputs of a graph made by :func:`seeded_graph`, and how to run it for an item.

    Each input's values are one stream of its own (numpy PCG64 from ``SeedSequence(seed,
    spawn_key=(run, node))``), of which a node reads the first values it needs: their count
    follows the graph's durations, known only once it ran. So a run is given a guess (from the
    values per input id that earlier runs took) and run again, given as many as it read, where
    it read more than it had: a stream's first n values do not depend on how many were drawn,
    so the result is the same whatever the guess (and whatever ran before).
    """

    inputs: tuple[NoiseInput, ...]
    # Values each node read per input id (at the length scale, over the speed): the most seen.
    _per_id: list[float] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._per_id = [0.0] * len(self.inputs)

    def run(
        self,
        session: Any,
        output_names: Sequence[str],
        feeds: Mapping[str, np.ndarray[Any, Any]],
        seed: int,
        run: int = 0,
    ) -> list[Any]:
        """``session.run(output_names, feeds)`` with the noise of ``seed``'s ``run``-th graph
        run (an item may take several: Piper's sentences)."""
        stretch = feed_stretch(feeds)
        counts = [math.ceil(per * stretch * _MARGIN) + 16 for per in self._per_id]
        used_names = [noise.used for noise in self.inputs]
        for _ in range(_MAX_RUNS):
            feed = dict(feeds)
            for node, (noise, count) in enumerate(zip(self.inputs, counts, strict=True)):
                feed[noise.feed] = _values(noise, seed, run, node, count)
            result = session.run([*output_names, *used_names], feed)
            used = [int(np.asarray(n)) for n in result[len(output_names) :]]
            if all(u <= c for u, c in zip(used, counts, strict=True)):
                with self._lock:
                    self._per_id = [
                        max(per, u / stretch) for per, u in zip(self._per_id, used, strict=True)
                    ]
                return list(result[: len(output_names)])
            counts = [max(c, math.ceil(u * _MARGIN)) for c, u in zip(counts, used, strict=True)]
        raise EngineError(f"noise inputs still short after {_MAX_RUNS} runs")

    def outputs(self, session: Any) -> list[str]:
        """The session's outputs but the noise counts (what ``run(None, ...)`` would give)."""
        used = {noise.used for noise in self.inputs}
        return [o.name for o in session.get_outputs() if o.name not in used]


def feed_stretch(feeds: Mapping[str, Any]) -> float:
    """Input ids, times the length scale, over the speed: what the graph's frames follow."""
    ids = feeds.get("input")
    stretch = float(ids.shape[-1]) if ids is not None else 1.0
    scales = feeds.get("scales")
    if scales is not None and scales.size > 1:
        stretch *= max(float(scales.reshape(-1)[1]), 1e-3)
    speed = feeds.get("speed")
    if speed is not None and speed.size:
        stretch /= max(float(speed.reshape(-1)[0]), 1e-3)
    return max(stretch, 1.0)


def normal_values(seed: int, run: int, node: int, count: int) -> np.ndarray[Any, Any]:
    """The first ``count`` values (float32, N(0, 1)) of random node ``node``'s stream in graph
    run ``run`` of an item's ``seed``: numpy's PCG64 from ``SeedSequence(seed, spawn_key=(run,
    node))``, whose first values do not depend on how many are drawn."""
    stream = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(run, node)))
    )
    return stream.standard_normal(count, dtype=np.float32)


def _values(noise: NoiseInput, seed: int, run: int, node: int, count: int) -> np.ndarray[Any, Any]:
    values = normal_values(seed, run, node, max(count, 1))
    if noise.scale != 1.0:
        values *= np.float32(noise.scale)
    if noise.mean != 0.0:
        values += np.float32(noise.mean)
    return values.astype(noise.dtype, copy=False)


# ---- torch ---------------------------------------------------------------------------------


def torch_noise(seed: int) -> contextlib.AbstractContextManager[Any]:
    """Within it, on this thread, ``torch.randn`` and ``torch.randn_like`` give the streams
    of an ONNX graph run of ``seed`` (:func:`normal_values`, run 0), the n-th call node n's: a
    Coqui VITS draws its duration noise, then its latent's, as its export's two
    ``RandomNormalLike`` do, so eager and ONNX modes (one address) hear the same noise. The
    item must run alone: a batch draws one tensor for all its rows."""
    import torch
    from torch.overrides import TorchFunctionMode

    class _Noise(TorchFunctionMode):
        calls = 0

        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: Sequence[Any] = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            kwargs = kwargs or {}
            if func is torch.randn_like:
                like = args[0]
                shape = tuple(like.shape)
                dtype, device = (
                    kwargs.get("dtype") or like.dtype,
                    kwargs.get("device") or like.device,
                )
            elif func is torch.randn:
                sizes = args[0] if len(args) == 1 and not isinstance(args[0], int) else args
                shape = tuple(int(n) for n in sizes)
                dtype, device = kwargs.get("dtype"), kwargs.get("device")
            else:
                return func(*args, **kwargs)
            count = math.prod(shape)
            values = normal_values(seed, 0, self.calls, count)
            self.calls += 1
            return torch.from_numpy(values).reshape(shape).to(device=device, dtype=dtype)

    return _Noise()


# One item at a time per process takes torch's global generator: see torch_seeded.
_TORCH_RNG = threading.Lock()


@contextlib.contextmanager
def torch_seeded(seed: int, device: str) -> Iterator[None]:
    """torch's generators (CPU, and ``device``'s) seeded from ``seed`` for one item's run, and
    put back as they were after it: for the Coqui models that are not VITS, which draw from
    torch's global generator in ways of their own (dropout in Tacotron's prenet, sampling) and
    take no generator. One lock per process holds every other such run back meanwhile. The item
    must run alone."""
    import torch

    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with _TORCH_RNG, torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
        yield
