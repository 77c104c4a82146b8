"""The one exception type users see.

Every refusal names the node it is about and says what to change, because a compiler error that only
says "invalid attribute" sends the user to read our source.
"""


class SparseLowerError(ValueError):
    """A model, attribute or option that sparse_lower cannot take, with the node and the fix."""

    def __init__(self, message: str, node: str | None = None, fix: str | None = None):
        self.node = node
        self.reason = message
        self.fix = fix
        text = f"node '{node}': {message}" if node else message
        if fix:
            text += f" (fix: {fix})"
        super().__init__(text)


class SparseLowerWarning(UserWarning):
    """Something sparse_lower did differently from what a model declares, and why; the result is still
    what the model's own runtime computes (for example a stale attribute that runtime ignores)."""
