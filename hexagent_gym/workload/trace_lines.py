"""Where a trace file's lines are: a line index that reads no further than it is asked to.

A :class:`LineIndex` finds the non-blank lines of a JSONL file on demand: ``ensure(k)`` reads
until ``k`` of them are known (or the file ends), ``len()`` reads to the end. It keeps only three
integers per line (byte offset, length, 1-based line number) and hands a line's bytes out again
by seeking, so memory stays a few MB for a file of a million lines however long they are.

Contracts:

- lines are split on ``b"\\n"`` only (like ``str.split("\\n")``: U+2028 inside a JSON string is
  not a line break); a line is blank when it holds only ASCII whitespace; blank lines count in
  line numbers but are not indexed; a UTF-8 byte-order mark at the file's start is skipped;
- a line longer than ``specs.MAX_LINE_BYTES`` is a ``TraceError`` naming it, found while it is
  being read (at most ``MAX_LINE_BYTES`` plus 1 MiB of it are ever held);
- a ``.gz`` file is decompressed once into memory (gzip has no random access): memory is then the
  decompressed size;
- the file must not change while indexed: every reopen compares size and modification time, and a
  changed file is a ``TraceError`` (load it again).
"""

from __future__ import annotations

import gzip
import io
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hexagent_gym.workload.specs import MAX_LINE_BYTES, TraceError

_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True  # what bytes.strip() removes


