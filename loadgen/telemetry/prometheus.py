"""A reader of the Prometheus text exposition format (0.0.4) and of OpenMetrics text, as vLLM,
SGLang and our server serve it on /metrics, light enough to scrape once a second from the
client's event loop.

It reads `# HELP`, `# TYPE`, `# UNIT` and `# EOF` lines, samples with labels (quoted values with
the escapes \\\\, \\" and \\n), optional timestamps, OpenMetrics exemplars
(`... 3 # {trace_id="a"} 0.4 1.7e9`), NaN and ±Inf. A sample keeps the name it was exposed
under (`x_total`, `x_bucket`, `x_created`...); `family_of` folds such a name into its family.

Servers expose the same series in the same spelling at every scrape, so the part of a line
before its value (name and labels) is looked up in a cache of the series already read: a known
series costs a split, a dict look-up and a `float`, and only new series go through the regular
expression that checks the grammar. A line that does not parse raises ParseError with its line
number; the caller records the scrape as failed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]

FAMILY_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset",
                          "gaugehistogram"})
# What counters, histograms, summaries, gauge histograms and info metrics add to their family's
# name in their samples' names.
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_gsum", "_gcount", "_info")

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# A quoted value's text as runs of plain characters between escapes: far fewer steps than one
# alternation per character on long label values.
_QUOTED = r'[^"\\\n]*(?:\\.[^"\\\n]*)*'
_LABEL = rf'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"{_QUOTED}"'
_LABELS = rf"\{{[ \t]*(?:{_LABEL}(?:[ \t]*,[ \t]*{_LABEL})*[ \t]*,?[ \t]*)?\}}"
_VALUE = r"[^ \t#]+"  # float() decides
_SAMPLE = re.compile(rf"[ \t]*({_NAME})[ \t]*({_LABELS})?[ \t]+({_VALUE})(?:[ \t]+({_VALUE}))?"
                     rf"(?:[ \t]+#[ \t]*({_LABELS})[ \t]+({_VALUE})(?:[ \t]+({_VALUE}))?)?[ \t\r]*")
_PAIR = re.compile(rf'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"({_QUOTED})"')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_NAME_RE = re.compile(_NAME)

# Series text (name and labels as written) -> (name, labels). Bounded: a server whose label
# values change at every scrape would otherwise grow it without end.
_SERIES_CACHE: dict[str, tuple[str, Labels]] = {}
_SERIES_CACHE_LIMIT = 1 << 16


class ParseError(ValueError):
    """A line of the exposition that is not one of the format's."""

    def __init__(self, line_number: int, line: str, reason: str) -> None:
        super().__init__(f"line {line_number}: {reason}: {line[:160]!r}")
        self.line_number = line_number


@dataclass(frozen=True, slots=True)
class Exemplar:
    """OpenMetrics: the labels, value and timestamp after ` # ` on a sample line."""

    labels: Labels
    value: float
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One series' value; labels in the order the server wrote them, values unescaped."""

    name: str
    labels: Labels
    value: float
    timestamp: float | None = None  # as exposed: milliseconds in 0.0.4, seconds in OpenMetrics
    exemplar: Exemplar | None = None


@dataclass(frozen=True, slots=True)
class Scrape:
    """One exposition: its families (name -> type, from the `# TYPE` lines) and its samples in order."""

    families: dict[str, str]
    samples: tuple[Sample, ...]

    def family_of(self, sample_name: str) -> str:
        return family_of(sample_name, self.families)


# (series text, name, labels, value, timestamp, exemplar)
Row = tuple[str, str, Labels, float, float | None, Exemplar | None]


def parse(text: str) -> Scrape:
    families: dict[str, str] = {}
    samples = tuple(Sample(name, labels, value, stamp, exemplar)
                    for _, name, labels, value, stamp, exemplar in scan(text, families))
    return Scrape(families, samples)


