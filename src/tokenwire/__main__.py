"""``python -m tokenwire`` is the ``tokenwire`` command."""

from tokenwire.cli import main

raise SystemExit(main())
