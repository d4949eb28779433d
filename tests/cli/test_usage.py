"""``tokenwire usage`` in process (``tokenwire.cli.main``) against a real SQLite store.

The store is filled by commits of a known fleet (tests/store/ledger_fleet.py); expected rows
are that fleet's lines summed here, never read from the store.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.store.ledger_fleet import expected_line, fleet, grouped, step, totals
from tokenwire.cli import main
from tokenwire.ledger import TOKEN_FIELDS, StepUsage, UsageTotals
from tokenwire.schemas import TokenUsage
from tokenwire.store import StepRecord, open_store


def fill(url: str, records: list[StepRecord]) -> None:
    async def commit() -> None:
        store = open_store(url)
        try:
            await store.commit(records)
        finally:
            await store.close()

    asyncio.run(commit())


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """TOKENWIRE_STORE at a SQLite file holding the fleet."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    for name in ("TOKENWIRE_NATS_URL", "TOKENWIRE_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOKENWIRE_STORE", url)
    fill(url, fleet())
    return url


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["usage", *argv, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def as_totals(row: dict[str, Any]) -> UsageTotals:
    return UsageTotals(
        steps=row["steps"],
        reported=row["reported"],
        priced=row["priced"],
        cost_pusd=row["cost_pusd"] or 0,
        **{n: row[n] for n in TOKEN_FIELDS},
    )


def lines() -> list[StepUsage]:
    return [expected_line(r) for r in fleet()]


@pytest.mark.parametrize(
    ("by", "key"),
    [
        ("model", lambda li: f"{li.provider}/{li.model}"),
        ("provider", lambda li: li.provider),
        ("key", lambda li: li.key_name),
        ("tenant", lambda li: li.tenant),
        ("session", lambda li: li.session),
        ("day", lambda li: li.day),
    ],
)
def test_json_rows_and_total_are_the_sums_of_the_lines(store_env, capsys, by, key) -> None:
    doc = run_json(capsys, "--by", by)
    assert doc["by"] == by
    assert {r[by]: as_totals(r) for r in doc["rows"]} == grouped(lines(), key)
    assert as_totals(doc["total"]) == totals(lines())
    priced = [r for r in doc["rows"] if r["priced"]]
    assert all(r["cost_usd"] == r["cost_pusd"] / 10**12 for r in priced)
    assert all(r["cost_usd"] is None for r in doc["rows"] if not r["priced"])


def test_the_default_grouping_is_model_and_the_table_has_a_total(store_env, capsys) -> None:
    assert main(["usage"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["model", "steps", "input"]
    by_model = grouped(lines(), lambda li: f"{li.provider}/{li.model}")
    assert [row.split()[0] for row in out[1:]] == [*by_model, "total"]
    scripted = next(row for row in out if row.startswith("scripted/tools"))
    assert scripted.split()[1:] == ["1", "10", "8", "0", "0", "0", "-", "1"]  # unpriced: "-"
    total = totals(lines())
    assert out[-1].split()[1] == str(total.steps)
    assert out[-1].split()[-2] == f"{total.cost_pusd / 10**12:.6f}"


def test_since_and_tenant_filter(store_env, capsys) -> None:
    late = [li for li in lines() if li.day >= "2026-01-06"]
    assert as_totals(run_json(capsys, "--since", "2026-01-06")["total"]) == totals(late)
    acme = [li for li in lines() if li.tenant == "acme"]
    assert as_totals(run_json(capsys, "--tenant", "acme")["total"]) == totals(acme)
    none = [li for li in lines() if li.tenant is None]
    assert as_totals(run_json(capsys, "--tenant", "")["total"]) == totals(none)


def test_relative_since_counts_today(store_env, capsys) -> None:
    now = datetime.now(UTC)
    fill(
        store_env,
        [
            step(
                "today",
                0,
                0,
                TokenUsage(input_tokens=7, output_tokens=1),
                at_ns=int(now.timestamp() * 10**9),
            )
        ],
    )
    doc = run_json(capsys, "--since", "1d", "--by", "session")
    assert doc["since"] == now.date().isoformat()
    assert [r["session"] for r in doc["rows"]] == ["today"]
    week = run_json(capsys, "--since", "7d")["since"]
    assert week == (now.date() - timedelta(days=6)).isoformat()


def test_session_lists_its_steps_with_tokens_and_cost(store_env, capsys) -> None:
    doc = run_json(capsys, "--session", "a")
    expected = [li for li in lines() if li.session == "a"]
    assert [(s["turn"], s["step"], s["cost_pusd"], s["cost_reason"]) for s in doc["steps"]] == [
        (li.turn, li.step, li.cost_pusd, li.cost_reason) for li in expected
    ]
    assert doc["steps"][2]["input_tokens"] is None  # not reported: absent, not 0
    assert as_totals(doc["total"]) == totals(expected)
    assert main(["usage", "--session", "a"]) == 0
    table = capsys.readouterr().out
    assert "no usage reported" in table
    assert "genai-prices" in table


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--since", "yesterday"], 2, "since 'yesterday'"),
        (["--since", "0d"], 2, "1 <= N"),
        (["--by", "colour"], 2, "colour"),
        (["--session", "a", "--by", "model"], 2, "takes no --by"),
        (["--session", "bad id!"], 2, "invalid session id"),
        (["--session", "nobody"], 1, "has no usage lines"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(store_env, capsys, argv, code, message) -> None:
    assert main(["usage", *argv]) == code
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_an_unreachable_store_is_exit_1(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TOKENWIRE_STORE", "postgresql://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("TOKENWIRE_CONNECT_TIMEOUT_S", "1")
    assert main(["usage"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("tokenwire: store not reachable")