def scan(text: str, families: dict[str, str]) -> Iterator[Row]:
    """The samples of `text` as rows, in order, filling `families` from its `# TYPE` lines; the
    series text (name and labels as written) is a stable key for a series across scrapes."""
    for number, line in enumerate(text.split("\n"), 1):
        if not line or line[0] == "#":
            if line:
                _comment(line, number, families)
            continue
        row = _row(line)
        if row is None:
            if line.isspace():
                continue
            raise ParseError(number, line, "not a sample")
        yield row


def totals(text: str, names: Collection[str]) -> dict[str, float]:
    """The named samples, each summed over its label sets (absent ones left out). Only the lines
    of those names are read, found with `str.find`, so the cost hardly grows with the scrape;
    ParseError for such a line that does not parse, other lines are not checked."""
    out: dict[str, float] = {}
    for name in dict.fromkeys(names):
        start = 0
        while (at := text.find(name, start)) >= 0:
            start = at + len(name)
            if (at and text[at - 1] != "\n") or text[start:start + 1] not in ("{", " ", "\t"):
                continue  # inside a comment, or the start of a longer name
            end = text.find("\n", start)
            line = text[at:] if end < 0 else text[at:end]
            row = _row(line)
            if row is None:
                raise ParseError(text.count("\n", 0, at) + 1, line, "not a sample")
            out[name] = out.get(name, 0.0) + row[3]
    return out


def family_of(sample_name: str, families: dict[str, str]) -> str:
    """The family a sample belongs to: its own name if a `# TYPE` line names it, else its name
    less a suffix (`_total`, `_bucket`...) that one does; else its own name."""
    if sample_name in families:
        return sample_name
    for suffix in SUFFIXES:
        if sample_name.endswith(suffix) and sample_name[:-len(suffix)] in families:
            return sample_name[:-len(suffix)]
    return sample_name


def _row(line: str) -> Row | None:
    series, _, value = line.rpartition(" ")
    known = _SERIES_CACHE.get(series)
    if known is not None:
        try:
            return series, known[0], known[1], float(value), None, None
        except ValueError:
            pass  # the full grammar says what is wrong
    return _row_checked(line)


def _row_checked(line: str) -> Row | None:
    match = _SAMPLE.fullmatch(line)
    if match is None:
        return None
    name, block, value, stamp, ex_block, ex_value, ex_stamp = match.groups()
    try:
        number = float(value)
        timestamp = None if stamp is None else float(stamp)
        exemplar = None if ex_block is None else Exemplar(_labels(ex_block), float(ex_value),
                                                          None if ex_stamp is None else float(ex_stamp))
    except ValueError:
        return None
    series = line[:match.end(2) if block else match.end(1)]
    labels = _labels(block) if block else ()
    if len(_SERIES_CACHE) >= _SERIES_CACHE_LIMIT:
        _SERIES_CACHE.clear()
    _SERIES_CACHE[series] = (name, labels)
    return series, name, labels, number, timestamp, exemplar


def _labels(block: str) -> Labels:
    return tuple((key, _unescape(value) if "\\" in value else value) for key, value in _PAIR.findall(block))


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED.get(m.group(1), m.group(0)), value)


def _comment(line: str, number: int, families: dict[str, str]) -> None:
    """`# TYPE` and `# HELP`/`# UNIT` lines must name a metric; other comments (`# EOF`) are skipped."""
    keyword, _, rest = line[2:].partition(" ")
    if not line.startswith("# ") or keyword not in ("TYPE", "HELP", "UNIT"):
        return
    parts = rest.split() if keyword == "TYPE" else rest.split(None, 1)
    if not parts or not _NAME_RE.fullmatch(parts[0]):
        raise ParseError(number, line, f"a {keyword} line names a metric")
    if keyword == "TYPE":
        if len(parts) != 2 or parts[1] not in FAMILY_TYPES:
            raise ParseError(number, line, "a TYPE line is `# TYPE name type`")
        families[parts[0]] = parts[1]
