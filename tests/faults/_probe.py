"""A service's readiness, sampled through a fault: ``/readyz`` (status and body) and the
partitions an assembler owns (``tokenwire_assembler_owned_partitions`` on ``/metrics``),
read together every ``PERIOD_S`` in a thread until stopped."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

PERIOD_S = 0.2
_OWNED = re.compile(rb"^tokenwire_assembler_owned_partitions (\S+)$", re.M)
_BODY_OWNED = re.compile(r"owns (\d+) of")


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    status: int  # 0: no answer
    body: str
    owned: int | None  # from the /readyz body when it says, else the gauge; None: unknown

    @property
    def reasons(self) -> list[str]:
        """The reasons a ``not ready: owns N of P partitions; reason: ...`` body names
        (``no-answer`` when the probe did not answer)."""
        if self.status == 0:
            return ["no-answer"]
        return [part.split(":", 1)[0].strip() for part in self.body.split("; ")[1:]]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def sample(base: str) -> Sample:
    """One reading of ``base`` (``http://host:port``, the probe server)."""
    status, body = _get(f"{base}/readyz")
    text = body.decode("utf-8", "replace").strip()
    owned: int | None = None
    said = _BODY_OWNED.search(text)
    if said is not None:
        owned = int(said.group(1))
    else:
        _, metrics = _get(f"{base}/metrics")
        found = _OWNED.search(metrics)
        owned = int(float(found.group(1))) if found is not None else None
    return Sample(time.monotonic(), status, text, owned)


@dataclass
class Sampler:
    """Samples ``base`` from :meth:`start` until :meth:`stop`."""

    base: str
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(sample(self.base))
            self._stop.wait(PERIOD_S)

    async def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)
        return self.samples

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]


def probe_base(probe_url: str) -> str:
    """``http://host:port`` of a service's ``.../readyz`` probe URL."""
    return probe_url.removesuffix("/readyz")
