"""``synthesis_precision = "int8"``: the int8 graph of the bundled voice, derived locally once per
model and cached, speaks close to fp32 (noise off, so deterministic) under its own content
addresses; served by ``voxgate serve`` with no topology flags.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.harness import mel_cepstral_distortion
from cache.keys import master_key
from gateway.runtime.components import default_engine_specs
from gateway.runtime.settings import Settings
from synth import onnx_quant
from synth.engine import SynthesisItem
from synth.exact_speed import SPEED_RULE
from synth.piper_engine import PiperEngine, PiperVoiceFiles
from tests.conftest import GatewayFactory
from tests.served import DefaultServer

# Module-scoped engines and servers: one xdist worker builds them.
pytestmark = pytest.mark.xdist_group("precision")

QUIET = {"noise_scale": 0.0, "noise_w": 0.0}
TEXTS = ("Thank you for calling.", "Please say your account number, then press the pound key.")
# Bounds of the int8 audio's distance from fp32, with margin over what was measured for these
# texts (docs/synthesis.md, "int8"): they catch a broken graph (wrong scales, silence, noise),
# not the ordinary int8 error.
MAX_MCD_DB = 60.0
MAX_DURATION_CHANGE = 0.05


@pytest.fixture(scope="module")
def derived_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("piper-int8")


@pytest.fixture(scope="module")
def piper_int8(derived_dir: Path) -> PiperEngine:
    """The joe voice at int8, its graph derived once for this module."""
    engine = PiperEngine([PiperVoiceFiles.bundled_joe()], precision="int8", derived_dir=derived_dir)
    engine.load()
    return engine


def test_int8_has_its_own_fingerprint_and_content_address(piper_engine: PiperEngine) -> None:
    int8 = PiperEngine([PiperVoiceFiles.bundled_joe()], precision="int8")  # not loaded
    assert int8.source_fingerprint == piper_engine.fingerprint
    assert int8.fingerprint != piper_engine.fingerprint
    assert int8.fingerprint == onnx_quant.int8_fingerprint(piper_engine.fingerprint)

    def key(engine: PiperEngine) -> str:
        return master_key(
            text="Hello.",
            engine="piper",
            voice="joe",
            fingerprint=engine.fingerprint,
            params=engine.default_params("joe"),
        )

    assert key(int8) != key(piper_engine)
    with pytest.raises(ValueError, match="precision"):
        PiperEngine([PiperVoiceFiles.bundled_joe()], precision="int4")


def test_setting_reaches_the_engine_specs(tmp_path: Path) -> None:
    settings = Settings.load(
        env={"VOXGATE_SYNTHESIS_PRECISION": "int8"}, overrides={"cache_dir": str(tmp_path)}
    )
    (spec,) = default_engine_specs(settings)["piper"][:1]
    assert spec.kwargs["precision"] == "int8"
    assert spec.kwargs["derived_dir"] == tmp_path / "piper-int8"
    assert Settings.load(env={}).synthesis_precision == "fp32"
    with pytest.raises(ValueError):
        Settings.load(env={"VOXGATE_SYNTHESIS_PRECISION": "int4"})


def test_int8_audio_is_close_to_fp32(piper_engine: PiperEngine, piper_int8: PiperEngine) -> None:
    items = [SynthesisItem(t, "joe", params=QUIET) for t in TEXTS]
    fp32 = piper_engine.synthesize_batch(items)
    int8 = piper_int8.synthesize_batch(items)
    again = piper_int8.synthesize_batch(items)
    assert piper_int8.describe()["precision"] == "int8"
    for a, b, c in zip(fp32, int8, again, strict=True):
        assert np.array_equal(b.pcm, c.pcm)  # noise off: deterministic
        assert not np.array_equal(a.pcm, b.pcm)  # it is another graph
        assert abs(b.duration_s / a.duration_s - 1.0) <= MAX_DURATION_CHANGE
        close = mel_cepstral_distortion(a.pcm, b.pcm, a.sample_rate)
        assert close <= MAX_MCD_DB
    # The measure separates: a different sentence of fp32 audio is much farther than int8 is.
    unrelated = mel_cepstral_distortion(fp32[0].pcm, fp32[1].pcm, fp32[0].sample_rate)
    int8_first = mel_cepstral_distortion(fp32[0].pcm, int8[0].pcm, fp32[0].sample_rate)
    assert int8_first < unrelated


def test_derived_graph_is_built_once(
    piper_int8: PiperEngine, derived_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (graph,) = derived_dir.glob("*.int8.onnx")
    assert graph.name == f"{piper_int8.fingerprint}.int8.onnx"
    before = graph.stat().st_mtime_ns

    def refuse(*_: Any) -> int:
        raise AssertionError("the cached int8 graph was derived again")

    monkeypatch.setattr(onnx_quant, "quantize_file", refuse)
    again = PiperEngine([PiperVoiceFiles.bundled_joe()], precision="int8", derived_dir=derived_dir)
    again.load()
    assert graph.stat().st_mtime_ns == before
    assert [p.name for p in derived_dir.glob("*.onnx")] == [graph.name]


@pytest.fixture
def tiny_conv_model(tmp_path: Path) -> Iterator[Path]:
    """A one-convolution ONNX graph: what derived_int8 does, without a voice's minutes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(
        np.linspace(-1, 1, 4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3), "w"
    )
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "t"])],
        [weight],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), str(path))
    yield path


