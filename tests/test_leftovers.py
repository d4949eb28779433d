"""The stop report's registry (``tokenwire.leftovers``): what each part says it leaves."""

from __future__ import annotations

from tokenwire.leftovers import Leftovers, counted


def test_parts_say_what_they_hold_and_keep_their_last_words_when_removed() -> None:
    report = Leftovers(last_words=2)
    held = {"steps": 2}
    remove = report.add("assembler", lambda: f"{counted(held['steps'], 'open step')}")
    report.add("gateway", lambda: "")  # nothing held: no line
    assert report.lines() == ["assembler: 2 open steps"]
    held["steps"] = 1
    remove()
    remove()  # removing twice changes nothing
    assert report.lines() == ["assembler: 1 open step"]
    for name in ("a", "b", "c"):
        report.add(name, lambda: "something")()
    assert report.lines() == ["b: something", "c: something"]  # the last words are bounded


def test_a_part_that_cannot_tell_does_not_fail_the_report() -> None:
    report = Leftovers()

    def broken() -> str:
        raise RuntimeError("gone")

    report.add("telemetry", broken)
    assert report.lines() == ["telemetry: (could not tell: RuntimeError: gone)"]
