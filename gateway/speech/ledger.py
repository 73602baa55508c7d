"""How speech was had, counted in one place: each response's outcome (HIT, MISS, COALESCED), each
production's sentences and transcodes, and the characters of upstream models served without a
call to them (hits, stored sentences, joined calls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cache.entry import Entry
from gateway.speech.request import CacheResult, SpeechRequest
from metrics import Metrics
from synth.engine import Engine


@dataclass(frozen=True)
class Made:
    """A production's result, once: the stored rendition, how it was had (``miss`` when a
    sentence was synthesized for it, ``coalesced`` when one came from a synthesis another
    process or replica ran, else ``hit``) and the characters of its text had without a call."""

    entry: Entry
    cache: CacheResult
    free_chars: int


class Ledger:
    """Every speech counter is bumped here. Free characters are tallied on the hit path and
    added to the metrics in bulk before every collection (:meth:`flush`)."""

    def __init__(self, engines: Mapping[str, Engine], metrics: Metrics) -> None:
        self._engines = engines
        self.metrics = metrics
        # Upstream models by name (local ones are not billed: nothing to tally).
        self.priced = frozenset(
            name
            for name, engine in engines.items()
            if engine.capabilities.price_per_million_chars is not None
        )
        self._served: dict[str, int] = {}
        metrics.before_collect(self.flush)

    def _free(self, model: str, chars: int) -> None:
        if chars and model in self.priced:
            self._served[model] = self._served.get(model, 0) + chars

    def answered(self, req: SpeechRequest, cache: CacheResult, *, produced_here: bool) -> None:
        """One response to ``req`` says ``cache``. Unless its own production ran
        (``produced_here``: :meth:`produced` counts that one's free sentences), none of its
        characters cost a call: a hit, or a production another request started."""
        if cache == "coalesced":
            self.metrics.coalesced.inc()
        if not produced_here:
            self._free(req.model, len(req.text))

    def sentence(self, outcome: CacheResult) -> None:
        """One sentence of a production was had (stored, synthesized or joined)."""
        self.metrics.sentences.labels(outcome).inc()

    def produced(self, req: SpeechRequest, made: Made) -> None:
        """A production of ``req`` finished as ``made``: nothing synthesized is a transcode."""
        if made.cache != "miss":
            self.transcoded(req.fmt.name)
        self._free(req.model, made.free_chars)

    def transcoded(self, fmt: str) -> None:
        """A rendition in ``fmt`` was made of stored masters, without a synthesis."""
        self.metrics.transcodes.labels(fmt).inc()

    def flush(self) -> None:
        """Add the characters served without a call since the last flush to the metrics."""
        tally, self._served = self._served, {}
        m = self.metrics
        for model, chars in tally.items():
            m.upstream_chars_cached.labels(model).inc(chars)
            # Read now: a reload of the upstreams file may have changed it.
            price = self._engines[model].capabilities.price_per_million_chars or 0.0
            if price:
                m.upstream_saved.labels(model).inc(chars * price / 1e6)
