"""The prompt studio in a real headless Chromium: Debian's chromium and
chromium-driver driven by Selenium (installed by .ci/install; nothing is downloaded at run
time). The browser runs in a thread, so the gateway's event loop keeps serving it."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from cache.entry import Entry
from gateway.http import keys
from gateway.runtime.apikeys import key_table
from gateway.runtime.settings import Settings
from gateway.speech.takes import Take
from synth import audio
from synth.takecheck import Verdict
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60
PROMPT = '<speak>Hello from the studio.<break time="700ms"/></speak>'


def browser() -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--mute-audio"):
        options.add_argument(flag)
    # Playing needs no user gesture here: the test clicks, but a headless run has no speaker.
    options.add_argument("--autoplay-policy=no-user-gesture-required")
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def text_of(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def button(driver: WebDriver, take_id: str, label: str) -> Any:
    row = driver.find_element(By.CSS_SELECTOR, f"#takes tr[data-id='{take_id}']")
    return next(b for b in row.find_elements(By.TAG_NAME, "button") if b.text == label)


def review(driver: WebDriver, wait: WebDriverWait[WebDriver], listen: str, drop: str) -> str:
    """Listen to one refused take and approve it, discard another; the first one's row."""
    # Kept before the page loaded: listed once, by the page's first load.
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#takes tr[data-id='{drop}']"))
    row = str(driver.find_element(By.CSS_SELECTOR, f"#takes tr[data-id='{listen}']").text)
    button(driver, listen, "Listen").click()
    wait.until(lambda d: text_of(d, "cache") == "refused" and text_of(d, "duration").endswith(" s"))
    button(driver, drop, "Discard").click()
    # The list is drawn anew: the one left is there again, the discarded one is not.
    wait.until(
        lambda d: (
            not d.find_elements(By.CSS_SELECTOR, f"#takes tr[data-id='{drop}']")
            and d.find_elements(By.CSS_SELECTOR, f"#takes tr[data-id='{listen}']")
        )
    )
    button(driver, listen, "Approve").click()
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#takes tr[data-id]"))
    return row


def drive(url: str, pinned_key: str, takes: tuple[str, str]) -> dict[str, Any]:
    """Type the prompt, speak it twice, play the pinned prompt; what the page showed."""
    driver = browser()
    wait = WebDriverWait(driver, WAIT_S)
    seen: dict[str, Any] = {}
    try:
        driver.get(url)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#voice option"))
        box = driver.find_element(By.ID, "text")
        box.clear()
        box.send_keys(PROMPT)
        driver.find_element(By.ID, "speak").click()
        wait.until(lambda d: text_of(d, "duration").endswith(" s"))
        seen["first_cache"] = text_of(driver, "cache")
        seen["address"] = text_of(driver, "address")
        seen["audio_duration"] = driver.execute_script(
            "return document.getElementById('audio').duration"
        )
        seen["expansion"] = text_of(driver, "expansion")
        # Its words, from the speech marks, each highlighted in turn as the audio plays.
        wait.until(lambda d: text_of(d, "words") == "Hello from the studio")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#words span.now"))
        seen["words"] = text_of(driver, "words")
        driver.find_element(By.ID, "speak").click()
        wait.until(lambda d: text_of(d, "cache") == "HIT" and text_of(d, "duration").endswith(" s"))
        seen["second_address"] = text_of(driver, "address")
        # A pinned catalogue prompt is listed and plays.
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#prompts tr"))
        row = driver.find_element(By.CSS_SELECTOR, "#prompts tr")
        seen["prompt_row"] = row.text
        row.find_element(By.TAG_NAME, "button").click()
        wait.until(
            lambda d: text_of(d, "address") == pinned_key and text_of(d, "duration").endswith(" s")
        )
        seen["pinned_cache"] = text_of(driver, "cache")
        # A refused document shows its error.
        box.clear()
        box.send_keys("<speak><audio src='http://example.com/a.mp3'/></speak>")
        driver.find_element(By.ID, "speak").click()
        wait.until(lambda d: "would fetch a URL" in text_of(d, "error"))
        seen["take_row"] = review(driver, wait, *takes)
    finally:
        driver.quit()
    return seen


