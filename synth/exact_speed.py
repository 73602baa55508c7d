"""Speech at exactly the speed asked, for VITS graphs (Piper voices, Coqui's VITS).

Why dividing the length scale by the speed falls short (VITS rounds each id's duration up to a
whole frame), the rule that replaces it, ``d_i = round(C_i / s) - round(C_{i-1} / s)`` over the
running total ``C`` of the speed-1 frames, and what it measured: docs/synthesis.md, "Speed". The
blank ids between phonemes (most of them under a frame) were what cost a frame at any speed; now
every id keeps its share, and a fast id may get no frame at all: the alignment VITS builds from
the running total skips it.

:func:`rescaled_graph` rewrites a serialized ONNX model at the protobuf wire level (a VITS graph's
one ``Ceil`` whose output feeds a ``CumSum``), adding an input ``speed`` (float ``[1]``; every run feeds
it: a default given as an initializer would keep ONNX Runtime from folding constants, and it
warns): the ``onnx`` package is not needed, so a slim install (Piper only) has it. :func:`rescaled_durations` is the same rule on a
torch tensor (Coqui eager).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

Buffer = bytes | memoryview

SPEED_INPUT = "speed"
_PREFIX = "voxgate_speed/"
# What the graph's own ``Ceil`` reads once rewritten: each id's whole frames at the asked speed.
RESCALED_DURATIONS = _PREFIX + "durations"

# Protobuf field numbers of the ONNX messages used (onnx/onnx.proto).
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 11, 12
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE, _NODE_ATTRIBUTE = 1, 2, 3, 4, 5
_FLOAT, _INT64 = 1, 7  # TensorProto.DataType
_ATTRIBUTE_TENSOR = 4  # AttributeProto.AttributeType.TENSOR


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


def _last_axis(name: str) -> bytes:
    """A ``Constant`` node making ``name``: the int64 scalar -1."""
    tensor = _int(2, _INT64) + _ld(9, struct.pack("<q", -1))  # data_type, raw_data
    attribute = _ld(1, b"value") + _ld(5, tensor) + _int(20, _ATTRIBUTE_TENSOR)
    return _node("Constant", [], [name], attribute)


def _rescale_nodes(w: str, out: str) -> bytes:
    """Nodes computing ``out`` (whole frames at the asked speed) from ``w`` (frames at speed 1,
    before rounding up; the input ids on its last axis)."""
    p = _PREFIX
    return b"".join(
        [
            _last_axis(p + "axis"),
            _node("Ceil", [w], [p + "frames"]),
            _node("CumSum", [p + "frames", p + "axis"], [p + "total"]),
            _node("Sub", [p + "total", p + "frames"], [p + "before"]),
            _node("Div", [p + "total", SPEED_INPUT], [p + "total_s"]),
            _node("Div", [p + "before", SPEED_INPUT], [p + "before_s"]),
            _node("Round", [p + "total_s"], [p + "end"]),
            _node("Round", [p + "before_s"], [p + "start"]),
            _node("Sub", [p + "end", p + "start"], [out]),
        ]
    )


def rescaled_graph(model: bytes, durations_output: bool = False) -> bytes:
    """``model`` (a serialized VITS ``ModelProto``) with durations divided by a ``speed`` input.

    With ``durations_output``, the ``Ceil``'s output (each input id's whole frames at the asked
    speed) is also a graph output, after the audio, unless it is one already: what Piper's
    ``patch_voice_with_alignment.add_alignment_output`` adds (a ``ValueInfoProto`` with only its
    name), done here on the wire, so neither the ``onnx`` package nor a second parse is needed.

    The graph's ``Ceil`` then reads the rescaled frames (already whole, so it leaves them); the
    new nodes go just before it, keeping the node list in topological order. Raises
    :class:`NotAVitsGraph` where the top graph has not exactly one ``Ceil`` (Piper's and Coqui's
    VITS exports have one, the durations'), and ``ValueError`` where it already has a ``speed``
    input.
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
    for i, (n, _wire, raw) in enumerate(fields):
        if n == _GRAPH_NODE:
            node = _payload(raw)
            if ceil_field in bytes(node) and _strings(node, _NODE_OP_TYPE) == ["Ceil"]:
                ceils.append((i, node))
        elif n == _GRAPH_INPUT and _strings(_payload(raw), 1) == [SPEED_INPUT]:
            raise ValueError("the graph already has a speed input")
    if len(ceils) != 1:
        raise NotAVitsGraph(f"expected one Ceil (the durations' rounding), found {len(ceils)}")
    at, ceil = ceils[0]
    (w,) = _strings(ceil, _NODE_INPUT)
    rescaled = RESCALED_DURATIONS
    new_ceil = b"".join(
        _ld(_NODE_INPUT, rescaled.encode()) if n == _NODE_INPUT else bytes(raw)
        for n, _, raw in _fields(ceil)
    )
    added = _rescale_nodes(w, rescaled) + _ld(_GRAPH_NODE, new_ceil)
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


def rescaled_durations(frames: Any, speed: float) -> Any:
    """Whole frames at ``speed`` from whole frames at speed 1 (a torch tensor ``[..., T]``, the
    ids on the last axis; padding ids have 0 frames and stay at 0): the graph's rule in torch."""
    import torch

    total = torch.cumsum(frames, dim=-1)
    return torch.round(total / speed) - torch.round((total - frames) / speed)


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
