"""Finish carries an error exactly when its reason is "error", enforced at decode time."""

from __future__ import annotations

import msgspec
import pytest

from tokenwire.schemas import FINISH_REASONS, Finish, StepError, chunk_decoder, envelope_decoder

ENVELOPE = (
    b'{"session": "s", "turn": 0, "step": 0, "ordinal": 3, "time_ns": 1, "provider": "p",'
    b' "model": "m", "chunk": %s}'
)


@pytest.mark.parametrize(
    "body",
    [
        b'{"type": "finish", "reason": "error"}',
        b'{"type": "finish", "reason": "error", "error": null}',
        b'{"type": "finish", "reason": "stop", "error": {"message": "x"}}',
        b'{"type": "finish", "reason": "aborted", "error": {"message": "x", "retryable": true}}',
    ],
)
def test_an_error_without_error_reason_or_the_reverse_is_rejected(body: bytes) -> None:
    with pytest.raises(msgspec.ValidationError, match="exactly when its reason is 'error'"):
        chunk_decoder.decode(body)
    with pytest.raises(msgspec.ValidationError, match="exactly when its reason is 'error'"):
        envelope_decoder.decode(ENVELOPE % body)


def test_an_unknown_reason_is_rejected() -> None:
    with pytest.raises(msgspec.ValidationError):
        chunk_decoder.decode(b'{"type": "finish", "reason": "length"}')


@pytest.mark.parametrize("reason", [r for r in FINISH_REASONS if r != "error"])
def test_every_other_reason_decodes_without_an_error(reason: str) -> None:
    body = b'{"type": "finish", "reason": "%s"}' % reason.encode()
    assert chunk_decoder.decode(body) == Finish(reason=reason)  # type: ignore[arg-type]  # each parametrized reason is one of the Literal's values


def test_error_reason_decodes_with_its_error() -> None:
    body = b'{"type": "finish", "reason": "error", "error": {"message": "boom"}}'
    assert envelope_decoder.decode(ENVELOPE % body).chunk == Finish(
        reason="error", error=StepError(message="boom", retryable=False, code=None)
    )


def test_constructing_a_bad_finish_fails_too() -> None:
    with pytest.raises(ValueError, match="exactly when"):
        Finish(reason="error")
