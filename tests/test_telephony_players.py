"""What PBXs and hosted players do with voxgate's URLs, emulated from their sources and docs, for
a content address (``/v1/audio/{key}.{ext}``) and a say URL (``/v1/say/{voice}/{text}.{ext}``);
every extension decodes with ffmpeg and lasts as long as its master; a repeated say URL is a hit.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import io
import re
import time
import wave
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from aiohttp.test_utils import TestClient

from cache.entry import Entry
from gateway.api.readings import read_numbers
from gateway.http import keys
from gateway.runtime.settings import Settings
from gateway.speech.telephony import EXTENSIONS
from metrics import Metrics
from tests.conftest import GatewayFactory
from tests.support import CountingEngine
from tests.test_formats import EXPECTED, ffmpeg_samples, ffprobe, raw

TEXT = "Press one for billing. Press two for sales."

# ffmpeg's reading of each extension (raw ones need -f), the codec it must report, and one codec
# frame in samples (the allowed length difference).
DECODE: dict[str, tuple[str, str, int]] = {
    "wav": EXPECTED["wav"],
    "wav16": EXPECTED["wav"],
    **{ext: raw("mulaw", 8000, "pcm_mulaw") for ext in ("ulaw", "ul", "pcmu")},
    **{ext: raw("alaw", 8000, "pcm_alaw") for ext in ("alaw", "al", "pcma")},
    **{ext: raw("s16le", 8000, "pcm_s16le") for ext in ("sln", "raw")},
    **{f"sln{k}": raw("s16le", k * 1000, "pcm_s16le") for k in (16, 24, 48)},
    "gsm": EXPECTED["gsm"],
    "g722": EXPECTED["g722"],
    "mp3": EXPECTED["mp3"],
}


def say_url(text: str, ext: str, voice: str = "joe") -> str:
    return f"/v1/say/{quote(voice, safe='')}/{quote(text, safe='')}.{ext}"


async def stored_key(client: TestClient, text: str = TEXT, fmt: str = "mp3") -> tuple[str, float]:
    """A content address voxgate returned (a lossy MP3 rendition) and the master's duration."""
    r = await client.post(
        "/v1/audio/speech",
        # Whole: the WAV header's frame count (a streamed WAV's says "to the end").
        json={
            "model": "tts-1",
            "input": text,
            "voice": "alloy",
            "response_format": "wav",
            "stream": False,
        },
    )
    assert r.status == 200
    with wave.open(io.BytesIO(await r.read())) as w:
        master_s = w.getnframes() / w.getframerate()
    r = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": text, "voice": "alloy", "response_format": fmt},
    )
    assert r.status == 200
    return r.headers["X-Audio-Key"], master_s


def max_age(headers: dict[str, str] | object) -> int:
    value = headers["Cache-Control"]  # type: ignore[index]
    found = re.search(r"(?:^|[ ,])max-age=(\d+)", value)
    assert found, value
    return int(found.group(1))


# ---- every extension decodes, lasts as long as its master, costs no synthesis -----------------


async def test_every_extension_decodes_with_the_masters_duration_and_no_synthesis(
    gateway: GatewayFactory, counting_engine: CountingEngine, tmp_path: Path
) -> None:
    assert set(DECODE) == set(EXTENSIONS)
    client = await gateway()
    key, master_s = await stored_key(client)
    assert counting_engine.items == 2  # two sentences, synthesized once
    for name, ext in EXTENSIONS.items():
        for url in (f"/v1/audio/{key}.{name}", say_url(TEXT, name)):
            r = await client.get(url)
            assert r.status == 200, (url, await r.text())
            assert r.headers["Content-Type"] == ext.content_type
            data = await r.read()
            demux, codec, frame = DECODE[name]
            stream = ffprobe(data, tmp_path, f"{name}.bin", demux)
            assert stream["codec_name"] == codec, name
            assert int(stream["channels"]) == 1
            rate = int(stream["sample_rate"])
            assert rate == (ext.rate or counting_engine.sample_rate), name
            samples = ffmpeg_samples(data, tmp_path, f"{name}.bin", demux)
            assert abs(samples - master_s * rate) <= frame, (name, samples, master_s * rate)
    # Every encoding, by both addresses, came from the two stored sentence masters.
    assert counting_engine.items == 2


async def test_the_content_address_and_the_say_url_share_one_entry(
    gateway: GatewayFactory, metrics: Metrics
) -> None:
    client = await gateway()
    key, _ = await stored_key(client)
    by_key = await client.get(f"/v1/audio/{key}.ulaw")
    by_say = await client.get(say_url(TEXT, "ulaw"))
    assert by_key.headers["X-Audio-Key"] == by_say.headers["X-Audio-Key"]
    assert await by_key.read() == await by_say.read()
    assert by_say.headers["X-Cache"] == "HIT"  # the transcode made for the first URL
    # `pcmu` and `ul` name the same encoding: the same stored bytes, their own Content-Type.
    pcmu = await client.get(f"/v1/audio/{key}.pcmu")
    assert pcmu.headers["X-Audio-Key"] == by_key.headers["X-Audio-Key"]
    assert pcmu.headers["Content-Type"] == "audio/PCMU"


# ---- Asterisk ------------------------------------------------------------------------------------

# format modules that declare MIME types (only format_wav does: "audio/wav|audio/x-wav"); every
# other format is found by its extension.
ASTERISK_MIME = {"audio/wav": "wav", "audio/x-wav": "wav"}
# The extensions Asterisk's format modules register (format_wav: wav, wav16; format_pcm:
# pcm|ulaw|ul|mu|ulw, alaw|al|alw; format_sln: sln|raw, sln12, sln16, sln24, sln32, sln44,
# sln48, sln96, sln192; format_gsm: gsm; format_g722: g722).
ASTERISK_EXTENSIONS = {
    "wav": "wav",
    "wav16": "wav16",
    "ulaw": "ulaw",
    "ul": "ulaw",
    "mu": "ulaw",
    "alaw": "alaw",
    "al": "alaw",
    "sln": "slin",
    "raw": "slin",
    "sln16": "slin16",
    "sln24": "slin24",
    "sln48": "slin48",
    "gsm": "gsm",
    "g722": "g722",
}


def asterisk_format(url: str, content_type: str | None, *, content_type_first: bool) -> str | None:
    """The format Asterisk's res_http_media_cache picks for a downloaded URL.

    From asterisk/asterisk res/res_http_media_cache.c ``bucket_file_set_extension``: older
    releases try (1) the text after the last "." of the whole URL, (2) the Content-Type's
    extension (``ast_get_extension_for_mime_type``, parameters stripped by
    ``normalize_content_type_header``), (3) the extension of the parsed URL's path; newer ones
    try the Content-Type first, then the path. Only format_wav declares MIME types.
    """

    def from_type() -> str | None:
        if content_type is None:
            return None
        return ASTERISK_MIME.get(content_type.split(";")[0].strip().lower())

    def tail(text: str) -> str | None:
        _, dot, ext = text.rpartition(".")
        return ext if dot and "/" not in ext else None

    path = urlsplit(url).path
    order = (
        [from_type, lambda: tail(path)]
        if content_type_first
        else [lambda: tail(url), from_type, lambda: tail(path)]
    )
    for attempt in order:
        ext = attempt()
        if ext is not None:
            return ASTERISK_EXTENSIONS.get(ext)
    return None


def asterisk_wav_ok(data: bytes, ext: str) -> bool:
    """format_wav.c ``check_header``: format tag 1 (PCM) only, mono, 16-bit, 8000 Hz for `wav`
    and 16000 Hz only for `wav16`. (Python's ``wave`` reads only tag 1, as format_wav does.)"""
    try:
        with wave.open(io.BytesIO(data)) as w:
            rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
    except wave.Error:
        return False
    return channels == 1 and width == 2 and rate == (16000 if ext == "wav16" else 8000)


@pytest.mark.parametrize("content_type_first", [False, True])
async def test_asterisk_playback_plays_each_url(
    gateway: GatewayFactory, content_type_first: bool
) -> None:
    """Asterisk ``Playback(http://...)``: app_playback.c splits its argument on "&" (``strsep``),
    so a playable URL holds none; res_http_media_cache picks the format (see
    :func:`asterisk_format`); format_wav accepts only PCM16 mono 8 kHz (16 kHz as wav16)."""
    client = await gateway()
    key, _ = await stored_key(client)
    base = str(client.make_url(""))
    for name in ("wav", "wav16", "ulaw", "alaw", "sln", "sln16", "gsm", "g722"):
        for path in (f"/v1/audio/{key}.{name}", say_url("Press one. Or hold, please.", name)):
            url = base + path
            assert url.split("&") == [url]  # Playback sees one file
            r = await client.get(path)
            assert r.status == 200
            data = await r.read()
            fmt = asterisk_format(url, r.headers["Content-Type"], content_type_first=True)
            if not content_type_first:
                fmt = asterisk_format(url, r.headers["Content-Type"], content_type_first=False)
            assert fmt == ASTERISK_EXTENSIONS[name], (name, r.headers["Content-Type"])
            if name.startswith("wav"):
                assert asterisk_wav_ok(data, name), name
    # A `wav` at the voice's 22,050 Hz fails format_wav.
    r = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "wav"},
    )
    assert not asterisk_wav_ok(await r.read(), "wav")


async def test_asterisk_revalidates_with_head_and_if_none_match(gateway: GatewayFactory) -> None:
    """res_http_media_cache keeps ETag, Cache-Control, Last-Modified and Expires; a file is fresh
    for max-age seconds (else stale at once); revalidation is a HEAD with If-None-Match, and a
    304 keeps the cached file (``bucket_file_expired``, ``bucket_file_update``)."""
    client = await gateway()
    key, _ = await stored_key(client)
    for path in (f"/v1/audio/{key}.ulaw", say_url("Goodbye.", "wav")):
        first = await client.get(path)
        body = await first.read()
        assert max_age(first.headers) > 0
        etag = first.headers["ETag"]
        head = await client.head(path)
        assert head.status == 200
        assert head.headers["ETag"] == etag
        assert head.headers["Content-Length"] == str(len(body))
        assert head.headers["Cache-Control"] == first.headers["Cache-Control"]
        assert await head.read() == b""
        again = await client.head(path, headers={"If-None-Match": etag})
        assert again.status == 304
        assert again.headers["ETag"] == etag
        assert await again.read() == b""
        stale = await client.head(path, headers={"If-None-Match": '"0000"'})
        assert stale.status == 200


# ---- FreeSWITCH ----------------------------------------------------------------------------------

# conf/vanilla/mime.types: the audio types FreeSWITCH maps to extensions (no audio/wav).
FREESWITCH_MIME = {
    "audio/x-wav": "wav",
    "audio/basic": "au",
    "audio/mpeg": "mpga",
    "audio/x-aiff": "aif",
}


def freeswitch_extension(url: str, content_type: str | None) -> str | None:
    """The extension mod_http_cache gives a cached URL (signalwire/freeswitch
    src/mod/applications/mod_http_cache/mod_http_cache.c, ``find_extension`` and
    ``cached_url_set_extension_from_content_type``): scanning back from the URL's end until a
    "/" or "\\", the length resets at "?" or "#", and the first "." found ends the scan; the
    extension is that many characters after it. With none, the Content-Type through
    mime.types (``switch_core_mime_type2ext``)."""
    length = 0
    for i in range(len(url) - 1, 0, -1):
        ch = url[i]
        if ch in "/\\":
            break
        if ch in "?#":
            length = 0
        elif ch == ".":
            if length:
                return url[i + 1 : i + 1 + length]
            break
        else:
            length += 1
    return FREESWITCH_MIME.get((content_type or "").split(";")[0]) if content_type else None


async def test_freeswitch_takes_the_extension_from_the_path_and_caches_by_max_age(
    gateway: GatewayFactory,
) -> None:
    """FreeSWITCH ``playback http_cache://...``: the extension comes from the end of the path
    (see :func:`freeswitch_extension`), and the file is kept only for ``max-age`` (no ETag
    revalidation; default-max-age otherwise)."""
    client = await gateway()
    key, _ = await stored_key(client)
    base = str(client.make_url(""))
    for path, want in (
        (f"/v1/audio/{key}.wav", "wav"),
        (say_url("Please hold.", "wav"), "wav"),
        (say_url("Please hold.", "ulaw"), "ulaw"),
    ):
        r = await client.get(path)
        assert r.status == 200
        assert freeswitch_extension(base + path, r.headers["Content-Type"]) == want
        assert max_age(r.headers) > 0
    # Why the path form: a "." in the query's text makes a bogus extension of what follows it.
    bogus = base + "/synthesize?text=Please%20hold.&format=wav"
    assert freeswitch_extension(bogus, None) == "&format=wav"
    assert freeswitch_extension(base + "/x.wav?v=1", None) == "wav"
    # And the WAV type FreeSWITCH's mime.types knows (were the extension missing).
    r = await client.get(f"/v1/audio/{key}.wav")
    assert FREESWITCH_MIME.get(r.headers["Content-Type"]) == "wav"


