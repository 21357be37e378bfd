"""The one exception refgpt raises on bad input.

Every error a user can cause (a broken checkpoint, a bad config, tokens out of range, ...) is a
``RefGPTError``. It subclasses ``ValueError`` so ``except ValueError`` keeps working, and its
message names the file, key, shape or value at fault — never a raw traceback from deep inside.
An activation missing from a cache is reported one way, by ``need``, wherever it is missed.
"""


class RefGPTError(ValueError):
    """Bad input to refgpt: the message says which file, key, shape or value is at fault."""


class MissingActivation(RefGPTError, KeyError):
    """An activation the cache does not hold: a KeyError (the cache is a Mapping) and a RefGPTError
    (the CLI prints it on one line)."""

    def __str__(self):
        return str(self.args[0])


def need(cache, name, user=None, hint=None):
    """``cache[name]``, or the one error for a missing activation: who needed it, and how to cache it.

    ``user``: what needed it ("attribute"); ``hint``: how to get it, by default caching every hook
    point. Every reader of a cache that needs an activation asks for it here.
    """
    if name in cache:
        return cache[name]
    who = f"{user}: " if user else ""
    raise MissingActivation(f"{who}the cache has no {name!r}; "
                            f"{hint or 'run_with_cache without names= caches every hook point'}")
