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
