"""kind = "deepgram": Deepgram's text to speech (Aura) REST API over aiohttp, as
docs/upstreams.md, "Providers", has it."""

from __future__ import annotations

from synth.engine import SynthesisItem
from synth.providers.base import ProviderSpec
from synth.providers.http_api import HttpCall, HttpProvider


class DeepgramProvider(HttpProvider):
    """The provider of Deepgram's ``/v1/speak``."""

    error_paths = (("err_msg",), ("message",))
    speeds = (1.0, 1.0)
    speed_refusal = "this Deepgram upstream speaks at speed 1 only"

    def request(self, item: SynthesisItem) -> HttpCall:
        return HttpCall(
            url=f"{self.config.base_url}/v1/speak",
            headers={"Authorization": f"Token {self.api_key}"},
            params={
                "model": item.voice,
                "encoding": "linear16",
                "sample_rate": str(self.config.sample_rate),
                "container": "none",
            },
            json={"text": item.text},
        )


# The linear16 sample rates Deepgram offers.
SPEC = ProviderSpec(
    "deepgram", DeepgramProvider, rates=(8000, 16000, 24000, 32000, 48000), reads_numbers=True
)
