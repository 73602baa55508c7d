"""Typed application keys: all state lives on the app, none in module globals."""

from __future__ import annotations

from aiohttp import web

from cache.store import TieredStore
from gateway.settings import Settings
from gateway.speech import SpeechService
from metrics import Metrics

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
STORE = web.AppKey("store", TieredStore)
SPEECH = web.AppKey("speech", SpeechService)
