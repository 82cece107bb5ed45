"""The data layer's one error type, at the bottom of it (every loader and format imports it)."""


class BadSample(Exception):
    """A sample that cannot be used: a missing or corrupt file, or no valid depth."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason
