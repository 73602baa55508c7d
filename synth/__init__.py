"""Synthesis: engines (Piper, Coqui), runners, the micro-batching scheduler, audio encoding."""
