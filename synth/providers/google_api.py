"""kind = "google": Google Cloud Text-to-Speech's REST API over aiohttp, as docs/upstreams.md,
"Providers", has it (API keys only)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json

import aiohttp

from synth.engine import Audio, SynthesisItem
from synth.providers.base import (
    MAX_BYTES_PER_S,
    MAX_WAV_HEADER,
    MIB,
    ProviderSpec,
    answer_seconds,
    refused_take,
    wav_audio,
)
from synth.providers.http_api import HttpCall, HttpProvider, voice_language


class GoogleProvider(HttpProvider):
    """The provider of Google Cloud Text-to-Speech's ``text:synthesize``."""

    error_paths = (("error", "message"),)
    speeds = (0.25, 4.0)
    speed_refusal = "Google speaks at 0.25 to 4 times the normal rate"

    def request(self, item: SynthesisItem) -> HttpCall:
        audio_config: dict[str, object] = {
            "audioEncoding": "LINEAR16",
            "sampleRateHertz": self.config.sample_rate,
        }
        if item.speed != 1.0:
            audio_config["speakingRate"] = item.speed
        return HttpCall(
            url=f"{self.config.base_url}/v1/text:synthesize",
            headers={"X-Goog-Api-Key": self.api_key},
            json={
                "input": {"text": item.text},
                "voice": {"languageCode": voice_language(item.voice), "name": item.voice},
                "audioConfig": audio_config,
            },
        )

    async def answer(self, item: SynthesisItem, resp: aiohttp.ClientResponse) -> Audio:
        # Base64 of a WAV in JSON: bounded by the text's longest plausible take as such.
        seconds = answer_seconds(item, voice_language(item.voice))
        limit = min(
            self.config.max_audio_mb * MIB,
            (MAX_WAV_HEADER + int(seconds * MAX_BYTES_PER_S)) * 4 // 3,
        )
        pieces: list[bytes] = []
        size = 0
        async for piece in resp.content.iter_chunked(64 * 1024):
            size += len(piece)
            if size > limit:
                raise refused_take(
                    "too_long", f"the answer is longer than its text can take ({seconds:.0f} s)"
                )
            pieces.append(piece)
        return await asyncio.to_thread(self.audio, b"".join(pieces))

    def audio(self, data: bytes) -> Audio:
        """The WAV in the JSON answer ``data`` (blocking)."""
        try:
            content = json.loads(data)["audioContent"]
            wav = base64.b64decode(content, validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise refused_take("not_audio", "no base64 audioContent in the answer") from None
        return wav_audio(wav)


# Any rate; the audio comes base64 in one JSON body, so it cannot be passed on in pieces.
SPEC = ProviderSpec("google", GoogleProvider, whole_answer=True, reads_numbers=True)
