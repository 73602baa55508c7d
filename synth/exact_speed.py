"""Speech at exactly the speed asked, for VITS graphs (Piper voices, Coqui's VITS).

Why dividing the length scale by the speed falls short (VITS rounds each id's duration up to a
whole frame), the rule that replaces it and what it measured: docs/synthesis.md, "Speed". Each
id's speed-1 frames are divided by the speed and the running total rounded, so the total is speed
1's over the speed within half a frame; a phoneme whose share is under a frame (any id but the
blanks between phonemes, from about speed 1.5) takes the rest of its frame from the blanks beside
it, so every phoneme is heard (:func:`rescaled_durations`).

:func:`rescaled_graph` rewrites a serialized ONNX model at the protobuf wire level (a VITS graph's
one ``Ceil`` whose output feeds a ``CumSum``), adding an input ``speed`` (float ``[1]``; every run
feeds it: a default given as an initializer would keep ONNX Runtime from folding constants, and
it warns): the ``onnx`` package is not needed, so a slim install (Piper only) has it.
:func:`rescaled_durations` is the same rule on a torch tensor (Coqui eager).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

Buffer = bytes | memoryview

SPEED_INPUT = "speed"
_PREFIX = "voxgate_speed/"
# What the graph's own ``Ceil`` reads once rewritten: each id's whole frames at the asked speed.
RESCALED_DURATIONS = _PREFIX + "durations"
# The rule's name, in what it makes: audio away from speed 1 (its content addresses) and Coqui's
# cached graphs. Audio made by a rule before it ("exact": a phoneme could get no frame) differs.
SPEED_RULE = "exact-phonemes"

# Protobuf field numbers of the ONNX messages used (onnx/onnx.proto).
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 11, 12
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE, _NODE_ATTRIBUTE = 1, 2, 3, 4, 5
_FLOAT, _INT64, _DOUBLE = 1, 7, 11  # TensorProto.DataType
_ATTRIBUTE_INT, _ATTRIBUTE_TENSOR = 2, 4  # AttributeProto.AttributeType
# Below any share of a frame that matters: keeps a division by no room at all finite.
_EPS = 1e-6
# The graph's input of phoneme ids (Piper's and Coqui's VITS exports name it so).
IDS_INPUT = "input"


class NotAVitsGraph(ValueError):
    """The model's graph has not exactly one ``Ceil`` (the VITS durations' rounding)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: Buffer, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: Buffer) -> Iterator[tuple[int, int, Buffer]]:
    """``(field number, wire type, raw bytes of the whole field, tag included)`` in order: slices
    of ``data`` (views, where ``data`` is a memoryview: a graph's weights are not copied)."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated protobuf message")
        yield number, wire, data[start:pos]


def _payload(raw: Buffer) -> Buffer:
    """The value of a length-delimited field (``raw`` includes its tag)."""
    _, pos = _read_varint(raw, 0)
    _, pos = _read_varint(raw, pos)
    return raw[pos:]


def _ld(number: int, payload: Buffer) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + bytes(payload)


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _strings(node: Buffer, number: int) -> list[str]:
    return [bytes(_payload(raw)).decode() for n, w, raw in _fields(node) if n == number and w == 2]


def _node(op: str, inputs: list[str], outputs: list[str], attribute: bytes = b"") -> bytes:
    body = b"".join(_ld(_NODE_INPUT, i.encode()) for i in inputs)
    body += b"".join(_ld(_NODE_OUTPUT, o.encode()) for o in outputs)
    body += _ld(_NODE_NAME, (_PREFIX + outputs[0]).encode()) + _ld(_NODE_OP_TYPE, op.encode())
    return _ld(_GRAPH_NODE, body + (_ld(_NODE_ATTRIBUTE, attribute) if attribute else b""))


def _speed_input() -> bytes:
    """ValueInfoProto ``speed``: float tensor of shape [1]."""
    dim = _ld(1, _int(1, 1))  # TensorShapeProto.dim { dim_value: 1 }
    tensor = _int(1, _FLOAT) + _ld(2, dim)  # TypeProto.Tensor { elem_type, shape }
    return _ld(_GRAPH_INPUT, _ld(1, SPEED_INPUT.encode()) + _ld(2, _ld(1, tensor)))


class _Builder:
    """Nodes of the rule, appended in topological order; each output named by the builder."""

    def __init__(self) -> None:
        self.nodes: list[bytes] = []
        self._count = 0

    def add(self, op: str, *inputs: str, attribute: bytes = b"", out: str | None = None) -> str:
        if out is None:
            self._count += 1
            out = f"{_PREFIX}{op.lower()}{self._count}"
        self.nodes.append(_node(op, list(inputs), [out], attribute))
        return out

    def constant(self, data_type: int, raw: bytes, dims: Sequence[int] = ()) -> str:
        tensor = b"".join(_int(1, d) for d in dims) + _int(2, data_type) + _ld(9, raw)
        attribute = _ld(1, b"value") + _ld(5, tensor) + _int(20, _ATTRIBUTE_TENSOR)
        return self.add("Constant", attribute=attribute)


def _attribute_int(name: str, value: int) -> bytes:
    """AttributeProto ``name`` of type INT (negative values as protobuf's 64-bit two's complement)."""
    return _ld(1, name.encode()) + _int(3, value & (1 << 64) - 1) + _int(20, _ATTRIBUTE_INT)


def _rescale_nodes(w: str, ids: str, blank_id: int | None, out: str) -> bytes:
    """Nodes computing ``out`` (whole frames at the asked speed) from ``w`` (frames at speed 1,
    before rounding up; ``[batch, 1, ids]``) and the input ``ids`` (``[batch, ids]``):
    :func:`rescaled_durations`, op for op."""
    g = _Builder()
    i64 = functools.partial(g.constant, _INT64, dims=[1])
    axis = g.constant(_INT64, struct.pack("<q", -1))
    # Slice's starts, ends and axes: the last axis, its first id, the second, and the end.
    last, zero, one, end = (i64(struct.pack("<q", v)) for v in (-1, 0, 1, 2**63 - 1))
    f32 = functools.partial(g.constant, _FLOAT)
    half = g.constant(_DOUBLE, struct.pack("<d", 0.5))
    concat = _attribute_int("axis", -1)

    def zeros(x: str) -> str:
        first = g.add("Slice", x, zero, one, last)
        return g.add("Sub", first, first)

    def later(x: str) -> str:  # each id's neighbour after it (0 after the last)
        return g.add("Concat", g.add("Slice", x, one, end, last), zeros(x), attribute=concat)

    def earlier(x: str) -> str:  # each id's neighbour before it (0 before the first)
        return g.add("Concat", zeros(x), g.add("Slice", x, zero, last, last), attribute=concat)

    def total(x: str) -> str:
        return g.add("Slice", g.add("CumSum", x, axis), last, end, last)

    frames = g.add("Ceil", w)
    u = g.add("Div", frames, SPEED_INPUT)
    heard = g.add(
        "Cast",
        g.add("Greater", frames, f32(struct.pack("<f", 0.0))),
        attribute=_attribute_int("to", _FLOAT),
    )
    if blank_id is None:
        least = heard
        v = g.add("Max", u, least)
    else:
        is_blank = g.add("Equal", ids, g.constant(_INT64, struct.pack("<q", blank_id)))
        blank = g.add(
            "Reshape",
            g.add("Cast", is_blank, attribute=_attribute_int("to", _FLOAT)),
            g.add("Shape", frames),
        )
        least = g.add("Sub", heard, g.add("Mul", heard, blank))
        avail = g.add("Mul", u, blank)
        deficit = g.add("Relu", g.add("Sub", least, u))
        take1 = g.add("Min", deficit, later(avail))
        given1 = earlier(take1)
        left = earlier(g.add("Sub", avail, given1))
        take2 = g.add("Relu", g.add("Min", g.add("Sub", deficit, take1), left))
        given2 = later(take2)
        moved = g.add(
            "Sub", g.add("Add", u, g.add("Add", take1, take2)), g.add("Add", given1, given2)
        )
        v = g.add("Max", moved, least)
    eps, whole = f32(struct.pack("<f", _EPS)), f32(struct.pack("<f", 1.0))
    excess = g.add("Relu", g.add("Sub", total(v), total(u)))
    slack = g.add("Relu", g.add("Sub", v, least))
    room = total(slack)
    share = g.add("Min", g.add("Div", excess, g.add("Max", room, eps)), whole)
    squeezed = g.add("Sub", v, g.add("Mul", slack, share))
    overflow = g.add("Relu", g.add("Sub", excess, room))
    kept = g.add("Sub", whole, g.add("Div", overflow, g.add("Max", total(squeezed), eps)))
    scaled = g.add("Cast", g.add("Mul", squeezed, kept), attribute=_attribute_int("to", _DOUBLE))
    ends = g.add("Floor", g.add("Add", g.add("CumSum", scaled, axis), half))
    steps = g.add("Cast", g.add("Sub", ends, earlier(ends)), attribute=_attribute_int("to", _FLOAT))
    g.add("Max", steps, g.add("Floor", g.add("Mul", least, kept)), out=out)
    return b"".join(g.nodes)


def rescaled_graph(
    model: bytes, durations_output: bool = False, blank_id: int | None = None
) -> bytes:
    """``model`` (a serialized VITS ``ModelProto``) with durations divided by a ``speed`` input,
    by :func:`rescaled_durations`' rule, ``blank_id`` the id of the blank the voice puts between
    phonemes (None: it has none).

    With ``durations_output``, the ``Ceil``'s output (each input id's whole frames at the asked
    speed) is also a graph output, after the audio, unless it is one already: what Piper's
    ``patch_voice_with_alignment.add_alignment_output`` adds (a ``ValueInfoProto`` with only its
    name), done here on the wire, so neither the ``onnx`` package nor a second parse is needed.

    The graph's ``Ceil`` then reads the rescaled frames (already whole, so it leaves them); the
    new nodes go just before it, keeping the node list in topological order. Raises
    :class:`NotAVitsGraph` where the top graph has not exactly one ``Ceil`` (Piper's and Coqui's
    VITS exports have one, the durations') or, with a ``blank_id``, no ``input`` of ids, and
    ``ValueError`` where it already has a ``speed`` input.
    """
    view = memoryview(model)
    graph_raw = [raw for n, w, raw in _fields(view) if n == _MODEL_GRAPH and w == 2]
    if len(graph_raw) != 1:
        raise NotAVitsGraph("the model has no graph")
    graph = _payload(graph_raw[0])
    fields = list(_fields(graph))
    # Only a node whose bytes hold the op type field ``Ceil`` is parsed (the rest are thousands).
    ceil_field = _ld(_NODE_OP_TYPE, b"Ceil")
    ceils = []
    inputs = set()
    for i, (n, _wire, raw) in enumerate(fields):
        if n == _GRAPH_NODE:
            node = _payload(raw)
            if ceil_field in bytes(node) and _strings(node, _NODE_OP_TYPE) == ["Ceil"]:
                ceils.append((i, node))
        elif n == _GRAPH_INPUT:
            inputs.update(_strings(_payload(raw), 1))
    if SPEED_INPUT in inputs:
        raise ValueError("the graph already has a speed input")
    if blank_id is not None and IDS_INPUT not in inputs:
        raise NotAVitsGraph(f"the graph has no input {IDS_INPUT!r} of phoneme ids")
    if len(ceils) != 1:
        raise NotAVitsGraph(f"expected one Ceil (the durations' rounding), found {len(ceils)}")
    at, ceil = ceils[0]
    (w,) = _strings(ceil, _NODE_INPUT)
    rescaled = RESCALED_DURATIONS
    new_ceil = b"".join(
        _ld(_NODE_INPUT, rescaled.encode()) if n == _NODE_INPUT else bytes(raw)
        for n, _, raw in _fields(ceil)
    )
    added = _rescale_nodes(w, IDS_INPUT, blank_id, rescaled) + _ld(_GRAPH_NODE, new_ceil)
    tail = _speed_input()
    if durations_output:
        (frames,) = _strings(ceil, _NODE_OUTPUT)
        outputs = [_strings(_payload(raw), 1) for n, w, raw in fields if n == _GRAPH_OUTPUT]
        if [frames] not in outputs:
            tail += _ld(_GRAPH_OUTPUT, _ld(1, frames.encode()))  # ValueInfoProto { name }
    # The model is written once, into one buffer: its weights are copied once (tens of MB).
    size = sum(len(raw) for _, _, raw in fields) - len(fields[at][2]) + len(added) + len(tail)
    out = bytearray()
    for n, wire, raw in _fields(view):
        if not (n == _MODEL_GRAPH and wire == 2):
            out += raw
    out += _varint(_MODEL_GRAPH << 3 | 2) + _varint(size)
    for i, (_, _, raw) in enumerate(fields):
        out += added if i == at else raw
    out += tail
    return bytes(out)


def rescaled_durations(frames: Any, speed: float, blank: Any = None) -> Any:
    """Whole frames at ``speed`` from whole frames at speed 1 (a torch tensor ``[..., T]``, the
    ids on the last axis; padding ids have 0 frames and stay at 0), ``blank`` (a bool tensor
    of the same shape, or None) marking the blanks between phonemes: the graph's rule in torch.

    Each id's frames over the speed, ``u``, and the running total of the ``u``, rounded (half
    up), ends each id: the total is speed 1's over the speed within half a frame, and slower
    than speed 1 that is all. Faster, an id of one frame at speed 1 gets less than one: a
    phoneme (any id not blank) then takes what it lacks of a frame from the blank after it,
    then from the one before it (a blank may go to nothing); what the blanks lack is found by
    shortening every id above its least (a phoneme's frame, a blank's nothing) in proportion,
    so the total holds. The least is kept last, whatever the rounding did: a phoneme always has
    a frame (beyond about speed 3.5 the bundled voice's text has fewer frames than phonemes,
    and is then longer than asked).
    """
    import torch

    def later(x: Any) -> Any:
        return torch.cat([x[..., 1:], torch.zeros_like(x[..., :1])], dim=-1)

    def earlier(x: Any) -> Any:
        return torch.cat([torch.zeros_like(x[..., :1]), x[..., :-1]], dim=-1)

    def total(x: Any) -> Any:
        return torch.cumsum(x, dim=-1)[..., -1:]

    frames = frames.float()
    u = frames / speed
    heard = (frames > 0).float()
    if blank is None:
        least = heard
        v = torch.maximum(u, least)
    else:
        b = blank.float()
        least = heard - heard * b
        avail = u * b
        deficit = torch.relu(least - u)
        take1 = torch.minimum(deficit, later(avail))
        given1 = earlier(take1)
        take2 = torch.relu(torch.minimum(deficit - take1, earlier(avail - given1)))
        given2 = later(take2)
        v = torch.maximum(u + (take1 + take2) - (given1 + given2), least)
    excess = torch.relu(total(v) - total(u))
    slack = torch.relu(v - least)
    room = total(slack)
    share = torch.minimum(excess / torch.clamp(room, min=_EPS), torch.ones_like(excess))
    squeezed = v - slack * share
    overflow = torch.relu(excess - room)
    kept = 1 - overflow / torch.clamp(total(squeezed), min=_EPS)
    ends = torch.floor(torch.cumsum((squeezed * kept).double(), dim=-1) + 0.5)
    return torch.maximum((ends - earlier(ends)).float(), torch.floor(least * kept))


def vits_feeds(
    ids: Sequence[int], scales: Sequence[float], speed: float | None = None
) -> dict[str, np.ndarray[Any, Any]]:
    """The inputs of a VITS graph (Piper's, Coqui's export) for one item: its phoneme ``ids``,
    ``scales`` (noise, length, duration noise) and, for a rewritten graph, its ``speed``."""
    feeds: dict[str, np.ndarray[Any, Any]] = {
        "input": np.asarray([ids], dtype=np.int64),
        "input_lengths": np.asarray([len(ids)], dtype=np.int64),
        "scales": np.asarray(scales, dtype=np.float32),
    }
    if speed is not None:
        feeds[SPEED_INPUT] = np.asarray([speed], dtype=np.float32)
    return feeds
