"""Task sets that arrive as a stream: an iterable of rows without ``len`` or indexing.

A Hugging Face ``IterableDataset`` (or a generator) can be a task set of
:func:`~collab_env.tasks.dataset_env.from_dataset`: :class:`StreamedRows` reads its rows in order
as they are first needed and keeps them, so row ``i`` is the same row every time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["StreamedRows", "is_streamed"]


def is_streamed(dataset: Any) -> bool:
    """Whether ``dataset`` is an iterable task set without ``len``/indexing (a Hugging Face
    ``IterableDataset``, a generator...), which :class:`StreamedRows` reads in order."""
    if isinstance(dataset, (str, bytes, Mapping)):
        return False
    indexable = hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    return not indexable and hasattr(dataset, "__iter__")


class StreamedRows:
    """The rows of an iterable task set (``datasets.IterableDataset``), read in order as they
    are first needed and kept, so row ``i`` is the same row every time it is asked for.

    An endless stream works as long as nobody asks for its length: a trainer then needs
    ``max_steps``. Pickling keeps the rows read so far and the source, and reads on from where
    it stopped.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self._rows: list[Any] = []
        self._it: Any = None
        self._done = False

    def _read_to(self, n: int) -> None:
        if self._it is None and not self._done:
            self._it = iter(self.source)
            for _ in range(len(self._rows)):  # after unpickling: skip the rows already kept
                next(self._it)
        while len(self._rows) < n and not self._done:
            try:
                self._rows.append(next(self._it))
            except StopIteration:
                self._done, self._it = True, None

    def available(self, n: int) -> int:
        """How many of the first ``n`` rows exist (reads at most ``n`` rows)."""
        self._read_to(n)
        return min(n, len(self._rows))

    @property
    def exhausted(self) -> bool:
        """Whether the stream's end has been reached (its length is known)."""
        return self._done

    def __len__(self) -> int:
        """Reads the stream to its end (never returns for an endless stream)."""
        while not self._done:
            self._read_to(len(self._rows) + 1024)
        return len(self._rows)

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        self._read_to(index + 1)
        if index < 0 or index >= len(self._rows):
            raise ConfigError(
                f"row {index} of a streamed task set that has only {len(self._rows)} rows; pass an "
                "index below that (reset(options={'index': i}))."
            )
        return self._rows[index]

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "rows": list(self._rows), "done": self._done}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.source, self._rows, self._done, self._it = state["source"], state["rows"], state["done"], None
