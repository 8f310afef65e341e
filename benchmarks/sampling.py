"""A background thread that calls ``sample()`` every ``every`` seconds while a ``with`` block runs: the
memory samplers of scale.py and scale_cluster.py."""

from __future__ import annotations

import threading
from typing import Any


class BackgroundSampler:
    """Subclasses define :meth:`sample` and set ``self.every``; ``with`` starts and stops the thread."""

    every: float

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
