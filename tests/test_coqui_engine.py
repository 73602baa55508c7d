"""The Coqui engine on a real (random-weight, reduced-size) Coqui VITS built by a fixture.

Loads go through Coqui's own Synthesizer, the path a downloaded model takes; nothing downloads.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from gateway.runtime.components import default_engine_specs
from gateway.runtime.settings import Settings
from synth.coqui_engine import CoquiEngine
from synth.engine import Engine, SynthesisItem
from synth.exact_speed import SPEED_RULE
from tests.conftest import GatewayFactory

# One pytest-xdist worker runs the whole module: the Coqui model and its torch engine are loaded on one worker only.
pytestmark = pytest.mark.xdist_group("coqui")

TEXTS = [
    "Hello world.",
    "This is a somewhat longer sentence, with a comma and more words to say.",
    "Short one",
    "A medium sized test.",
]


@pytest.fixture(scope="module")
def coqui_torch(coqui_model_files: tuple[Path, Path]) -> CoquiEngine:
    engine = CoquiEngine(*coqui_model_files, mode="torch")
    engine.load()
    return engine


def test_metadata_without_loading(coqui_model_files: tuple[Path, Path]) -> None:
    engine = CoquiEngine(*coqui_model_files)
    assert isinstance(engine, Engine)
    assert engine.sample_rate == 22050
    assert [v.name for v in engine.voices()] == ["default"]
    assert engine.describe()["mode"] == "torch"
    assert engine.max_exact_batch == 1  # each item alone: its noise and its sound its own
    assert set(engine.default_params("default")) == {
        "noise_scale",
        "noise_scale_dp",
        "length_scale",
    }


def test_fingerprint_follows_checkpoint_and_config(
    coqui_model_files: tuple[Path, Path], tmp_path: Path
) -> None:
    model, config = coqui_model_files
    shutil.copy(model, tmp_path / "model.pth")
    shutil.copy(config, tmp_path / "config.json")
    same = CoquiEngine(tmp_path / "model.pth", tmp_path / "config.json")
    assert same.fingerprint == CoquiEngine(model, config).fingerprint
    data = json.loads((tmp_path / "config.json").read_text())
    data["model_args"]["length_scale"] = 1.1
    (tmp_path / "config.json").write_text(json.dumps(data))
    changed = CoquiEngine(tmp_path / "model.pth", tmp_path / "config.json")
    assert changed.fingerprint != same.fingerprint


def test_an_item_sounds_the_same_in_any_batch_and_any_engine(
    coqui_model_files: tuple[Path, Path], coqui_torch: CoquiEngine
) -> None:
    """With the model's own noise on: a batch's items, each alone in reverse order, and each in
    a freshly loaded engine (nothing ran before it) are the same samples, bit for bit."""
    items = [SynthesisItem(text, "default") for text in TEXTS]
    items.append(SynthesisItem(TEXTS[0], "default", speed=1.5))
    batched = coqui_torch.synthesize_batch(items)
    singles = [coqui_torch.synthesize_batch([item])[0] for item in reversed(items)][::-1]
    fresh = CoquiEngine(*coqui_model_files, mode="torch")
    fresh.load()
    firsts = [fresh.synthesize_batch([item])[0] for item in items]
    assert len(batched) == len(items)
    for b, s, f in zip(batched, singles, firsts, strict=True):
        assert b.sample_rate == 22050
        assert np.array_equal(b.pcm, s.pcm) and np.array_equal(b.pcm, f.pcm)
    # In order: lengths follow the texts, longest text -> longest audio.
    lengths = [len(a.pcm) for a in batched]
    assert lengths.index(max(lengths)) == 1
    # The noise is on and the item's own: its retake, and another text, sound otherwise.
    retake = coqui_torch.synthesize_batch([SynthesisItem(TEXTS[0], "default", take=1)])[0]
    assert not np.array_equal(retake.pcm, batched[0].pcm)


@pytest.mark.slow  # the ONNX export takes ~10 s on 2 busy cores
def test_onnx_mode_exports_once_and_matches_torch(
    coqui_model_files: tuple[Path, Path], coqui_torch: CoquiEngine, tmp_path: Path
) -> None:
    engine = CoquiEngine(*coqui_model_files, mode="onnx", onnx_dir=tmp_path)
    engine.load()
    exported = tmp_path / f"{engine.fingerprint}.conv2d.{SPEED_RULE}.onnx"
    assert exported.is_file()
    import onnx

    graph = onnx.load(str(exported)).graph
    dims = {i.name: len(i.dims) for i in graph.initializer}
    convs = [n for n in graph.node if n.op_type in ("Conv", "ConvTranspose")]
    # The layout rewrite ran: no constant-weight convolution is left in 1-D.
    assert convs and all(dims.get(n.input[1]) != 3 for n in convs)
    stamp = exported.stat().st_mtime_ns
    again = CoquiEngine(*coqui_model_files, mode="onnx", onnx_dir=tmp_path)
    again.load()
    assert exported.stat().st_mtime_ns == stamp  # reused, not exported again
    assert engine.max_exact_batch == 1
    assert engine.describe()["runtime"] == "onnxruntime"
    # With the noise on: eager and the export draw the same noise for one address.
    items = [SynthesisItem(text, "default") for text in TEXTS[:2]]
    out = engine.synthesize_batch(items)
    reversed_out = engine.synthesize_batch(items[::-1])[::-1]
    assert all(np.array_equal(a.pcm, b.pcm) for a, b in zip(out, reversed_out, strict=True))
    ref = coqui_torch.synthesize_batch(items[:1])[0]
    assert len(out) == 2
    assert len(out[0].pcm) == len(ref.pcm)
    assert float(np.abs(out[0].pcm - ref.pcm).max()) < 1e-3


def test_int8_is_a_logged_no_op_for_vits(
    coqui_model_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    engine = CoquiEngine(*coqui_model_files, mode="int8")
    with caplog.at_level(logging.INFO, logger="voxgate.synth.coqui"):
        engine.load()
    assert "no-op" in caplog.text
    assert engine.describe()["quantized_layers"] == 0
    assert len(engine.synthesize_batch([SynthesisItem("Hi there.", "default")])[0].pcm) > 0


def test_unknown_voice_is_an_engine_error(coqui_torch: CoquiEngine) -> None:
    from synth.errors import EngineError

    with pytest.raises(EngineError):
        coqui_torch.synthesize_batch([SynthesisItem("Hello.", "nobody")])


def test_fp16_needs_cuda(coqui_model_files: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="CUDA"):
        CoquiEngine(*coqui_model_files, mode="fp16", device="cpu")


@pytest.mark.parametrize(
    ("mode", "workers"),
    [("torch", 0), pytest.param("onnx", 1, marks=pytest.mark.slow)],  # worker spawn + export
)
async def test_gateway_serves_coqui_beside_piper(
    gateway: GatewayFactory,
    settings: Settings,
    coqui_model_files: tuple[Path, Path],
    mode: str,
    workers: int,
) -> None:
    model, config = coqui_model_files
    settings = settings.replace(
        coqui_model=str(model), coqui_config=str(config), coqui_mode=mode, synth_workers=workers
    )
    client = await gateway(
        settings=settings, engines=await asyncio.to_thread(default_engine_specs, settings)
    )
    listing = await (await client.get("/v1/voices")).json()
    models = {m["id"]: m for m in listing["models"]}
    assert set(models) == {"piper", "coqui"}
    assert models["coqui"]["execution"]["mode"] == mode
    assert [v["id"] for v in models["coqui"]["voices"]] == ["default"]
    body = {
        "model": "coqui",
        "voice": "default",
        "input": "Hello from Coqui.",
        "response_format": "wav",
    }
    resp = await client.post("/v1/audio/speech", json=body)
    assert resp.status == 200, await resp.text()
    pcm, rate = sf.read(io.BytesIO(await resp.read()), dtype="float32")
    assert rate == 22050
    assert len(pcm) > 0.1 * rate
    again = await client.post("/v1/audio/speech", json=body)
    assert again.headers["X-Cache"] == "HIT"
    # An OpenAI voice name on the Coqui model falls back to its first voice.
    body["voice"] = "alloy"
    assert (await client.post("/v1/audio/speech", json=body)).status == 200
