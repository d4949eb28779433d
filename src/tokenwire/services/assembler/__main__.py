"""``python -m tokenwire.services.assembler``: the service configured by the environment.

Exit codes: 0 after SIGTERM/SIGINT (or a finished burst), 2 for a configuration or start error.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from tokenwire.config import ConfigError
from tokenwire.services.assembler import AssemblerError, AssemblerSettings, run


async def _main(settings: AssemblerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run(settings, stop)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = AssemblerSettings.from_env()
        asyncio.run(_main(settings))
    except (ConfigError, AssemblerError) as exc:
        print(f"tokenwire assembler: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
