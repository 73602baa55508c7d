"""kind = "elevenlabs": ElevenLabs' text-to-speech API over aiohttp, as docs/upstreams.md,
"Providers", has it (and why not their SDK)."""

from __future__ import annotations

import json
from urllib.parse import quote

from synth.engine import SynthesisItem
from synth.providers.base import PCM_RATES, ProviderSpec
from synth.providers.http_api import HttpCall, HttpProvider


class ElevenLabsProvider(HttpProvider):
    """The provider of ElevenLabs' text-to-speech endpoint."""

    refusal_statuses = frozenset({404})

    def request(self, item: SynthesisItem) -> HttpCall:
        c = self.config
        settings: dict[str, object] = dict(c.voice_settings)
        if item.speed != 1.0:
            settings["speed"] = item.speed
        body: dict[str, object] = {"text": item.text, "model_id": c.model}
        if settings:
            body["voice_settings"] = settings
        return HttpCall(
            url=f"{c.base_url}/v1/text-to-speech/{quote(item.voice, safe='')}",
            headers={"xi-api-key": self.api_key, "Accept": "audio/pcm"},
            params={"output_format": f"pcm_{c.sample_rate}"},
            json=body,
        )

    def error_message(self, body: bytes) -> str:
        """The message of an ElevenLabs error body, ``{"detail": {"status", "message"}}`` or a
        422's ``{"detail": [{"msg"}]}``, else the raw text."""
        try:
            value = json.loads(body)
        except ValueError:
            return body[:300].decode("utf-8", "replace")
        detail = value.get("detail") if isinstance(value, dict) else None
        if isinstance(detail, dict):
            return str(detail.get("message") or detail.get("status") or detail)
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            return "; ".join(str(d.get("msg", d)) for d in detail[:3])
        return str(detail if detail is not None else value)


# output_format pcm_<rate> at these rates; voice_settings are this kind's alone.
SPEC = ProviderSpec(
    "elevenlabs",
    ElevenLabsProvider,
    rates=PCM_RATES,
    model="",
    owns=("voice_settings",),
    reads_numbers=True,
)
