"""``python -m tokenwire.variables``: print the reference table of every variable."""

from tokenwire.variables import reference_markdown

print(reference_markdown(), end="")
