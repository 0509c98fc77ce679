"""Where a count came from: the ``*_method`` columns read once into a typed record.

The columns hold a printed form ("traced", "measured (cache)", "extended: linear in n through
n=8,16,32,64", "none: <why>"); code decides on ``Provenance``, never on that text.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.schema import StrEnum


class Source(StrEnum):
    """The first word of a ``*_method``: how the figure was obtained."""

    TRACED = "traced"  # counted on the call at its own n
    MEASURED = "measured"  # read at its own n (peak memory, path length)
    # carried from probe lengths by a law proven there (measure.counts.extend)
    EXTENDED = "extended"
    NONE = "none"  # not obtained; the text says why
    OTHER = "other"  # anything else (a plugin's, or a newer version's)


CACHED_MARK = "(cache)"  # what a figure read back from the count cache adds to its method


@dataclass(frozen=True)
class Provenance:
    """A ``*_method`` value: its source, what follows it (the law, or why none), and whether
    it was read from the count cache."""

    source: Source
    detail: str = ""
    cached: bool = False

    @classmethod
    def parse(cls, text: object) -> Provenance:
        """The record a ``*_method`` value prints (an empty or missing value: ``OTHER``)."""
        if not isinstance(text, str):
            return cls(Source.OTHER)
        body = text.strip()
        cached = body.endswith(CACHED_MARK)
        body = body.removesuffix(CACHED_MARK).strip()
        head, _, detail = body.partition(":")
        word = head.split(" ", 1)[0]
        source = Source(word) if word in tuple(Source) else Source.OTHER
        return cls(source, detail.strip(), cached)

    @property
    def extended(self) -> bool:
        """Whether the figure was carried from probe lengths by a law."""
        return self.source is Source.EXTENDED

    @property
    def missing(self) -> bool:
        """Whether no figure was obtained."""
        return self.source is Source.NONE


def sources(column: pd.Series) -> pd.Series:
    """Each value's ``Source``, for selecting rows of a results table by provenance."""
    return column.map(lambda text: Provenance.parse(text).source)