class LineIndex:
    """Non-blank lines of one JSONL file, found lazily (see the module docstring)."""

    __slots__ = ("path", "source", "_stamp", "_data", "_offsets", "_lengths", "_linenos",
                 "_next_offset", "_next_lineno", "_done")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.source = str(path)
        self._stamp = self._stat()
        self._data: bytes | None = None  # decompressed .gz content
        self._offsets = array("q")
        self._lengths = array("q")
        self._linenos = array("q")
        self._next_offset = 0  # where the scan goes on
        self._next_lineno = 1
        self._done = False

    # ---- reading -------------------------------------------------------------------------------

    def _stat(self) -> tuple[int, int]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise TraceError(f"cannot read trace file '{self.path}': {exc.strerror}") from exc
        return st.st_mtime_ns, st.st_size

    def _open(self) -> BinaryIO:
        if self._stat() != self._stamp:
            raise TraceError(f"trace file '{self.path}' changed after it was indexed; load it "
                             f"again")
        if self.path.suffix == ".gz":
            if self._data is None:
                try:
                    with gzip.open(self.path, "rb") as f:
                        self._data = f.read()
                except OSError as exc:  # includes gzip.BadGzipFile
                    detail = exc.strerror or str(exc)
                    raise TraceError(f"cannot read trace file '{self.path}': {detail}") from exc
                except EOFError as exc:
                    raise TraceError(f"cannot read trace file '{self.path}': truncated gzip "
                                     f"data") from exc
            return io.BytesIO(self._data)
        try:
            return open(self.path, "rb")  # noqa: SIM115 -- closed by the callers' with
        except OSError as exc:
            raise TraceError(f"cannot read trace file '{self.path}': {exc.strerror}") from exc

    def _region(self, f: BinaryIO) -> bytes:
        """The next whole lines from ``_next_offset`` on (about ``_CHUNK`` bytes; b"" at the
        end); a line longer than ``MAX_LINE_BYTES`` is an error before it is read whole."""
        buf = f.read(_CHUNK)
        while True:
            cut = buf.rfind(b"\n")
            if cut >= 0:
                return buf[:cut + 1]
            more = f.read(_CHUNK) if len(buf) <= MAX_LINE_BYTES else b""
            if len(buf) > MAX_LINE_BYTES:
                raise TraceError(f"{self.source}:{self._next_lineno}: line longer than the "
                                 f"{MAX_LINE_BYTES:,} bytes a trace line may hold; one line "
                                 f"is one workflow (or one row)")
            if not more:
                return buf  # the last line, without a newline
            buf += more

    def _scan(self, want: int | None, emit: bool = True) -> Iterator[tuple[int, int, bytes]]:
        """Read on from where the last scan stopped, indexing every non-blank line and yielding
        ``(position, line number, bytes)``; stops once ``want`` lines are indexed.

        Lines are found a region (~1 MiB) at a time with numpy, so counting the lines of a
        large file costs no Python work per line; only the yielded lines are sliced out.
        """
        if self._done or (want is not None and len(self._offsets) >= want):
            return
        with self._open() as f:
            while not self._done and (want is None or len(self._offsets) < want):
                f.seek(self._next_offset)  # another scan may have gone on meanwhile
                base, first_lineno = self._next_offset, self._next_lineno
                region = self._region(f)
                if not region:
                    self._done = True
                    return
                data = np.frombuffer(region, dtype=np.uint8)
                ends = np.flatnonzero(data == 10)
                if not region.endswith(b"\n"):
                    ends = np.append(ends, len(region))
                starts = np.empty_like(ends)
                starts[0] = 0
                starts[1:] = ends[:-1] + 1
                if base == 0 and region.startswith(_BOM):
                    starts[0] = len(_BOM)
                lengths = ends - starts
                too_long = np.flatnonzero(lengths > MAX_LINE_BYTES)
                if len(too_long):
                    raise TraceError(f"{self.source}:{first_lineno + int(too_long[0])}: line "
                                     f"longer than the {MAX_LINE_BYTES:,} bytes a trace line "
                                     f"may hold; one line is one workflow (or one row)")
                # blank: only bytes that bytes.strip() removes; only a line that is empty or
                # starts with one can be blank, so only those few are looked at in Python
                maybe = np.flatnonzero((lengths == 0)
                                       | _WHITESPACE[data[np.minimum(starts, len(data) - 1)]])
                blank = [k for k in maybe.tolist()
                         if not region[starts[k]:ends[k]].strip()]
                keep = np.delete(np.arange(len(ends)), blank) if blank else np.arange(len(ends))
                first = len(self._offsets)
                self._offsets.frombytes((starts[keep] + base).astype(np.int64).tobytes())
                self._lengths.frombytes(lengths[keep].astype(np.int64).tobytes())
                self._linenos.frombytes((keep + first_lineno).astype(np.int64).tobytes())
                self._next_offset = base + len(region)
                self._next_lineno = first_lineno + len(ends) - (0 if region.endswith(b"\n")
                                                                 else 1)
                if not region.endswith(b"\n"):
                    self._done = True
                if not emit:
                    continue
                for k, (a, b) in enumerate(zip(starts[keep].tolist(), ends[keep].tolist(),
                                               strict=True)):
                    yield first + k, self._linenos[first + k], region[a:b]

    # ---- the index -----------------------------------------------------------------------------

    def ensure(self, k: int) -> int:
        """Index at least ``k`` non-blank lines (fewer when the file has fewer); returns how many
        are indexed."""
        for _ in self._scan(k, emit=False):
            pass
        return len(self._offsets)

    def __len__(self) -> int:
        """The number of non-blank lines (reads the file to its end once)."""
        for _ in self._scan(None, emit=False):
            pass
        return len(self._offsets)

    def lineno(self, pos: int) -> int:
        """1-based file line of indexed line ``pos``."""
        return self._linenos[pos]

    def lines(self, positions: list[int]) -> Iterator[tuple[int, int, bytes]]:
        """``(position, line number, bytes)`` of the given indexed lines, in the given order
        (one open of the file for them all)."""
        if not positions:
            return
        with self._open() as f:
            for pos in positions:
                f.seek(self._offsets[pos])
                yield pos, self._linenos[pos], f.read(self._lengths[pos])

    def all_lines(self) -> Iterator[tuple[int, int, bytes]]:
        """Every non-blank line in file order: the indexed ones re-read, then the scan goes on
        (so a first full pass reads the file once)."""
        expected = len(self._offsets)
        yield from self.lines(list(range(expected)))
        for pos, lineno, body in self._scan(None):
            if pos != expected:  # lines another scan indexed while this one was paused
                yield from self.lines(list(range(expected, pos)))
            yield pos, lineno, body
            expected = pos + 1
        if expected < len(self._offsets):
            yield from self.lines(list(range(expected, len(self._offsets))))
