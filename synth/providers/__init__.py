"""Clients of remote TTS providers, one module per API kind (imported only when configured)."""
