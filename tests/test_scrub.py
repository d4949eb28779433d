"""tokenwire.scrub: the one scrubbing point for whatever leaves a process."""

from __future__ import annotations

import logging

import pytest

from tokenwire.broker import BrokerUnavailable
from tokenwire.scrub import REDACTED, install_log_scrubbing, register, scrub, scrub_bytes

PASSWORD = "pw-SENTINEL-0c1d"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"nats://gateway:{PASSWORD}@127.0.0.1:4222", "nats://127.0.0.1:4222"),
        (f"a nats://u:{PASSWORD}@h:1,nats://v:x@h:2 b", "a nats://h:1,nats://h:2 b"),
        ("postgresql://postgres@db:5432/x", "postgresql://db:5432/x"),
        ("Authorization: Bearer tw-key-123456", f"Authorization: {REDACTED}"),
        ('{"x-api-key": "sk-ant-abcdefghijkl"}', f'{{"x-api-key": "{REDACTED}"}}'),
        ("key sk-proj-0123456789abcdef echoed", f"key {REDACTED} echoed"),
        ("AIzaSyA0123456789abcdefghijklmnop", REDACTED),
        ("provided: sk-4o7Xd*****************2nNR.", f"provided: {REDACTED}."),
        ("provided: sk-proj-************2nNR. See", f"provided: {REDACTED}. See"),
        ("sk-ant-api03-****wxyz", REDACTED),
        ("a **bold** word and 2*3***4", "a **bold** word and 2*3***4"),
        ("sqlite:///var/x.db nothing secret", "sqlite:///var/x.db nothing secret"),
    ],
)
def test_patterns(text: str, want: str) -> None:
    assert scrub(text) == want


def test_given_and_registered_secrets_are_redacted_wherever_they_appear() -> None:
    assert scrub("echo gw-key-abc123 twice gw-key-abc123", ["gw-key-abc123"]) == (
        f"echo {REDACTED} twice {REDACTED}"
    )
    register("reg-SENTINEL-77aa")
    assert "reg-SENTINEL-77aa" not in scrub("said reg-SENTINEL-77aa")
    assert scrub_bytes(b'{"error":"bad key k-SECRET-1"}', ["k-SECRET-1"]) == (
        b'{"error":"bad key [redacted]"}'
    )


def test_a_broker_error_carries_no_credentials() -> None:
    """The message HTTP callers saw with two of three nodes down."""
    exc = BrokerUnavailable(f"nats://gateway:{PASSWORD}@127.0.0.1:4222", "connection closed")
    assert PASSWORD not in str(exc)
    assert PASSWORD not in exc.url
    assert str(exc) == "NATS unavailable at nats://127.0.0.1:4222: connection closed"


def test_log_records_are_scrubbed_whatever_the_handler(caplog: pytest.LogCaptureFixture) -> None:
    install_log_scrubbing()
    install_log_scrubbing()  # idempotent
    log = logging.getLogger("tokenwire.test.scrub")
    with caplog.at_level(logging.INFO):
        log.info("connecting to %s", f"nats://u:{PASSWORD}@h:1")
        try:
            raise RuntimeError(f"failed at nats://u:{PASSWORD}@h:1")
        except RuntimeError:
            log.exception("boom")
    assert caplog.records
    assert PASSWORD not in caplog.text
    assert "nats://h:1" in caplog.text
