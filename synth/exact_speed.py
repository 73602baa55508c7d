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
from collections.abc import Sequence
from typing import Any

import numpy as np

from synth.onnx_wire import (
    ATTR_INT,
    ATTR_NAME,
    ATTR_TYPE,
    ATTRIBUTE_INT,
    DOUBLE,
    FLOAT,
    GRAPH_INPUT,
    GRAPH_NODE,
    GRAPH_OUTPUT,
    INT64,
    MODEL_GRAPH,
    NODE_INPUT,
    NODE_OP_TYPE,
    NODE_OUTPUT,
    field_value,
    fields,
    int_field,
    ld,
    node_field,
    strings,
    tensor_attribute,
    tensor_info,
    with_graph,
)

SPEED_INPUT = "speed"
_PREFIX = "voxgate_speed/"
# What the graph's own ``Ceil`` reads once rewritten: each id's whole frames at the asked speed.
RESCALED_DURATIONS = _PREFIX + "durations"
# The rule's name, in what it makes: audio away from speed 1 (its content addresses) and Coqui's
# cached graphs. Audio made by a rule before it ("exact": a phoneme could get no frame) differs.
SPEED_RULE = "exact-phonemes"

# Below any share of a frame that matters: keeps a division by no room at all finite.
_EPS = 1e-6
# The graph's input of phoneme ids (Piper's and Coqui's VITS exports name it so).
IDS_INPUT = "input"


class NotAVitsGraph(ValueError):
    """The model's graph has not exactly one ``Ceil`` (the VITS durations' rounding)."""


class _Builder:
    """Nodes of the rule, appended in topological order; each output named by the builder."""

    def __init__(self) -> None:
        self.nodes: list[bytes] = []
        self._count = 0

    def add(self, op: str, *inputs: str, attribute: bytes = b"", out: str | None = None) -> str:
        if out is None:
            self._count += 1
            out = f"{_PREFIX}{op.lower()}{self._count}"
        self.nodes.append(node_field(op, inputs, [out], _PREFIX + out, attribute))
        return out

    def constant(self, data_type: int, raw: bytes, dims: Sequence[int] = ()) -> str:
        return self.add("Constant", attribute=tensor_attribute(data_type, raw, dims))


def _attribute_int(name: str, value: int) -> bytes:
    """AttributeProto ``name`` of type INT (negative values as protobuf's 64-bit two's complement)."""
    return (
        ld(ATTR_NAME, name.encode())
        + int_field(ATTR_INT, value & (1 << 64) - 1)
        + int_field(ATTR_TYPE, ATTRIBUTE_INT)
    )


def _rescale_nodes(w: str, ids: str, blank_id: int | None, out: str) -> bytes:
    """Nodes computing ``out`` (whole frames at the asked speed) from ``w`` (frames at speed 1,
    before rounding up; ``[batch, 1, ids]``) and the input ``ids`` (``[batch, ids]``):
    :func:`rescaled_durations`, op for op."""
    g = _Builder()
    i64 = functools.partial(g.constant, INT64, dims=[1])
    axis = g.constant(INT64, struct.pack("<q", -1))
    # Slice's starts, ends and axes: the last axis, its first id, the second, and the end.
    last, zero, one, end = (i64(struct.pack("<q", v)) for v in (-1, 0, 1, 2**63 - 1))
    f32 = functools.partial(g.constant, FLOAT)
    half = g.constant(DOUBLE, struct.pack("<d", 0.5))
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
        attribute=_attribute_int("to", FLOAT),
    )
    if blank_id is None:
        least = heard
        v = g.add("Max", u, least)
    else:
        is_blank = g.add("Equal", ids, g.constant(INT64, struct.pack("<q", blank_id)))
        blank = g.add(
            "Reshape",
            g.add("Cast", is_blank, attribute=_attribute_int("to", FLOAT)),
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
    scaled = g.add("Cast", g.add("Mul", squeezed, kept), attribute=_attribute_int("to", DOUBLE))
    ends = g.add("Floor", g.add("Add", g.add("CumSum", scaled, axis), half))
    steps = g.add("Cast", g.add("Sub", ends, earlier(ends)), attribute=_attribute_int("to", FLOAT))
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
    graph_raw = [raw for n, w, raw in fields(view) if n == MODEL_GRAPH and w == 2]
    if len(graph_raw) != 1:
        raise NotAVitsGraph("the model has no graph")
    graph = field_value(graph_raw[0])
    parts = list(fields(graph))
    # Only a node whose bytes hold the op type field ``Ceil`` is parsed (the rest are thousands).
    ceil_field = ld(NODE_OP_TYPE, b"Ceil")
    ceils = []
    inputs = set()
    for i, (n, _wire, raw) in enumerate(parts):
        if n == GRAPH_NODE:
            node = field_value(raw)
            if ceil_field in bytes(node) and strings(node, NODE_OP_TYPE) == ["Ceil"]:
                ceils.append((i, node))
        elif n == GRAPH_INPUT:
            inputs.update(strings(field_value(raw), 1))
    if SPEED_INPUT in inputs:
        raise ValueError("the graph already has a speed input")
    if blank_id is not None and IDS_INPUT not in inputs:
        raise NotAVitsGraph(f"the graph has no input {IDS_INPUT!r} of phoneme ids")
    if len(ceils) != 1:
        raise NotAVitsGraph(f"expected one Ceil (the durations' rounding), found {len(ceils)}")
    at, ceil = ceils[0]
    (w,) = strings(ceil, NODE_INPUT)
    rescaled = RESCALED_DURATIONS
    new_ceil = b"".join(
        ld(NODE_INPUT, rescaled.encode()) if n == NODE_INPUT else bytes(raw)
        for n, _, raw in fields(ceil)
    )
    added = _rescale_nodes(w, IDS_INPUT, blank_id, rescaled) + ld(GRAPH_NODE, new_ceil)
    # The input ``speed``: a float tensor of shape [1] (a ``dim`` of ``dim_value`` 1).
    tail = ld(GRAPH_INPUT, tensor_info(SPEED_INPUT, FLOAT, ld(1, int_field(1, 1))))
    if durations_output:
        (frames,) = strings(ceil, NODE_OUTPUT)
        outputs = [strings(field_value(raw), 1) for n, w, raw in parts if n == GRAPH_OUTPUT]
        if [frames] not in outputs:
            tail += ld(GRAPH_OUTPUT, ld(1, frames.encode()))  # ValueInfoProto { name }
    return with_graph(
        view, [*(added if i == at else raw for i, (_, _, raw) in enumerate(parts)), tail]
    )


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
