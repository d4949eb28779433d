"""tokenwire."""
