"""Prompts deployed to PBXs: ready URLs from POST /v1/prompts, catalogue ids, ``voxgate export``
into Asterisk/FreeSWITCH layouts, and signed say URLs for players that send no API key."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.api.catalogue import CatalogueError, check_ids, parse_catalogue
from gateway.api.say import signed_say_path
from gateway.cli.export import run_export
from gateway.http import keys
from gateway.runtime.settings import Settings
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

ROOT = Path(__file__).resolve().parents[1]
SECRET = canary("signing")

CATALOGUE = """id,text
welcome,Welcome to Acme.
press-one,Press one for billing.
goodbye,Goodbye.
"""


# ---- POST /v1/prompts: ids and ready URLs ----------------------------------------------------------


async def test_prompts_return_ready_absolute_urls(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    client = await gateway(settings=settings.replace(public_url="http://tts.example:8080/"))
    r = await client.post(
        "/v1/prompts",
        json={
            "prompts": [{"input": "Welcome.", "id": "welcome"}, "Goodbye."],
            "extensions": ["wav", "ulaw"],
        },
    )
    assert r.status == 200, await r.text()
    answers = (await r.json())["prompts"]
    assert answers[0]["id"] == "welcome" and "id" not in answers[1]
    store = client.server.app[keys.STORE]
    synthesized = counting_engine.items
    for answer in answers:
        assert set(answer["urls"]) == {"wav", "ulaw"}
        for ext, url in answer["urls"].items():
            assert url == f"http://tts.example:8080/v1/audio/{answer['key']}.{ext}"
            path = url.removeprefix("http://tts.example:8080")
            got = await client.get(path)
            assert got.status == 200
            assert got.headers["X-Cache"] == "HIT"
            found = await store.get(got.headers["X-Audio-Key"])
            assert found is not None and found.entry.meta.pinned  # made ready and pinned
    assert counting_engine.items == synthesized  # the URLs cost nothing more


@pytest.mark.parametrize(
    ("prompts", "fragment", "code"),
    [
        ([{"input": "A.", "id": "../x"}], "'id' is not a safe file name", "invalid_id"),
        (
            [{"input": "A.", "id": "a"}, {"input": "B.", "id": "a"}],
            "id 'a' is already used",
            "duplicate_id",
        ),
    ],
)
async def test_bad_prompt_ids_are_400(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    prompts: Any,
    fragment: str,
    code: str,
) -> None:
    client = await gateway()
    r = await client.post("/v1/prompts", json={"prompts": prompts})
    assert r.status == 400
    error = (await r.json())["error"]
    assert fragment in error["message"]
    assert error["code"] == code
    assert counting_engine.items == 0


def test_catalogue_ids_are_checked_with_the_line() -> None:
    prompts = parse_catalogue("id,text\nok,A.\nok,B.\n", "csv")
    with pytest.raises(CatalogueError, match="line 3: id 'ok' is already used on line 2"):
        check_ids(prompts)
    prompts = parse_catalogue("id,text\nok,A.\n../x,B.\n", "csv")
    with pytest.raises(
        CatalogueError, match=re.escape("line 3: id '../x' is not a safe file name")
    ):
        check_ids(prompts)
    prompts = parse_catalogue("text\nA.\n", "csv")
    check_ids(prompts)  # ids are optional for warm
    with pytest.raises(CatalogueError, match="line 2: missing id"):
        check_ids(prompts, required=True)
    yaml_prompts = parse_catalogue("prompts:\n- {id: hello, text: Hello.}\n", "yaml")
    assert yaml_prompts[0].id == "hello" and "id" not in yaml_prompts[0].body


# ---- voxgate export ------------------------------------------------------------------------------


def export_args(catalogue: Path, out: Path, formats: str, layout: str) -> argparse.Namespace:
    return argparse.Namespace(
        catalogue=str(catalogue),
        dir=str(out),
        format=formats,
        layout=layout,
        model=None,
        voice=None,
        speed=None,
        no_progress=True,
    )


def files_under(directory: Path) -> dict[str, float]:
    return {
        str(p.relative_to(directory)): p.stat().st_mtime_ns
        for p in directory.rglob("*")
        if p.is_file()
    }


async def test_export_writes_each_layout_and_a_rerun_writes_nothing(
    tmp_path: Path, settings: Settings, counting_engine: CountingEngine
) -> None:
    catalogue = tmp_path / "prompts.csv"
    catalogue.write_text(CATALOGUE)
    engines = {"piper": counting_engine}
    out = tmp_path / "asterisk"
    args = export_args(catalogue, out, "ulaw,wav,sln16", "asterisk")
    first = await run_export(settings, args, engines)
    assert (first["files"], first["written"], first["unchanged"], first["failed"]) == (9, 9, 0, 0)
    assert first["synthesized"] >= 3
    names = sorted(files_under(out))
    assert names == sorted(
        [f"{i}.{e}" for i in ("welcome", "press-one", "goodbye") for e in ("ulaw", "wav", "sln16")]
        + ["manifest.json"]
    )
    with wave.open(str(out / "welcome.wav")) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (8000, 1, 2)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["prompts"]["press-one"]
    assert entry["text"] == "Press one for billing." and entry["voice"] == "joe"
    assert len(entry["key"]) == 64
    assert entry["files"]["ulaw"]["path"] == "press-one.ulaw"
    before = files_under(out)
    items = counting_engine.items
    second = await run_export(settings, args, engines)
    assert (second["written"], second["unchanged"], second["manifest_written"]) == (0, 9, False)
    assert files_under(out) == before  # not one file touched
    assert counting_engine.items == items
    # A changed prompt rewrites its own files only.
    catalogue.write_text(CATALOGUE.replace("Goodbye.", "Goodbye and thanks."))
    third = await run_export(settings, args, engines)
    assert (third["written"], third["unchanged"]) == (3, 6)
    after = files_under(out)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {"goodbye.ulaw", "goodbye.wav", "goodbye.sln16", "manifest.json"}
    # A file changed on disk (same size) is not trusted to be the prompt: it is written again.
    damaged = out / "welcome.ulaw"
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))
    fourth = await run_export(settings, args, engines)
    assert (fourth["written"], fourth["unchanged"]) == (1, 8)
    assert damaged.read_bytes() != bytes(data)
    # FreeSWITCH: one directory per rate, <id>.wav in each.
    fs = tmp_path / "freeswitch"
    result = await run_export(
        settings, export_args(catalogue, fs, "wav,wav16", "freeswitch"), engines
    )
    assert result["written"] == 6
    assert sorted(p for p in files_under(fs) if p != "manifest.json") == sorted(
        f"{rate}/{i}.wav" for rate in (8000, 16000) for i in ("welcome", "press-one", "goodbye")
    )
    with wave.open(str(fs / "16000" / "welcome.wav")) as w:
        assert w.getframerate() == 16000


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users may enter (pytest's tmp_path sits under a 0700 directory, which
    would hide any file from them whatever its mode)."""
    path = Path(tempfile.mkdtemp(prefix="voxgate-export-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def read_as_nobody(path: Path) -> subprocess.CompletedProcess[bytes]:
    """``cat path`` as the unprivileged user ``nobody`` (uid 65534), as a PBX's own user reads."""
    if shutil.which("setpriv"):
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)]
    else:
        argv = ["runuser", "-u", "nobody", "--", "cat", str(path)]
    return subprocess.run(argv, capture_output=True, timeout=30)


