"""One exception type for every input a user can get wrong.

The CLI turns an `LmlabError` into one sentence on stderr and exit code 2, never a traceback.
The message says what was wrong and what to do about it.
"""


class LmlabError(Exception):
    """A problem with the user's input or environment, explained in one sentence."""

    exit_code = 2
