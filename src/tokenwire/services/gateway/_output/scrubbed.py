"""The caller's bytes without the gateway's credentials (tokenwire.scrub, at the edge).

On the same-dialect path the provider's events are forwarded as they are read, an in-stream
error event included; a provider that echoes the key it was called with would hand it to the
caller. The step's chunks are scrubbed for the broker and the store (``StepRun._scrubbed``);
this wrapper does the same for every byte a streaming caller receives.
"""

from __future__ import annotations

from tokenwire.providers import Normaliser
from tokenwire.schemas import StreamChunk
from tokenwire.scrub import scrub_bytes
from tokenwire.services.gateway._output.caller import CallerOutput


class ScrubbedOutput:
    """``inner`` with every secret in ``secrets`` replaced by ``[redacted]``."""

    def __init__(self, inner: CallerOutput, secrets: tuple[str, ...]) -> None:
        self._inner = inner
        self._secrets = secrets

    def normaliser(self, inner: Normaliser) -> Normaliser:
        return self._inner.normaliser(inner)

    def opening(self) -> bytes:
        return scrub_bytes(self._inner.opening(), self._secrets)

    def chunk(self, chunk: StreamChunk) -> bytes:
        return scrub_bytes(self._inner.chunk(chunk), self._secrets)

    def flush(self) -> bytes:
        return scrub_bytes(self._inner.flush(), self._secrets)

    def idle(self) -> bytes:
        return scrub_bytes(self._inner.idle(), self._secrets)

    def ending(self) -> bytes:
        return scrub_bytes(self._inner.ending(), self._secrets)

    def failure(self, message: str) -> bytes:
        return scrub_bytes(self._inner.failure(message), self._secrets)


def scrubbed(output: CallerOutput, secrets: tuple[str, ...]) -> CallerOutput:
    """``output``, wrapped when there is anything to scrub."""
    return ScrubbedOutput(output, secrets) if secrets else output
