"""Clients of remote TTS providers, one module per API kind, and :data:`SPECS`, the one table of
kinds: each module declares its kind's :class:`~synth.providers.base.ProviderSpec` (``SPEC``), and
a new kind is its module plus its line in the table below (and its name in the import). A kind's
SDK is imported only when an entry of that kind is built."""

from synth.providers import (
    azure_api,
    cartesia_api,
    deepgram_api,
    elevenlabs_api,
    google_api,
    openai_api,
    polly_api,
    wyoming_tcp,
)
from synth.providers.base import ProviderSpec

SPECS: dict[str, ProviderSpec] = {
    spec.kind: spec
    for spec in (
        openai_api.SPEC,
        elevenlabs_api.SPEC,
        azure_api.SPEC,
        google_api.SPEC,
        polly_api.SPEC,
        cartesia_api.SPEC,
        deepgram_api.SPEC,
        wyoming_tcp.SPEC,
    )
}
