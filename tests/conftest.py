"""Root fixtures: each fixture module is one chain of real parts (see PRINCIPLES.md, 8)."""

pytest_plugins = [
    "tests.fixtures.recordings",
    "tests.fixtures.broker",
    "tests.fixtures.stores",
    "tests.scheduling",
]
