"""Checkpoints that ship inside refgpt, installed as the package ``refgpt.weights``.

``default/`` is the embedded default model every ``refgpt`` command uses when no ``--model`` is
given (``refgpt.default_model_path()``, ``refgpt.load_default()``): a small GPT-2 trained on
Shakespeare by ``train_default.py``, with its training record. ``README.md`` records its config,
shapes, sha256 and how it was made. No code runs on import.
"""