@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"),
    [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)],
    ids=["umask-022", "umask-027"],
)
async def test_exported_files_have_the_modes_the_umask_allows(
    shared_dir: Path,
    settings: Settings,
    counting_engine: CountingEngine,
    umask: int,
    file_mode: int,
    dir_mode: int,
) -> None:
    """Exported files, the directories made for them and the manifest get the modes the process
    umask allows (not mkstemp's 0600): under 022 the PBX's own user can read every prompt."""
    catalogue = shared_dir / "prompts.csv"
    catalogue.write_text(CATALOGUE)
    out = shared_dir / "sounds" / "en"
    old = os.umask(umask)
    try:
        result = await run_export(
            settings,
            export_args(catalogue, out, "wav,wav16", "freeswitch"),
            {"piper": counting_engine},
        )
    finally:
        os.umask(old)
    assert result["written"] == 6
    made = [shared_dir / "sounds", out, out / "8000", out / "16000"]
    assert {str(d.relative_to(shared_dir)): stat.S_IMODE(d.stat().st_mode) for d in made} == {
        str(d.relative_to(shared_dir)): dir_mode for d in made
    }
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) == 7 and out / "manifest.json" in files
    assert {str(f): stat.S_IMODE(f.stat().st_mode) for f in files} == {
        str(f): file_mode for f in files
    }
    assert not [p for p in out.rglob(".*")]  # no temporary file left behind
    # The test suite runs as root (as CI does): read as another user, as the PBX does.
    if os.geteuid() == 0:
        prompt = out / "8000" / "welcome.wav"
        read = read_as_nobody(prompt)
        readable_by_others = bool(file_mode & stat.S_IROTH)
        assert (read.returncode == 0) == readable_by_others, read.stderr
        if readable_by_others:
            assert read.stdout == prompt.read_bytes()
            manifest = read_as_nobody(out / "manifest.json")
            assert (
                manifest.returncode == 0 and json.loads(manifest.stdout)["layout"] == "freeswitch"
            )


