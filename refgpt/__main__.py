"""``python -m refgpt`` and the ``refgpt`` command (setup.cfg's console script): ``refgpt.cli.main``,
with Ctrl-C caught from the first moment refgpt's own code runs, the imports of numpy and the rest
(a second, on a cold disk) included: exit status 130 and nothing printed, as for a Ctrl-C later.
``import refgpt`` imports nothing, so this module starts before anything heavy is loaded."""

import signal
import sys


_SIGINT_SEEN = []


def _on_sigint(signum, frame):
    """Python's own Ctrl-C (a KeyboardInterrupt), remembered: a C extension interrupted while it
    initialises may turn it into an ImportError (numpy does: "PyCapsule_Import could not import
    module datetime"), which is still a Ctrl-C, not a broken install."""
    _SIGINT_SEEN.append(signum)
    raise KeyboardInterrupt


def main(argv=None) -> int:
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        try:
            from .cli import main as run
        except (ImportError, MemoryError, OSError) as error:  # numpy or safetensors could not load
            return interrupted() if _SIGINT_SEEN else cannot_start(error)
        return run(argv)
    except KeyboardInterrupt:
        return interrupted()


def cannot_start(error: BaseException) -> int:
    """One line and exit status 1 when refgpt's modules cannot even be imported (a broken install,
    or an address-space limit too tight to map numpy's or safetensors' libraries)."""
    reason = " ".join(str(error).split()) or type(error).__name__
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            reason += f" (the address-space limit, ulimit -v, is {limit / 2**20:,.0f} MiB)"
    except (ImportError, OSError, ValueError):
        pass
    try:
        sys.stderr.write(f"refgpt: error: cannot load refgpt's modules: {reason}\n")
    except (OSError, ValueError, AttributeError):
        pass
    return 1


def interrupted() -> int:
    """Ctrl-C: exit status 130; a second Ctrl-C while the process ends is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 130


def entry() -> None:
    """What the console script and ``python -m refgpt`` run: ``main``, then the exit with its status
    (Ctrl-C ignored from then on: nothing is left to interrupt, and a traceback from the interpreter's
    teardown is not an answer)."""
    try:
        status = main()
    except KeyboardInterrupt:
        status = interrupted()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)


if __name__ == "__main__":
    entry()