# ---- Twilio --------------------------------------------------------------------------------------

# twilio.com/docs/api/2008-08-01/twiml/play: the MIME types <Play> accepts (else error 13420).
TWILIO_TYPES = {
    "audio/mpeg",
    "audio/wav",
    "audio/wave",
    "audio/x-wav",
    "audio/aiff",
    "audio/x-aifc",
    "audio/x-aiff",
    "audio/x-gsm",
    "audio/gsm",
    "audio/ulaw",
}


async def test_twilio_play_accepts_the_type_and_revalidates(gateway: GatewayFactory) -> None:
    """Twilio ``<Play>``: the Content-Type must be in its list (twilio.com/docs/api/2008-08-01/
    twiml/play); it caches by max-age and revalidates with ETag or Last-Modified, expecting a
    304 (support.twilio.com/hc/en-us/articles/223180508)."""
    client = await gateway()
    key, _ = await stored_key(client)
    for name in ("wav", "mp3", "gsm"):
        for path in (f"/v1/audio/{key}.{name}", say_url("Thanks for calling.", name)):
            r = await client.get(path)
            assert r.status == 200
            assert r.headers["Content-Type"] in TWILIO_TYPES, (name, r.headers["Content-Type"])
            assert max_age(r.headers) > 0
            by_tag = await client.get(path, headers={"If-None-Match": r.headers["ETag"]})
            assert by_tag.status == 304
            modified = r.headers["Last-Modified"]
            assert email.utils.parsedate_to_datetime(modified).timestamp() <= time.time()
            by_date = await client.get(path, headers={"If-Modified-Since": modified})
            assert by_date.status == 304
            assert by_date.headers["ETag"] == r.headers["ETag"]
            earlier = email.utils.formatdate(
                email.utils.parsedate_to_datetime(modified).timestamp() - 60, usegmt=True
            )
            changed = await client.get(path, headers={"If-Modified-Since": earlier})
            assert changed.status == 200
            assert await changed.read() == await r.read()


# ---- caching on every player GET, and the say URL's own rules --------------------------------------


async def test_synthesis_urls_carry_max_age_etag_last_modified(
    gateway: GatewayFactory, settings: Settings
) -> None:
    client = await gateway(settings=settings.replace(synthesis_max_age_s=600, audio_max_age_s=99))
    for path in (
        "/synthesize?text=Hello%20there.",
        "/api/tts?text=Hello%20there.",
        say_url("Hello there.", "wav"),
    ):
        r = await client.get(path)
        assert r.status == 200, path
        assert r.headers["Cache-Control"] == "public, max-age=600"
        assert r.headers["ETag"] == f'"{hashlib.sha256(await r.read()).hexdigest()[:32]}"'
        assert email.utils.parsedate_to_datetime(r.headers["Last-Modified"])
        head = await client.head(path)
        assert head.status == 200
        assert await head.read() == b""
        for name in ("Cache-Control", "ETag", "Last-Modified", "Content-Type", "Content-Length"):
            assert head.headers[name] == r.headers[name], (path, name)
        cached = await client.get(path, headers={"If-None-Match": r.headers["ETag"]})
        assert cached.status == 304
        assert cached.headers["Cache-Control"] == "public, max-age=600"
    key = r.headers["X-Audio-Key"]
    stored = await client.get(f"/v1/audio/{key}")
    assert stored.headers["Cache-Control"] == "public, max-age=99"  # not immutable: see ETag
    assert "Last-Modified" in stored.headers
    # A POST's answer is not a URL a player keeps.
    posted = await client.post("/api/tts", data={"text": "Hello there."})
    assert posted.status == 200
    assert "Cache-Control" not in posted.headers


