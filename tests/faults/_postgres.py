"""A PostgreSQL the test starts itself (initdb / pg_ctl from /usr/lib/postgresql/*/bin, a
free port, a temporary directory), so an outage can be caused without touching the machine's
shared server. The server runs as the ``postgres`` user when the test runs as root."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenwire.broker import free_port

CTL_TIMEOUT_S = 60


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


@dataclass
class OwnPostgres:
    bindir: Path
    datadir: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=CTL_TIMEOUT_S, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def start(self) -> None:
        options = f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "-l",
            str(self.datadir / "server.log"),
            "start",
        )

    def stop(self) -> None:
        """An immediate shutdown: connections die as in a crash."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop")


@contextlib.contextmanager
def own_postgres() -> Iterator[OwnPostgres]:
    """initdb + start in a fresh temporary directory (outside pytest's private tmp, which the
    ``postgres`` user cannot enter); stopped and removed at the end."""
    bindir = pg_bin()
    assert bindir is not None, "no PostgreSQL binaries under /usr/lib/postgresql/*/bin"
    top = Path(tempfile.mkdtemp(prefix="tokenwire-pg-"))
    datadir = top / "data"
    try:
        datadir.mkdir()
        if os.geteuid() == 0:
            top.chmod(0o755)
            shutil.chown(datadir, "postgres", "postgres")
        pg = OwnPostgres(bindir, datadir, free_port())
        pg._run("initdb", "-D", str(datadir), "-A", "trust", "-U", "postgres", "--no-sync")
        pg.start()
        try:
            yield pg
        finally:
            with contextlib.suppress(AssertionError):
                pg.stop()
    finally:
        shutil.rmtree(top, ignore_errors=True)
