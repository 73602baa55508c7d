"""kind = "wyoming": a Wyoming TTS server over TCP, through the ``wyoming`` package's client, as
docs/upstreams.md, "Providers" and "Streaming pass-through", has it."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

import numpy as np
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize, SynthesizeVoice

from synth.engine import Audio, SynthesisItem
from synth.providers.base import (
    MIB,
    ProviderConfig,
    ProviderError,
    ProviderSpec,
    answer_seconds,
    pcm16_audio,
    provider_message,
    refused_take,
    too_large,
)
from synth.takecheck import MAX_RATE, MIN_RATE


class WyomingProvider:
    """The :class:`~synth.providers.base.Provider` of a Wyoming TTS server (which takes no
    credentials: ``api_key`` and ``environ`` are unused)."""

    # The protocol's synthesize has no speed (the runner refuses another before any call).
    speeds = (1.0, 1.0)
    speed_refusal = "a Wyoming server has no speed; ask for speed 1 (and no SSML rate)"

    def __init__(self, config: ProviderConfig, api_key: str, environ: Mapping[str, str]) -> None:
        self.config = config
        parts = urlsplit(config.base_url)
        self.host = parts.hostname or ""
        self.port = parts.port or 0
        self.max_bytes = config.max_audio_mb * MIB

    async def synthesize(self, item: SynthesisItem, timeout_s: float) -> Audio:
        chunks: list[bytes] = []
        size = 0
        rate = 0
        seconds = answer_seconds(item, self.config.language)
        try:
            async with AsyncTcpClient(self.host, self.port) as client:
                voice = SynthesizeVoice(name=item.voice)
                await client.write_event(Synthesize(text=item.text, voice=voice).event())
                while True:
                    event = await client.read_event()
                    if event is None:
                        raise ProviderError(
                            "connection", "the server closed before audio-stop", retryable=True
                        )
                    if AudioChunk.is_type(event.type):
                        chunk = AudioChunk.from_event(event)
                        if chunk.width != 2:
                            raise ProviderError(
                                "bad_reply", f"{8 * chunk.width}-bit audio, not 16-bit"
                            )
                        data = chunk.audio
                        if chunk.channels > 1:
                            frames = np.frombuffer(data, dtype="<i2").reshape(-1, chunk.channels)
                            data = np.ascontiguousarray(frames[:, 0]).tobytes()
                        if not MIN_RATE <= chunk.rate <= MAX_RATE:
                            raise refused_take(
                                "bad_rate", f"audio at {chunk.rate} Hz (8-48 kHz is speech)"
                            )
                        size += len(data)
                        if size > self.max_bytes:
                            raise too_large(self.config)
                        if size > seconds * chunk.rate * 2:
                            raise refused_take(
                                "too_long", f"more audio than its text can take ({seconds:.0f} s)"
                            )
                        if rate and chunk.rate != rate:
                            raise ProviderError(
                                "bad_reply", f"the audio's rate changed from {rate} to {chunk.rate}"
                            )
                        rate = chunk.rate
                        chunks.append(data)
                        if item.sink is not None and rate == self.config.sample_rate and data:
                            item.sink(data)
                    elif AudioStop.is_type(event.type):
                        break
                    elif Error.is_type(event.type):
                        error = Error.from_event(event)
                        raise ProviderError("server", provider_message(error.text))
        except OSError as exc:  # refused, reset: ConnectionError is one
            raise ProviderError("connection", type(exc).__name__, retryable=True) from None
        data = b"".join(chunks)
        if not data or len(data) % 2:
            raise ProviderError("bad_reply", f"{len(data)} bytes of 16-bit audio")
        return pcm16_audio(data, rate)

    async def close(self) -> None:
        """Nothing held between calls: one connection per call."""


# A Wyoming server sends pcm at the rate its chunks name.
SPEC = ProviderSpec("wyoming", WyomingProvider, scheme="tcp")