async def test_a_repeated_say_url_is_a_hit_with_identical_bytes(
    gateway: GatewayFactory, counting_engine: CountingEngine, metrics: Metrics
) -> None:
    client = await gateway()
    path = say_url("Your call is important to us.", "wav")
    first = await client.get(path)
    assert first.headers["X-Cache"] == "MISS"
    body = await first.read()
    for _ in range(3):
        again = await client.get(path)
        assert again.headers["X-Cache"] == "HIT"
        assert await again.read() == body
    assert counting_engine.items == 1
    # The alias names the same voice: the same entry.
    alias = await client.get(say_url("Your call is important to us.", "wav", voice="alloy"))
    assert alias.headers["X-Audio-Key"] == first.headers["X-Audio-Key"]


async def test_slash_percent_and_dot_inside_the_text(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    text = "Save 50% on 1/2 of it. Press #."
    path = say_url(text, "ulaw")
    assert "%2F" in path and "%25" in path and "%23" in path
    r = await client.get(path)
    assert r.status == 200, await r.text()
    # (Read by the numbers front end, auto's for Piper: the reading of the text as written.)
    assert read_numbers("Save 50% on 1/2 of it.", "en") in counting_engine.texts
    # The extension is what follows the last "." of the segment: the text may hold dots.
    r = await client.get("/v1/say/joe/Press%202.5%20now..wav")
    assert r.status == 200
    assert read_numbers("Press 2.5 now.", "en") in counting_engine.texts


@pytest.mark.parametrize(
    ("path", "status", "fragment"),
    [
        ("/v1/say/joe/Hello.xyz", 400, "supported: wav, wav16, ulaw"),
        ("/v1/say/nobody/Hello.wav", 400, "unknown voice 'nobody'"),
        ("/v1/say/joe/%20%20.wav", 400, "'text' is empty"),
        ("/v1/audio/" + "ab" * 32 + ".wav", 404, "no audio stored"),
        ("/v1/audio/xyz.wav", 400, "malformed audio key"),
        ("/v1/audio/" + "ab" * 32 + ".ogg", 400, "unsupported extension '.ogg'"),
    ],
)
async def test_bad_telephony_urls_are_4xx_that_say_why(
    gateway: GatewayFactory, path: str, status: int, fragment: str
) -> None:
    client = await gateway()
    r = await client.get(path)
    assert r.status == status
    body = await r.json()
    assert fragment in body["error"]["message"], body


async def test_audio_stored_without_masters(gateway: GatewayFactory) -> None:
    """Audio stored before renditions named their masters: a lossless one is its own source; a
    lossy one cannot be re-encoded without a synthesis, and says so."""
    client = await gateway()
    key, _ = await stored_key(client, "Old audio.", "wav")
    store = client.server.app[keys.STORE]
    found = await store.get(key)
    assert found is not None and found.entry.meta.parts  # renditions now name their masters
    legacy = "cd" * 32
    old = found.entry
    await store.put(legacy, Entry(old.audio, dataclasses.replace(old.meta, parts=(), master="")))
    r = await client.get(f"/v1/audio/{legacy}.ulaw")
    assert r.status == 200
    assert len(await r.read()) > 1000
    mp3 = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": "Old audio.", "voice": "alloy", "response_format": "mp3"},
    )
    got = await store.get(mp3.headers["X-Audio-Key"])
    assert got is not None
    lossy = "ef" * 32
    meta = dataclasses.replace(got.entry.meta, parts=(), master="")
    await store.put(lossy, Entry(got.entry.audio, meta))
    r = await client.get(f"/v1/audio/{lossy}.ulaw")
    assert r.status == 404
    assert (await r.json())["error"]["code"] == "master_not_stored"


def test_entry_meta_keeps_its_masters_through_a_blob() -> None:
    entry = Entry.create(
        b"abc",
        content_type="audio/basic",
        fmt="ulaw",
        sample_rate=8000,
        master="m" * 64,
        parts=("a" * 64, "b" * 64),
        pause_ms=250,
    )
    back = Entry.from_blob(entry.to_blob())
    assert back == entry
    assert back.meta.parts == ("a" * 64, "b" * 64)
