"""kind = "cartesia": Cartesia's Text to Speech (Bytes) REST API over aiohttp, as docs/upstreams.md,
"Providers", has it (and why not their SDK); also their API reference's "Make an API request"."""

from __future__ import annotations

from synth.engine import SynthesisItem
from synth.providers.base import PCM_RATES, ProviderSpec
from synth.providers.http_api import HttpCall, HttpProvider

API_VERSION = "2025-04-16"


class CartesiaProvider(HttpProvider):
    """The provider of Cartesia's ``/tts/bytes``."""

    # An unknown voice id: 404 on a well-formed request, the caller's to fix.
    refusal_statuses = frozenset({404})
    error_paths = (("message",), ("title",), ("error",))
    speeds = (0.6, 1.5)
    speed_refusal = "Cartesia speaks at 0.6 to 1.5 times the normal rate"

    def request(self, item: SynthesisItem) -> HttpCall:
        c = self.config
        body: dict[str, object] = {
            "model_id": c.model,
            "transcript": item.text,
            "voice": {"mode": "id", "id": item.voice},
            "output_format": {
                "container": "raw",
                "encoding": "pcm_s16le",
                "sample_rate": c.sample_rate,
            },
        }
        if c.language:
            body["language"] = c.language.replace("-", "_").split("_")[0].lower()
        if item.speed != 1.0:
            body["generation_config"] = {"speed": item.speed}
        return HttpCall(
            url=f"{c.base_url}/tts/bytes",
            headers={"X-API-Key": self.api_key, "Cartesia-Version": API_VERSION},
            json=body,
        )


SPEC = ProviderSpec(
    "cartesia",
    CartesiaProvider,
    rates=PCM_RATES,
    model="sonic-2",
    sends_language=True,
    reads_numbers=True,
)
