"""The optional installs (pip extras) a configuration needs, checked before anything starts.

A base install (``pip install voxgate``) serves Piper voices on ONNX Runtime; the Coqui engine needs
the ``coqui`` extra (coqui-tts, torch: most of an install's size). A missing extra is a settings
error, one line and exit 2, rather than a worker's import traceback once the server is up.
"""

from __future__ import annotations

from gateway.runtime.settings import Settings, SettingsError

COQUI_INSTALL = "pip install 'voxgate[coqui]'"


def check_extras(settings: Settings) -> None:
    """Raise :class:`SettingsError` when a configured engine's extra is not installed."""
    if not settings.coqui_model:
        return
    # Imported here: a process that serves no Coqui model never loads the Coqui engine's module.
    from synth.coqui_engine import missing_modules

    missing = missing_modules()
    if missing:
        raise SettingsError(
            f"setting 'coqui_model': the Coqui engine needs the 'coqui' extra, which is not "
            f"installed here (missing: {', '.join(missing)}): {COQUI_INSTALL}"
        )


def check_upstreams(settings: Settings) -> None:
    """Raise :class:`SettingsError` when the upstreams file cannot be used: unreadable, an entry
    that is wrong, a name a local model has, an API key variable not set, an SDK missing."""
    if not settings.upstreams_file:
        return
    from gateway.runtime.upstreams import upstream_configs

    local = [settings.coqui_name, "piper"] if settings.coqui_model else ["piper"]
    try:
        upstream_configs(settings, local)
    except ValueError as exc:
        raise SettingsError(f"setting 'upstreams_file': {exc}") from None
