"""kind = "azure": Azure AI Speech's text to speech REST API over aiohttp, as docs/upstreams.md,
"Providers", has it."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from synth.engine import SynthesisItem
from synth.providers.base import PCM_RATES, ProviderSpec
from synth.providers.http_api import HttpCall, HttpProvider, voice_language


class AzureProvider(HttpProvider):
    """The provider of Azure's text to speech REST endpoint."""

    speeds = (0.5, 2.0)
    speed_refusal = "Azure speaks at 0.5 to 2 times the normal rate"

    def request(self, item: SynthesisItem) -> HttpCall:
        lang = voice_language(item.voice)
        # Azure's raw PCM format names a rate in kHz where it can: raw-24khz-16bit-mono-pcm,
        # raw-22050hz-16bit-mono-pcm.
        rate = self.config.sample_rate
        hz = f"{rate // 1000}khz" if rate % 1000 == 0 else f"{rate}hz"
        text = escape(item.text)
        if item.speed != 1.0:
            text = f"<prosody rate={quoteattr(f'{item.speed:g}')}>{text}</prosody>"
        ssml = (
            f"<speak version='1.0' xml:lang={quoteattr(lang)}>"
            f"<voice name={quoteattr(item.voice)}>{text}</voice></speak>"
        )
        return HttpCall(
            url=f"{self.config.base_url}/cognitiveservices/v1",
            headers={
                "Ocp-Apim-Subscription-Key": self.api_key,
                "Content-Type": "application/ssml+xml",
                "X-Microsoft-OutputFormat": f"raw-{hz}-16bit-mono-pcm",
                "User-Agent": "voxgate",
            },
            data=ssml.encode(),
        )


SPEC = ProviderSpec("azure", AzureProvider, rates=PCM_RATES, reads_numbers=True)
