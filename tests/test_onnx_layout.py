"""synth.onnx_layout: 1-D convolutions recast as 2-D compute the same thing."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from synth.onnx_layout import conv1d_as_conv2d


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = onnxruntime.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return np.asarray(sess.run(None, {"x": x})[0])


def decoder_like() -> onnx.ModelProto:
    """Conv (padded, dilated) -> LeakyRelu -> strided Conv with bias -> ConvTranspose with
    output padding -> a grouped Conv: the shapes HiFi-GAN and VITS use."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    inits = [
        numpy_helper.from_array(w(32, 16, 3), "w1"),
        numpy_helper.from_array(w(32, 32, 5), "w2"),
        numpy_helper.from_array(w(32), "b2"),
        numpy_helper.from_array(w(32, 16, 4), "w3"),  # ConvTranspose: (in, out/group, k)
        numpy_helper.from_array(w(16, 4, 7), "w4"),  # group 4: (out, in/group, k)
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h1"], kernel_shape=[3], pads=[3, 3], dilations=[3]),
        helper.make_node("LeakyRelu", ["h1"], ["h2"], alpha=0.1),
        helper.make_node(
            "Conv", ["h2", "w2", "b2"], ["h3"], kernel_shape=[5], pads=[2, 1], strides=[2]
        ),
        helper.make_node(
            "ConvTranspose",
            ["h3", "w3"],
            ["h4"],
            kernel_shape=[4],
            strides=[2],
            pads=[1, 1],
            output_padding=[1],
        ),
        helper.make_node("Conv", ["h4", "w4"], ["y"], kernel_shape=[7], pads=[3, 3], group=4),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, None])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("frames", [37, 400])
def test_rewritten_graph_gives_the_same_output(frames: int) -> None:
    model = decoder_like()
    x = np.random.default_rng(frames).standard_normal((1, 16, frames)).astype(np.float32)
    before = run(model, x)
    rewritten = decoder_like()
    assert conv1d_as_conv2d(rewritten) == 4
    onnx.checker.check_model(rewritten)
    assert not any(len(i.dims) == 3 for i in rewritten.graph.initializer)  # old weights dropped
    after = run(rewritten, x)
    assert after.shape == before.shape
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-5)


def test_a_graph_without_1d_convolutions_is_left_alone() -> None:
    model = decoder_like()
    assert conv1d_as_conv2d(model) == 4
    again = onnx.ModelProto()
    again.CopyFrom(model)
    assert conv1d_as_conv2d(again) == 0
    assert again == model
