"""README's "The Python API, TransformerLens's way" block runs as printed (in a scratch directory)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_api_block_runs(tmp_path, monkeypatch, capsys):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The Python API, TransformerLens's way"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    model, tokens = namespace["model"], namespace["tokens"]
    assert tokens.shape[0] == 1 and tokens[0, 0] == model.tokenizer.bos_token_id
    assert namespace["logits"].shape == (1, tokens.shape[1], model.cfg.d_vocab)
    assert namespace["batch"][0, 0] == model.tokenizer.pad_token_id  # left-padded
    assert (tmp_path / "out" / "config.json").is_file()
    assert "<|endoftext|>" in capsys.readouterr().out
