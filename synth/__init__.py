"""Synthesis: engines (Piper, Coqui), runners, the micro-batching scheduler, audio encoding."""

from synth.engine import Audio, Engine, SynthesisItem, VoiceInfo
from synth.errors import EngineDead, EngineError, Overloaded, SynthesisError, SynthesisTimeout
from synth.scheduler import BatchRunner, Scheduler

__all__ = [
    "Audio",
    "BatchRunner",
    "Engine",
    "EngineDead",
    "EngineError",
    "Overloaded",
    "Scheduler",
    "SynthesisError",
    "SynthesisItem",
    "SynthesisTimeout",
    "VoiceInfo",
]
