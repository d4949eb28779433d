"""Benchmarks: each ``bench/bench_*.py`` has ``main() -> str`` returning a Markdown table."""
