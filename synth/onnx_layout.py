"""Graph rewrites applied to an exported ONNX model before ONNX Runtime loads it.

:func:`conv1d_as_conv2d` recasts every 1-D convolution (``Conv``/``ConvTranspose`` with a 3-D
weight) as the same convolution in 2-D over a height of 1, between an ``Unsqueeze`` and a
``Squeeze``. The result is the same up to float rounding, but ONNX Runtime's CPU provider only
lays 2-D convolutions out in its blocked NCHWc format, whose direct kernels beat the
im2col + GEMM path it takes for 1-D ones. Coqui's LJSpeech-size VITS spends most of its time in
the HiFi-GAN decoder's convolutions, so they decide its synthesis speed on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CONV_OPS = ("Conv", "ConvTranspose")
_AXES = "voxgate_conv2d_axes"


def _attrs_2d(node: Any) -> dict[str, Any]:
    from onnx import helper

    attrs: dict[str, Any] = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        if a.name in ("kernel_shape", "strides", "dilations", "output_padding", "output_shape"):
            value = [0 if a.name == "output_padding" else 1, *value]
        elif a.name == "pads":  # [begin, end] -> [h_begin, w_begin, h_end, w_end]
            value = [0, value[0], 0, value[1]]
        attrs[a.name] = value
    return attrs


def conv1d_as_conv2d(model: Any) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``, in place); returns how many nodes changed.

    Only convolutions whose weight is a constant 3-D initializer change (their shapes are known).
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    weights_2d: dict[str, str] = {}
    nodes: list[Any] = []
    changed = 0
    for node in graph.node:
        weight = node.input[1] if len(node.input) > 1 else ""
        init = inits.get(weight)
        if node.op_type not in CONV_OPS or init is None or len(init.dims) != 3:
            nodes.append(node)
            continue
        if weight not in weights_2d:
            arr = numpy_helper.to_array(init)
            weights_2d[weight] = f"{weight}__2d"
            graph.initializer.append(
                numpy_helper.from_array(
                    np.ascontiguousarray(arr[:, :, None, :]), weights_2d[weight]
                )
            )
        x, y = node.input[0], node.output[0]
        x4, y4 = f"{y}__in2d", f"{y}__out2d"
        nodes.append(helper.make_node("Unsqueeze", [x, _AXES], [x4]))
        nodes.append(
            helper.make_node(
                node.op_type,
                [x4, weights_2d[weight], *node.input[2:]],
                [y4],
                name=node.name,
                **_attrs_2d(node),
            )
        )
        nodes.append(helper.make_node("Squeeze", [y4, _AXES], [y]))
        changed += 1
    if not changed:
        return 0
    graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), _AXES))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return changed


def rewrite_file(src: str, dst: str) -> int:
    """Load ``src``, apply :func:`conv1d_as_conv2d`, save to ``dst``; returns nodes changed."""
    import onnx

    model = onnx.load(src)
    changed = conv1d_as_conv2d(model)
    onnx.save(model, dst)
    return changed
