"""Serialized ONNX models read and written at the protobuf wire level, for the graph rewrites
(:mod:`synth.exact_speed`, :mod:`synth.seeded_noise`): the ``onnx`` package is not needed, so a
slim install (Piper only) has them, and a field is a slice of the model (a graph's weights are
not copied until the rewritten model is written, once).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

Buffer = bytes | memoryview

# Protobuf field numbers of the ONNX messages used (onnx/onnx.proto).
MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INPUT, GRAPH_OUTPUT = 1, 11, 12
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP_TYPE, NODE_ATTRIBUTE = 1, 2, 3, 4, 5
ATTR_NAME, ATTR_FLOAT, ATTR_INT, ATTR_TENSOR, ATTR_TYPE = 1, 2, 3, 5, 20
ATTRIBUTE_INT, ATTRIBUTE_TENSOR = 2, 4  # AttributeProto.AttributeType
FLOAT, INT64, DOUBLE = 1, 7, 11  # TensorProto.DataType


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: Buffer, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(data: Buffer) -> Iterator[tuple[int, int, Buffer]]:
    """``(field number, wire type, raw bytes of the whole field, tag included)`` in order: slices
    of ``data`` (views, where ``data`` is a memoryview: a graph's weights are not copied)."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = read_varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated protobuf message")
        yield number, wire, data[start:pos]


def field_value(raw: Buffer) -> Buffer:
    """A field's value without its tag (and, length-delimited, without its length)."""
    tag, pos = read_varint(raw, 0)
    if tag & 7 == 2:
        _, pos = read_varint(raw, pos)
    return raw[pos:]


def ld(number: int, payload: Buffer) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + bytes(payload)


def int_field(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def strings(message: Buffer, number: int) -> list[str]:
    """The values of ``message``'s length-delimited fields ``number``, as text."""
    return [
        bytes(field_value(raw)).decode() for n, w, raw in fields(message) if n == number and w == 2
    ]


def node_field(
    op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, attribute: bytes
) -> bytes:
    """A graph's field holding a NodeProto (``attribute``: one AttributeProto, or none if empty)."""
    body = b"".join(ld(NODE_INPUT, i.encode()) for i in inputs)
    body += b"".join(ld(NODE_OUTPUT, o.encode()) for o in outputs)
    body += ld(NODE_NAME, name.encode()) + ld(NODE_OP_TYPE, op.encode())
    return ld(GRAPH_NODE, body + (ld(NODE_ATTRIBUTE, attribute) if attribute else b""))


def tensor_attribute(data_type: int, raw: bytes, dims: Sequence[int] = ()) -> bytes:
    """AttributeProto ``value`` holding a tensor: a ``Constant`` node's."""
    tensor = b"".join(int_field(1, d) for d in dims) + int_field(2, data_type) + ld(9, raw)
    return (
        ld(ATTR_NAME, b"value") + ld(ATTR_TENSOR, tensor) + int_field(ATTR_TYPE, ATTRIBUTE_TENSOR)
    )


def tensor_info(name: str, elem_type: int, dims: bytes) -> bytes:
    """ValueInfoProto ``name``: a tensor of ``elem_type`` whose shape has ``dims`` (its
    TensorShapeProto's ``dim`` fields; none, a scalar)."""
    tensor = int_field(1, elem_type) + ld(2, dims)  # TypeProto.Tensor { elem_type, shape }
    return ld(1, name.encode()) + ld(2, ld(1, tensor))


def with_graph(model: Buffer, graph: Sequence[Buffer]) -> bytes:
    """``model`` (a ``ModelProto``) with its graph's fields replaced by ``graph``: written once,
    into one buffer (a model's weights are tens of MB)."""
    head = [raw for n, w, raw in fields(model) if not (n == MODEL_GRAPH and w == 2)]
    tag = varint(MODEL_GRAPH << 3 | 2) + varint(sum(len(part) for part in graph))
    return b"".join([*head, tag, *graph])
