"""Telephony encodings by file extension, and other encodings of stored audio by content address.

PBXs choose how to play a URL from its extension (Asterisk's res_http_media_cache, FreeSWITCH's
mod_http_cache), so each extension here names one exact encoding: Asterisk's ``wav`` is PCM16
mono 8 kHz only, ``wav16`` the same at 16 kHz, ``ulaw``/``alaw`` headerless G.711, ``sln*``
headerless 16-bit PCM, ``gsm`` raw GSM 06.10 frames, ``g722`` raw G.722. The Content-Type of each
follows IANA where a registration fits, and the players' own lists where they differ (see
docs/telephony.md for the table and why).

:class:`Transcoder` makes such an encoding of audio already stored under a content address: it
decodes the masters the stored rendition names (:class:`cache.entry.EntryMeta`), joins them as
the rendition did, and encodes. That is a transcode, never a synthesis; the result is stored
under a key derived from the same format-free master as a request for that encoding would use,
so ``/v1/audio/{key}.ulaw`` and ``/v1/say/{voice}/{text}.ulaw`` share one entry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cache.entry import Entry
from cache.keys import rendition_key
from cache.singleflight import SingleFlight
from cache.store import TieredStore
from gateway.errors import BadRequest, NotFound
from gateway.memo import BoundedMemo
from gateway.speech.assembly import RenderShare, join_parts
from gateway.speech.ledger import Ledger
from gateway.speech.request import SpeechResult
from gateway.speech.takes import Take, accept_take
from synth import audio
from synth.engine import Engine

log = logging.getLogger("voxgate.speech.telephony")


@dataclass(frozen=True)
class Extension:
    """One URL extension: the encoding it names, its rate, and how it is labelled."""

    name: str
    fmt: audio.AudioFormat
    rate: int | None  # None: the voice's own rate
    content_type: str
    # The extension Asterisk plays this encoding under (export names files with it); None when
    # core Asterisk has no format module for it.
    asterisk: str | None
    summary: str


_F = audio.FORMATS
_ROWS = [
    # audio/x-wav: the one WAV type that Asterisk (format_wav), FreeSWITCH (mime.types),
    # Twilio and jambonz all know; FreeSWITCH's mime.types has no audio/wav.
    Extension("wav", _F["wav"], 8000, "audio/x-wav", "wav", "PCM16 mono 8 kHz WAV"),
    # Not audio/(x-)wav: Asterisk reads the Content-Type first, and would take the file as
    # its 8 kHz-only `wav` format. RFC 2361's audio/vnd.wave maps to no Asterisk format, so
    # it goes on to the `.wav16` extension.
    Extension("wav16", _F["wav"], 16000, "audio/vnd.wave", "wav16", "PCM16 mono 16 kHz WAV"),
    Extension("ulaw", _F["ulaw"], 8000, "audio/basic", "ulaw", "raw G.711 u-law 8 kHz"),
    Extension("ul", _F["ulaw"], 8000, "audio/basic", "ulaw", "raw G.711 u-law 8 kHz"),
    Extension("pcmu", _F["ulaw"], 8000, "audio/PCMU", "ulaw", "raw G.711 u-law 8 kHz"),
    Extension("alaw", _F["alaw-raw"], 8000, "audio/x-alaw-basic", "alaw", "raw G.711 A-law 8 kHz"),
    Extension("al", _F["alaw-raw"], 8000, "audio/x-alaw-basic", "alaw", "raw G.711 A-law 8 kHz"),
    Extension("pcma", _F["alaw-raw"], 8000, "audio/PCMA", "alaw", "raw G.711 A-law 8 kHz"),
    # Little-endian samples (Asterisk's slin, jambonz's audio/l16), unlike RFC 2586's
    # network order: the label is the players' convention.
    Extension("sln", _F["pcm"], 8000, "audio/L16;rate=8000", "sln", "raw s16le 8 kHz"),
    Extension("raw", _F["pcm"], 8000, "audio/L16;rate=8000", "sln", "raw s16le 8 kHz"),
    Extension("sln16", _F["pcm"], 16000, "audio/L16;rate=16000", "sln16", "raw s16le 16 kHz"),
    Extension("sln24", _F["pcm"], 24000, "audio/L16;rate=24000", "sln24", "raw s16le 24 kHz"),
    Extension("sln48", _F["pcm"], 48000, "audio/L16;rate=48000", "sln48", "raw s16le 48 kHz"),
    Extension("gsm", _F["gsm"], 8000, "audio/gsm", "gsm", "raw GSM 06.10, 33-byte frames"),
    Extension("g722", _F["g722"], 16000, "audio/G722", "g722", "raw G.722, 64 kbit/s"),
    # Core Asterisk has no MP3 format (format_mp3 is an add-on).
    Extension("mp3", _F["mp3"], None, "audio/mpeg", None, "MP3 at the voice's rate"),
]
EXTENSIONS: dict[str, Extension] = {e.name: e for e in _ROWS if e.fmt.name in _F}


def extension(name: str, param: str = "ext") -> Extension:
    """The extension called ``name``, or a 400 listing the supported ones."""
    found = EXTENSIONS.get(name)
    if found is None:
        raise BadRequest(
            f"unsupported extension '.{name[:16]}'; supported: {', '.join(EXTENSIONS)}",
            param=param,
            code="unsupported_format",
        )
    return found


class Transcoder:
    """Other encodings of audio stored under a content address (a transcode of its masters)."""

    def __init__(
        self,
        store: TieredStore,
        models: Mapping[str, Engine],
        ledger: Ledger,
        encode_pool: concurrent.futures.Executor,
        render_share: RenderShare | None = None,
    ) -> None:
        self.store = store
        self.engines = models
        self.ledger = ledger
        self.encode_pool = encode_pool
        # (source key, extension) -> derived key: a repeated URL costs one dict lookup before
        # the store, and a conditional request (If-None-Match) none.
        self._derived: BoundedMemo[tuple[str, str], str] = BoundedMemo(4096)
        self._flight: SingleFlight[Entry] = SingleFlight()
        # A client's share of the transcodes made at once (the service's; None: no limit).
        self.render_share = render_share

    def known_key(self, key: str, ext: Extension) -> str | None:
        """The derived key of ``key`` in ``ext`` if it was computed before (no I/O)."""
        return self._derived.get((key, ext.name))

    async def get(self, key: str, ext: Extension) -> SpeechResult | None:
        """``ext``'s encoding of the audio under ``key``: stored, or transcoded now and stored
        (unpinned, even when the source is pinned: only a catalogue pins, within its quota),
        ``hit`` (no synthesis either way) unless it joined a transcode in flight. None when
        nothing is stored under ``key``; a 404 when it cannot be made without a synthesis."""
        known = self.known_key(key, ext)
        if known is not None:
            entry = await self.store.find(known)
            if entry is not None:
                return SpeechResult(entry, known, "hit")
        source = await self.store.find(key)
        if source is None:
            return None
        # Derived from the rendition's format-free master when it names one (the key a speech
        # request for that encoding computes), else from ``key`` (stored before masters were).
        meta, engine = source.meta, self.engines.get(source.meta.model)
        base_rate = engine.sample_rate if engine is not None else meta.sample_rate
        rate = audio.output_rate(ext.fmt, base_rate, ext.rate)
        derived = rendition_key(meta.master or key, fmt=ext.fmt.name, sample_rate=rate)
        self._derived.put((key, ext.name), derived)
        entry = await self.store.find(derived)
        if entry is not None:
            return SpeechResult(entry, derived, "hit")
        share = self.render_share
        release = share.take() if share is not None and not self._flight.running(derived) else None
        try:
            made, leader = await self._flight.do(
                derived, lambda: self._make(source, ext, rate, derived)
            )
        finally:
            if release is not None:
                release()
        return SpeechResult(made, derived, "hit" if leader else "coalesced")

    async def _make(self, source: Entry, ext: Extension, rate: int, key: str) -> Entry:
        meta = source.meta
        pcm, src_rate = await self._audio_of(source)
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(
            self.encode_pool, audio.render, pcm, src_rate, ext.fmt, rate
        )
        entry = Entry.create(
            data,
            content_type=ext.fmt.content_type,
            fmt=ext.fmt.name,
            sample_rate=rate,
            model=meta.model,
            voice=meta.voice,
            duration_s=len(pcm) / src_rate,
            master=meta.master,
            parts=meta.parts,
            pause_ms=meta.pause_ms,
            gaps_ms=meta.gaps_ms,
            trims=meta.trims,
            # Times do not depend on the encoding: the same audio has the same marks.
            marks=meta.marks,
        )
        # (A transcode's text is its source's: the entry does not carry it.)
        await accept_take(self.store, key, entry, Take(pcm, src_rate, "", None))
        self.ledger.transcoded(ext.fmt.name)
        return entry

    async def _audio_of(self, source: Entry) -> tuple[audio.FloatPCM, int]:
        """The audio of ``source`` as float PCM: its masters joined (as the rendition joined
        them), else the source itself when it is lossless."""
        meta = source.meta
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(*(self.store.find(k) for k in meta.parts))
        if parts and all(p is not None for p in parts):
            decoded = await asyncio.gather(
                *(
                    loop.run_in_executor(self.encode_pool, audio.decode_master, p.audio)
                    for p in parts
                    if p is not None
                ),
                return_exceptions=True,
            )
            # A master that does not decode is corrupt: deleted, so the next speech request for
            # it synthesizes it anew (this one falls back as if it were gone).
            bad = []
            for k, d in zip(meta.parts, decoded, strict=True):
                if isinstance(d, audio.UndecodableAudio):
                    bad.append(k)
                elif isinstance(d, BaseException):
                    raise d
            for k in bad:
                log.warning("stored master deleted key=%s: it does not decode", k)
                await self.store.delete(k)
            if not bad:
                pcms = [d for d in decoded if not isinstance(d, BaseException)]
                rate = pcms[0][1]
                found = [pcm for pcm, _ in pcms]
                return join_parts(found, rate, meta.gaps_ms, meta.trims, meta.pause_ms), rate
        if meta.format in ("wav", "flac", "pcm"):
            try:
                return await loop.run_in_executor(self.encode_pool, _decode_lossless, source)
            except audio.UndecodableAudio:
                log.warning("stored audio does not decode; treated as gone")
        raise NotFound(
            "the masters of this audio are no longer stored and it is lossy: ask for it again "
            "through /v1/audio/speech or a say URL (that synthesizes it once more)",
            param="key",
            code="master_not_stored",
        )


def _decode_lossless(entry: Entry) -> tuple[audio.FloatPCM, int]:
    if entry.meta.format == "pcm":
        pcm = np.frombuffer(entry.audio, dtype="<i2").astype(np.float32) / np.float32(32768.0)
        return pcm, entry.meta.sample_rate
    return audio.decode_master(entry.audio)  # mono lossless audio, checked as a master is