def run_cli(*argv: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        ("id,text\na,A.\na,B.\n", "line 3: id 'a' is already used on line 2"),
        ("id,text\na,A.\n../x,B.\n", "line 3: id '../x' is not a safe file name"),
    ],
)
def test_export_refuses_a_bad_id_before_any_work(tmp_path: Path, rows: str, fragment: str) -> None:
    catalogue = tmp_path / "bad.csv"
    catalogue.write_text(rows)
    out = tmp_path / "out"
    done = run_cli("export", str(catalogue), str(out), "--format", "ulaw", tmp_path=tmp_path)
    assert done.returncode == 2
    assert fragment in done.stderr
    assert not out.exists()
    assert not (tmp_path / "xdg").exists()  # no store opened, no model loaded


def test_export_refuses_formats_the_layout_cannot_hold(tmp_path: Path) -> None:
    catalogue = tmp_path / "ok.csv"
    catalogue.write_text(CATALOGUE)
    for formats, layout, fragment in (
        ("mp3", "asterisk", "core Asterisk plays no mp3 files"),
        ("ulaw", "freeswitch", "the freeswitch layout writes <rate>/<id>.wav"),
        ("ulaw,pcmu", "asterisk", "formats ulaw and pcmu would write the same file"),
        ("ogg", "flat", "unknown format 'ogg'"),
    ):
        done = run_cli(
            "export",
            str(catalogue),
            str(tmp_path / "o"),
            "--format",
            formats,
            "--layout",
            layout,
            tmp_path=tmp_path,
        )
        assert done.returncode == 2, done.stderr
        assert fragment in done.stderr


@pytest.mark.slow
def test_export_command_prints_a_json_summary(tmp_path: Path) -> None:
    catalogue = tmp_path / "prompts.csv"
    catalogue.write_text(CATALOGUE)
    out = tmp_path / "sounds"
    argv = ("export", str(catalogue), str(out), "--format", "gsm,g722", "--json", "--no-progress")
    done = run_cli(*argv, "--cache-dir", str(tmp_path / "cache"), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["files"], summary["written"], summary["layout"]) == (6, 6, "asterisk")
    assert summary["formats"] == ["gsm", "g722"]
    assert (out / "welcome.gsm").stat().st_size % 33 == 0  # whole GSM frames


# ---- signed say URLs ----------------------------------------------------------------------------

LATER = int(time.time()) + 3600  # an expiry an hour after the tests start


