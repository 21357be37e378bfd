"""The ``refgpt`` command: ``refgpt SUBCOMMAND ...`` (also ``python -m refgpt``).

Each subcommand lives in its own module in this package (``refgpt/cli/predict.py``, …) and provides
``add_parser(subparsers)`` (built with ``_chosen_model.add_subcommand``, which gives it the shared
options it declares in ``USES`` and refuses the others) and ``run(args) -> int``. Errors a user can cause end as one
line ``refgpt: error: …`` on stderr: exit status 2 for usage errors (argparse's convention), 1
for everything else. Never a traceback: a newline or other control character inside a message (a
path can hold one) is escaped, Python warnings are silenced (a value they would warn about ends in
an error of its own), and an exception refgpt did not expect — a bug — is still one line,
``refgpt: internal error: …``, exit status 3 (set REFGPT_TRACEBACK=1 to see the traceback).
Ctrl-C at any moment is exit status 130 and nothing printed (refgpt/__main__.py catches it during
the imports too); a closed or failing standard output is an error, any encoding works
(refgpt/cli/_output.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings

from ..errors import RefGPTError, one_line
from ..version import __version__
from . import (_output, attribute, compare, download, eval_lens, eval_sae, explore, generate, golden, inspect, lens,
               predict, steer, sweep, train_lens)

# The subcommands, in the order `refgpt --help` lists them.
COMMANDS = (predict, inspect, generate, attribute, golden, compare, steer, lens, train_lens, eval_lens, explore, eval_sae,
            sweep, download)


def name_of(command) -> str:
    """A subcommand's name: its module's (``predict``), or its ``NAME`` (``train-lens``)."""
    return getattr(command, "NAME", command.__name__.rpartition(".")[2])


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage errors: one line, exit status 2
        sys.stderr.write(f"refgpt: error: {one_line(message)}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="refgpt", description="A pure-NumPy reference GPT-2: predictions, LayerNorm "
                     "statistics and exact decompositions from the command line.")
    parser.add_argument("--version", action="version", version=f"refgpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv=None) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with _output.checked_streams():
                return _main(argv)
        except RefGPTError as error:
            return _fail(f"refgpt: error: {one_line(error)}", 1)
        except BrokenPipeError:  # `refgpt inspect … | head`: the reader left; that is not an error
            _output.forget_unwritten_output()  # nothing left to flush at exit
            return 0
        except _output.StdoutError as error:
            _output.forget_unwritten_output()
            return _fail(f"refgpt: error: cannot write the answer to standard output ({error.strerror})", 1)
        except (OSError, MemoryError) as error:  # after BrokenPipeError, which is an OSError too
            return _fail(f"refgpt: error: {one_line(error)}", 1)
        except KeyboardInterrupt:
            return 130
        except Exception as error:  # a bug in refgpt: still one line, unless asked for the traceback
            if os.environ.get("REFGPT_TRACEBACK"):
                raise
            return _fail(f"refgpt: internal error (please report): {type(error).__name__}: {one_line(error)}", 3)


def _fail(line: str, status: int) -> int:
    """Write the one line to stderr (if there is one: a closed stderr cannot hide the status)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    return status


def _main(argv) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if moved := lens.old_spelling(words):  # refgpt lens train|eval --text …: the command moved (issue 37)
        _Parser(prog="refgpt lens").error(moved)
    args = build_parser().parse_args(words)
    if getattr(args, "json", False):
        _output.set_json()
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
