"""SIGINT / SIGTERM during a sweep: the first asks it to stop after the running cases, a second
stops it at once; neither ever tears a file."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


class GracefulStop:
    """SIGINT / SIGTERM: the first asks the sweep to stop after the rounds now timing, a second
    one stops it at once (KeyboardInterrupt).  Signals that arrive while a case is being written are
    held until the write is done, so a stop never tears a file."""

    def __init__(self, on_request: Callable[[str], None] | None = None) -> None:
        self.on_request = on_request
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._writing = False
        self._held = False

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            if self.on_request is not None:
                self.on_request(self.signal_name)
        elif self._writing:
            self._held = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
        if self._held:
            raise KeyboardInterrupt
