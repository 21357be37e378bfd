"""Checkpoints that ship inside refgpt, installed as the package ``refgpt.weights``.

``default/`` is the embedded default model every ``refgpt`` command uses when no ``--model`` is
given (``refgpt.default_model_path()``, ``refgpt.load_default()``); ``make_default.py`` is the
script that made it and ``README.md`` records its config, shapes and sha256. No code lives here.
"""
