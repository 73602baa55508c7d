"""The Wyoming protocol (Home Assistant's voice protocol): not HTTP, so not under ``gateway/http``.

:mod:`gateway.wyoming.server` answers Wyoming's TTS events from the same
:class:`~gateway.speech.service.SpeechService` (store and single flight) as the HTTP endpoints.
"""