async def test_studio_speaks_a_prompt_in_a_real_browser(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    pinned = await client.post(
        "/v1/prompts",
        json={"prompts": [{"input": "Welcome to voxgate.", "id": "welcome", "format": "wav"}]},
    )
    assert pinned.status == 200
    pinned_key = (await pinned.json())["prompts"][0]["key"]
    page = await client.get("/")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "<script src=" not in await page.text()  # nothing from elsewhere

    # Two takes the checks refused, kept for review (no keys file: every caller is admin).
    service = client.app[keys.SPEECH]
    assert service.rejects is not None
    pcm = (0.3 * np.sin(np.arange(8000) / 16000 * 2 * np.pi * 220)).astype(np.float32)
    stored, master = audio.master_of(pcm, 16000)
    refused = Entry.create(
        master, content_type="audio/flac", fmt="flac", sample_rate=16000, model="m", voice="v"
    )
    verdict = Verdict(("too_short",))
    for take_key in ("a" * 64, "b" * 64):
        await service.rejects.keep(take_key, refused, Take(stored, 16000, "Say it.", None), verdict)
    ids = {t.key: t.id for t in await service.rejects.listing()}

    seen = await asyncio.to_thread(
        drive, str(client.make_url("/")), pinned_key, (ids["a" * 64], ids["b" * 64])
    )

    assert seen["first_cache"] == "MISS"
    assert seen["second_address"] == seen["address"]
    assert "Hello from the studio." in seen["expansion"] and "pause 700 ms" in seen["expansion"]
    assert seen["words"] == "Hello from the studio"
    assert "welcome" in seen["prompt_row"] and "Welcome to voxgate." in seen["prompt_row"]
    assert seen["pinned_cache"] == "HIT"
    # The page played what the API serves: the same address and the same length.
    resp = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": PROMPT, "response_format": "wav"},
    )
    assert resp.headers["X-Audio-Key"] == seen["address"]
    data, rate = sf.read(io.BytesIO(await resp.read()))
    assert abs(seen["audio_duration"] - len(data) / rate) < 0.05
    assert seen["audio_duration"] > 0.7  # the words and the 700 ms break (exact silence)
    # The refused take was listed with its reasons and text, played, approved into the store
    # under its key; the other discarded.
    assert "m/v" in seen["take_row"] and "too_short" in seen["take_row"]
    assert "Say it." in seen["take_row"]
    assert await service.rejects.listing() == []
    assert await service.store.get("a" * 64) is not None
    assert await service.store.get("b" * 64) is None


STUDIO_SECRET = canary("studio")


def drive_with_key(url: str) -> dict[str, str]:
    """Open the page with keys on: the listing fails until the key is typed, then it speaks."""
    driver = browser()
    wait = WebDriverWait(driver, WAIT_S)
    seen: dict[str, str] = {}
    try:
        driver.get(url)
        wait.until(lambda d: "voices: 401" in text_of(d, "error"))
        seen["without_key"] = text_of(driver, "error")
        key = driver.find_element(By.ID, "key")
        key.send_keys(STUDIO_SECRET)
        driver.find_element(By.ID, "text").click()  # leaving the field fires its change event
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#voice option"))
        box = driver.find_element(By.ID, "text")
        box.clear()
        box.send_keys("Keys are on.")
        driver.find_element(By.ID, "speak").click()
        wait.until(lambda d: text_of(d, "duration").endswith(" s"))
        seen["cache"] = text_of(driver, "cache")
        seen["error"] = text_of(driver, "error")
        seen["takes"] = text_of(driver, "takes")
    finally:
        driver.quit()
    return seen


async def test_studio_sends_the_typed_key_as_bearer(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(key_table("studio", STUDIO_SECRET, ["speak", "read"]), encoding="utf-8")
    client = await gateway(settings=settings.replace(api_keys_file=str(keys_file)))
    assert (await client.get("/")).status == 200  # the page itself is open
    seen = await asyncio.to_thread(drive_with_key, str(client.make_url("/")))
    assert seen["without_key"].startswith("voices: 401")
    assert (seen["cache"], seen["error"]) == ("MISS", "")
    assert seen["takes"] == "an admin key lists them"  # a key without the admin scope
