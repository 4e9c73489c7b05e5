"""The one error a release step raises: a refusal that fits on one line and names what to fix."""


class ReleaseError(Exception):
    """A gate refused, or a step failed; the message is the whole explanation."""
