"""The one exception refgpt raises on bad input.

Every error a user can cause (a broken checkpoint, a bad config, tokens out of range, ...) is a
``RefGPTError``. It subclasses ``ValueError`` so ``except ValueError`` keeps working, and its
message names the file, key, shape or value at fault — never a raw traceback from deep inside.
"""


class RefGPTError(ValueError):
    """Bad input to refgpt: the message says which file, key, shape or value is at fault."""
