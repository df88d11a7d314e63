"""The exceptions of the ``contexture`` package.

Every error the package raises on purpose is a :class:`Error`; bad input is also a
:class:`ValueError`, so code written for the standard exceptions catches it too. A Python
object that is not JSON-shaped where JSON is expected raises :class:`TypeError`.
"""


class Error(Exception):
    """The base class of the package's errors."""


class InputError(Error, ValueError):
    """Bad input: a message list, a policy, a model or rules name, a template context.

    The message says what was wrong and where (``messages[3].tool_calls[0].id: ...``).
    """


class FitError(Error):
    """A message list that cannot be fitted into its budget (its system prompt and pinned
    messages alone are over it, say)."""


class TemplateError(InputError):
    """A template that does not parse, or a render that fails (an undefined variable)."""


class StoreError(Error):
    """The thread store failed: the file cannot be opened, the thread does not exist."""


__all__ = ["Error", "InputError", "FitError", "TemplateError", "StoreError"]
