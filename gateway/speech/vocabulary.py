"""What a request may name: the served models, their voices and languages, what each engine can
do, and the aliases clients use. A read-only view, fixed at start (an engine's voices do not
change once built; an upstream's capabilities are read through to its current config).

Request parsing (:mod:`gateway.api`) validates against this, never against the running
:class:`~gateway.speech.service.SpeechService`: the speech path flows one way, from the edge down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from synth.engine import Engine, EngineCapabilities, ParamValue, VoiceInfo


class ModelWords:
    """One served model as parsing sees it: its voices, their languages and default
    parameters, its engine's name, sample rate and capabilities."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self._engine = engine
        self.engine_name = engine.name
        self.sample_rate = engine.sample_rate
        self._voices = tuple(engine.voices())
        self._names = [v.name for v in self._voices]
        self._listed = frozenset(self._names)
        self._languages = {v.name: v.language for v in self._voices}

    @property
    def capabilities(self) -> EngineCapabilities:
        """What the engine can do (an upstream's may change on a reload of its file)."""
        return self._engine.capabilities

    def voices(self) -> Sequence[VoiceInfo]:
        """The voices this model serves, in the engine's order."""
        return self._voices

    def voice_names(self) -> Sequence[str]:
        """Names of the voices this model serves."""
        return self._names

    def voice_label(self, voice: str) -> str:
        """``voice`` as a metric label: a voice the model lists, else ``other`` (an upstream
        that takes any voice id, ``voices = ["*"]``, would otherwise make a label value of every
        id a client invents)."""
        return voice if voice in self._listed else "other"

    def voice_language(self, voice: str) -> str:
        """The language code of ``voice`` ("en_US"), "" when the engine names none (a voice
        it does not list, asked of an engine that takes any: the language it gives those)."""
        found = self._languages.get(voice)
        if found is not None:
            return found
        can = self._engine.capabilities
        return can.any_voice_language if can.any_voice else ""

    def default_params(self, voice: str) -> Mapping[str, ParamValue]:
        """The engine's own parameters for ``voice`` (what a request may depart from)."""
        return self._engine.default_params(voice)


class Vocabulary:
    """The served models by name (:class:`ModelWords`), the defaults and the aliases."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        *,
        default_model: str = "",
        default_voice: str = "",
        model_aliases: Mapping[str, str] | None = None,
        voice_aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.models: Mapping[str, ModelWords] = MappingProxyType(
            {name: ModelWords(name, engine) for name, engine in engines.items()}
        )
        self.default_model = default_model
        self.default_voice = default_voice
        self.model_aliases: Mapping[str, str] = MappingProxyType(dict(model_aliases or {}))
        self.voice_aliases: Mapping[str, str] = MappingProxyType(dict(voice_aliases or {}))