def test_workers_starting_together_derive_once(tiny_conv_model: Path, tmp_path: Path) -> None:
    calls: list[int] = []
    gate = threading.Barrier(4)
    results: list[Path] = []

    def feeds() -> list[dict[str, np.ndarray[Any, Any]]]:
        calls.append(1)
        rng = np.random.default_rng(0)
        return [{"x": rng.standard_normal((1, 2, 16), dtype=np.float32)} for _ in range(3)]

    def worker() -> None:
        gate.wait()
        results.append(onnx_quant.derived_int8(tiny_conv_model, "f" * 64, tmp_path / "d", feeds))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and results[0].is_file()
    assert list((tmp_path / "d").glob("*.tmp")) == []
    import onnx

    ops = {n.op_type for n in onnx.load(str(results[0])).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def seed_cache(derived_dir: Path, cached: Path) -> Path:
    """The derived graph copied into a server's cache, as a previous start would have left it."""
    (graph,) = derived_dir.glob("*.int8.onnx")
    cached.mkdir(parents=True)
    return Path(shutil.copy2(graph, cached / graph.name))


def mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


async def test_served_int8_uses_the_cached_graph(
    piper_int8: PiperEngine,
    piper_engine: PiperEngine,
    derived_dir: Path,
    tmp_path: Path,
    gateway: GatewayFactory,
) -> None:
    """``voxgate serve --synthesis-precision int8`` (default topology): the workers find the
    graph in ``<cache_dir>/piper-int8`` (put there beforehand, as a previous start would have
    left it) and answer under the int8 content address: the one a gateway holding the int8
    engine gives, not the fp32 one."""
    body = {"model": "piper", "voice": "joe", "input": "Hello there.", "stream": False}
    addresses = {}
    for name, engine in (("fp32", piper_engine), ("int8", piper_int8)):
        client = await gateway(engines={"piper": engine})
        resp = await client.post("/v1/audio/speech", json=body)
        assert resp.status == 200
        addresses[name] = resp.headers["X-Audio-Key"]
    assert addresses["fp32"] != addresses["int8"]
    graph = seed_cache(derived_dir, tmp_path / "srv" / "cache" / "piper-int8")
    before = mtime(graph)
    # The addresses above come from the settings fixture, whose loudness target is off.
    server = DefaultServer(
        tmp_path / "srv", "--synthesis-precision", "int8", "--loudness-lufs", "off"
    )
    try:
        server.wait_ready()
        status, headers, answer = await server.request("POST", "/v1/audio/speech", json=body)
        assert status == 200, answer[:300]
        assert headers["X-Audio-Key"] == addresses["int8"]
        status, _, voices = await server.request("GET", "/v1/voices")
        assert status == 200 and b'"precision":"int8"' in voices.replace(b" ", b"")
        assert "deriving the int8 graph" not in server.logs()
        assert mtime(graph) == before
    finally:
        server.close()


def test_coqui_onnx_int8(coqui_model_files: tuple[Path, Path], tmp_path: Path) -> None:
    """Coqui's VITS export at int8 (the test model: reduced size, random weights): derived once
    beside the export, its own fingerprint, audio of the same length as fp32's with noise off.
    Other modes have no int8 precision and keep their fingerprint."""
    from synth.coqui_engine import CoquiEngine

    quiet = {"noise_scale": 0.0, "noise_scale_dp": 0.0}
    fp32 = CoquiEngine(*coqui_model_files, mode="onnx", onnx_dir=tmp_path)
    int8 = CoquiEngine(*coqui_model_files, mode="onnx", onnx_dir=tmp_path, precision="int8")
    torch_int8 = CoquiEngine(*coqui_model_files, mode="torch", precision="int8")
    assert torch_int8.precision == "fp32" and torch_int8.fingerprint == fp32.fingerprint
    assert int8.fingerprint == onnx_quant.int8_fingerprint(
        f"{fp32.fingerprint}.conv2d.{SPEED_RULE}"
    )
    fp32.load()
    int8.load()
    assert int8.describe()["precision"] == "int8"
    (graph,) = tmp_path.glob("*.int8.onnx")
    assert graph.name == f"{int8.fingerprint}.int8.onnx"
    items = [SynthesisItem("A medium sized test.", "default", params=quiet)]
    (a,) = fp32.synthesize_batch(items)
    (b,) = int8.synthesize_batch(items)
    (c,) = int8.synthesize_batch(items)
    assert np.array_equal(b.pcm, c.pcm)
    assert abs(b.duration_s / a.duration_s - 1.0) <= MAX_DURATION_CHANGE
    assert np.isfinite(b.pcm).all() and float(np.abs(b.pcm).max()) > 0.0
