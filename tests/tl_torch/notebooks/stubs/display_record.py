"""What the notebooks drew: every call of the display-only libraries they use (plotly,
circuitsvis, neel_plotly, pysvelte), with its arguments, for the notebook runner to compare
between refgpt and TransformerLens (tests/tl_torch/notebook_runner.py). Nothing is drawn."""

CALLS = []


def record(what, *args, **kwargs):
    CALLS.append((what, args, kwargs))


class Shown:
    """A figure or widget: every method call is recorded too (``show``, ``update_traces`` …)."""

    def __init__(self, what):
        self._what = what

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def method(*args, **kwargs):
            record(f"{self._what}.{name}", *args, **kwargs)
            return "" if name == "show_code" else self
        return method

    def __repr__(self):
        return f"<{self._what}>"


def recorder(what):
    def call(*args, **kwargs):
        record(what, *args, **kwargs)
        return Shown(what)
    call.__name__ = what.rsplit(".", 1)[-1]
    return call