async def test_signed_say_urls(gateway: GatewayFactory, settings: Settings) -> None:
    signing = settings.replace(url_signing_secret=SECRET, public_url="http://tts:8080")
    client = await gateway(settings=signing)
    path = signed_say_path(SECRET, "joe", "Press one.", "wav", LATER)
    assert "&" not in path and "?" not in path
    r = await client.get(path)
    assert r.status == 200, await r.text()
    plain = await client.get("/v1/say/joe/Press%20one..wav")
    assert await r.read() == await plain.read()  # the same prompt, the same bytes
    # Made by the API too: every URL expires, in signed_url_ttl_s (30 days) unless asked.
    before = int(time.time())
    made = await client.post(
        "/v1/say/sign", json={"voice": "joe", "text": "Press one.", "ext": "wav"}
    )
    assert made.status == 200
    answer = await made.json()
    assert before + 30 * 86400 <= answer["expires"] <= int(time.time()) + 30 * 86400
    assert answer["key"] is None  # no keys file: nobody to charge
    assert answer["path"] == signed_say_path(SECRET, "joe", "Press one.", "wav", answer["expires"])
    assert answer["url"] == "http://tts:8080" + answer["path"]
    # Any change to voice, text or extension breaks the signature.
    token = path.split("/")[4]
    for forged in (
        f"/v1/say/s/{token}/joe/Press%20two..wav",
        f"/v1/say/s/{token}/alloy/Press%20one..wav",
        f"/v1/say/s/{token}/joe/Press%20one..ulaw",
        f"/v1/say/s/x{token}/joe/Press%20one..wav",
    ):
        bad = await client.get(forged)
        assert bad.status == 403, forged
        assert (await bad.json())["error"]["code"] == "bad_signature"
    # Expiry is signed: a past one is refused, a future one plays.
    expired = signed_say_path(SECRET, "joe", "Press one.", "wav", int(time.time()) - 5)
    r = await client.get(expired)
    assert r.status == 403 and (await r.json())["error"]["code"] == "url_expired"
    later = await client.post(
        "/v1/say/sign",
        json={"voice": "joe", "text": "Press one.", "ext": "ulaw", "expires_in": 60},
    )
    r = await client.get((await later.json())["path"])
    assert r.status == 200
    unsignable = await client.post(
        "/v1/say/sign", json={"voice": "nobody", "text": "Hi.", "ext": "wav"}
    )
    assert unsignable.status == 400
    for expires_in in (0, -1, "never"):  # a URL that never expires cannot be asked for
        r = await client.post(
            "/v1/say/sign",
            json={"voice": "joe", "text": "Hi.", "ext": "wav", "expires_in": expires_in},
        )
        assert r.status == 400, expires_in
        assert (await r.json())["error"]["param"] == "expires_in"
    too_long = await client.post(
        "/v1/say/sign",
        json={"voice": "joe", "text": "Hi.", "ext": "wav", "expires_in": 366 * 86400},
    )
    assert (
        too_long.status == 400 and "signed_url_max_s" in (await too_long.json())["error"]["message"]
    )
    # A token of the earlier form (no key, no expiry) is refused: it must be signed again.
    old = f"/v1/say/s/{path.split('/')[4].split('~')[2]}/joe/Press%20one..wav"
    r = await client.get(old)
    assert r.status == 403 and (await r.json())["error"]["code"] == "bad_signature"


async def test_sign_url_command_prints_a_url_the_gateway_plays(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VOXGATE_URL_SIGNING_SECRET": SECRET}
    argv = ["sign-url", "joe", "Press one, or hold.", "ulaw", "--public-url", "http://tts:8080"]
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli.main", *argv, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["expires"] >= time.time() + 29 * 86400 and printed["key"] is None
    assert printed["url"].startswith("http://tts:8080/v1/say/s/")
    assert "%2C" in printed["url"] and "&" not in printed["url"]
    client = await gateway(settings=settings.replace(url_signing_secret=SECRET))
    r = await client.get(printed["url"].removeprefix("http://tts:8080"))
    assert r.status == 200
    assert r.headers["Content-Type"] == "audio/basic"


async def test_signing_off_refuses_signed_urls(gateway: GatewayFactory) -> None:
    client = await gateway()
    r = await client.get(signed_say_path("other", "joe", "Hi.", "wav", LATER))
    assert r.status == 403
    assert (await r.json())["error"]["code"] == "signing_disabled"
    r = await client.post("/v1/say/sign", json={"voice": "joe", "text": "Hi.", "ext": "wav"})
    assert r.status == 403
