"""Settings and wiring of the synthesis backend: env/flags, validation, batch sizes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.http import keys
from gateway.runtime.components import default_engine_specs
from gateway.runtime.settings import Settings, SettingsError
from metrics import Metrics
from tests.conftest import GatewayFactory

# One pytest-xdist worker runs the whole module: the Coqui model and its torch engine are loaded on one worker only.
pytestmark = pytest.mark.xdist_group("coqui")


def test_env_and_validation(tmp_path: Path) -> None:
    s = Settings.load(
        env={"VOXGATE_SYNTH_WORKERS": "2", "VOXGATE_COQUI_MODEL": "/m/model.pth"},
        overrides={"devices": "cpu", "coqui_mode": "onnx"},
    )
    assert (s.synth_workers, s.coqui_model, s.coqui_mode) == (2, "/m/model.pth", "onnx")
    assert s.pool_workers() == 2
    assert s.effective_max_batch() == 1  # CPU: batching measured slower
    gpu = s.replace(devices=("cuda:0", "cuda:1", "cuda:2"))
    assert gpu.pool_workers() == 3  # one worker per GPU
    assert gpu.effective_max_batch() == 8
    with pytest.raises(SettingsError, match="coqui_mode"):
        Settings.load(env={}, overrides={"coqui_mode": "tensorrt"})
    with pytest.raises(SettingsError, match="devices"):
        Settings.load(env={}, overrides={"devices": "tpu:0"})
    with pytest.raises(SettingsError, match="synth_workers"):
        Settings.load(env={"VOXGATE_SYNTH_WORKERS": "-1"})


def test_specs_one_per_worker_with_devices(
    settings: Settings, coqui_model_files: tuple[Path, Path]
) -> None:
    model, config = coqui_model_files
    s = settings.replace(coqui_model=str(model), synth_workers=1, devices=("cuda:0", "cuda:1"))
    specs = default_engine_specs(s)
    assert set(specs) == {"piper", "coqui"}
    assert [sp.kwargs["device"] for sp in specs["coqui"]] == ["cuda:0", "cuda:1"]
    assert [sp.kwargs["use_cuda"] for sp in specs["piper"]] == [True, True]
    assert specs["coqui"][0].kwargs["config_path"] == config  # config.json beside the checkpoint


async def test_max_batch_never_batches_items_a_batch_would_make_sound_otherwise(
    gateway: GatewayFactory,
    settings: Settings,
    metrics: Metrics,
    coqui_model_files: tuple[Path, Path],
) -> None:
    """One sound per address: a padded Coqui batch draws one noise tensor for all its rows and
    its decoder hears a longer neighbour's padding, so an item would sound as its batch made
    it. With ``max_batch`` 4 asked, neither engine batches: four requests sent at once are
    four batches of one, each its own address's sound."""
    model, config = coqui_model_files
    s = settings.replace(
        coqui_model=str(model), coqui_config=str(config), max_batch=4, max_wait_ms=2000
    )
    client = await gateway(settings=s, engines=await asyncio.to_thread(default_engine_specs, s))
    models = client.app[keys.SPEECH].models
    assert models["coqui"].scheduler.max_batch == 1
    assert models["piper"].scheduler.max_batch == 1
    bodies = [
        {
            "model": "coqui",
            "voice": "default",
            "input": f"Sentence number {w}.",
            "response_format": "wav",
        }
        for w in ("one", "two", "three", "four")
    ]
    resps = await asyncio.gather(*(client.post("/v1/audio/speech", json=b) for b in bodies))
    assert [r.status for r in resps] == [200] * 4
    assert len({await r.read() for r in resps}) == 4
    items = metrics.registry.get_sample_value(
        "voxgate_synthesis_batch_size_sum", {"model": "coqui"}
    )
    batches = metrics.registry.get_sample_value(
        "voxgate_synthesis_batch_size_count", {"model": "coqui"}
    )
    assert items == 4 and batches == 4
