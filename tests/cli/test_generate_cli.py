"""`refgpt generate`: the continuation the Python API gives, as text or JSON; clear errors."""

from __future__ import annotations

import json

import pytest

import refgpt

pytestmark = pytest.mark.slow  # every test here runs generation end to end, seconds each


def test_generate_json_equals_python_api(refgpt_cli):
    done = refgpt_cli("generate", "Hello", "-n", "6", "--temperature", "0", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    model = refgpt.load_default()
    prompt = model.to_tokens("Hello", prepend_bos=False)[0]
    expected = model.generate(prompt, 6, temperature=0, stop_at_eos=False)[len(prompt):]
    assert [t["id"] for t in answer["new_tokens"]] == expected.tolist()
    assert answer["continuation"] == model.to_string(expected)


def test_generate_sampling_is_seeded(refgpt_cli):
    a = refgpt_cli("generate", "Hi", "-n", "8", "--top-k", "5", "--seed", "3", "--json")
    b = refgpt_cli("generate", "Hi", "-n", "8", "--top-k", "5", "--seed", "3", "--json")
    assert a.returncode == 0 and json.loads(a.stdout)["new_tokens"] == json.loads(b.stdout)["new_tokens"]


def test_generate_errors_are_one_line(refgpt_cli):
    too_long = refgpt_cli("generate", "Hello", "-n", "100000")
    assert too_long.returncode == 1
    # "Hello" is 3 tokens in the default vocabulary (H, ell, o); its context is 128 positions.
    assert too_long.stderr.startswith("refgpt: error: generate: 3 prompt tokens + 100000 new exceed n_positions=128")
    assert len(too_long.stderr.strip().splitlines()) == 1
    usage = refgpt_cli("generate", "Hello", "--temperature", "-1")
    assert usage.returncode == 2 and "refgpt: error:" in usage.stderr and "Traceback" not in usage.stderr
