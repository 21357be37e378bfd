"""Ported from TransformerLens 3.9's tests/integration/test_utils_tokens.py and test_prepend_bos.py:
each body runs on refgpt and on TransformerLens (same random float64 GPT-2, real GPT-2 tokenizer;
tests/tl_port.py) and the results are compared. TL's pretrained "solu-1l"/"gpt2"/"opt-125m" are
replaced by that model (GPT-2 only: OPT is not GPT-2). Departures, on purpose
(docs/transformerlens.md): refgpt raises ``RefGPTError`` where TransformerLens raises
``AssertionError``; refgpt's tokens are NumPy int64 arrays, not torch tensors (it also reads torch
tensors: ``to_str_tokens(torch.tensor(...))`` works)."""

from __future__ import annotations

import numpy as np
import pytest

import peers as P

torch, transformers, transformer_lens = P.require_peers()
pytestmark = pytest.mark.peer  # every test here compares with a peer (the peers extra)

import tl_port  # noqa: E402
from tl_port import N  # noqa: E402
from refgpt import RefGPTError  # noqa: E402


@pytest.fixture(params=["refgpt", "torch"])
def pair(tl_pair, tl_torch, request):
    """(refgpt's model, TransformerLens): refgpt's NumPy model, or its torch-facing model (which runs
    TransformerLens's bodies as written); built once per session, reset around each test."""
    return tl_pair if request.param == "refgpt" else (tl_torch, tl_pair[1])


def both(pair):
    ref, tl = pair
    ref.cfg.default_prepend_bos = tl.cfg.default_prepend_bos = True
    ref.tokenizer.padding_side = tl.tokenizer.padding_side = "right"
    return (("refgpt", ref, RefGPTError), ("tl", tl, AssertionError))


# ---- test_utils_tokens.py ---------------------------------------------------------------------


def test_to_str_tokens(pair):
    results = {}
    for lib, model, _ in both(pair):
        out = []
        for make in (torch.tensor, np.array):
            for nested in ([1], [[6]], [[1, 2, 3]]):
                str_tokens = model.to_str_tokens(make(nested))
                assert isinstance(str_tokens, list) and all(isinstance(s, str) for s in str_tokens)
                assert len(str_tokens) == len(np.ravel(nested))
                out.append(str_tokens)
        single = model.to_single_str_token(3)
        assert isinstance(single, str)
        results[lib] = (out, single)
    assert results["refgpt"] == results["tl"]


@pytest.mark.parametrize("prepend_space_to_answer,tokenized_answer", [(True, [" le", "."]), (False, ["le", "."])])
def test_test_prompt(tl_torch, tl_pair, prepend_space_to_answer, tokenized_answer):
    """TL's body as written (solu-1l's "<|BOS|>" is GPT-2's "<|endoftext|>"), on refgpt's torch-facing
    model and on TL: the same printed tokenization and the same printed numbers. (DEPARTURE 2.19
    for the NumPy model: TL's test_prompt needs torch tensors; it is not run there.)"""
    from unittest import mock

    from transformer_lens import utilities as utils

    tokenized_prompt = ["<|endoftext|>", "The", " circumference", " is", " the", " perimeter", " of", " the", " circ"]
    calls = []
    for model in (tl_torch, tl_pair[1]):
        with mock.patch("builtins.print") as mocked_print:
            utils.test_prompt("The circumference is the perimeter of the circ", "le.", model,
                              prepend_space_to_answer=prepend_space_to_answer)
        assert mocked_print.mock_calls[0] == mock.call("Tokenized prompt:", tokenized_prompt)
        assert mocked_print.mock_calls[1] == mock.call("Tokenized answer:", tokenized_answer)
        calls.append(mocked_print.mock_calls)
    assert calls[0] == calls[1]


# ---- test_prepend_bos.py ----------------------------------------------------------------------

PROMPT = "Hello world!"


def check_first_token(model, str_tokens, tokens, intended_prepend_bos):
    if intended_prepend_bos:
        assert str_tokens[0] == model.tokenizer.bos_token
        assert tokens[0][0] == model.tokenizer.bos_token_id
    else:
        assert str_tokens[0] != model.tokenizer.bos_token
        assert tokens[0][0] != model.tokenizer.bos_token_id


def expected_tokens(prompt, intended_prepend_bos):
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(str(tl_port.TOKENIZER_DIR))
    return len(tokenizer(prompt)["input_ids"]) + int(intended_prepend_bos)


def check_tokens_length(logits, str_tokens, tokens, intended_prepend_bos):
    assert logits.shape[1] == len(str_tokens) == tokens.shape[1] == expected_tokens(PROMPT, intended_prepend_bos)


def test_default_prepend_bos(pair):
    outs = {}
    for lib, model, _ in both(pair):
        assert model.cfg.default_prepend_bos is True, "Default prepend_bos should be True"
        logits = model(PROMPT)  # [batch pos d_vocab]
        str_tokens = model.to_str_tokens(PROMPT)
        tokens = model.to_tokens(PROMPT)  # [batch pos]
        check_first_token(model, str_tokens, tokens, True)
        check_tokens_length(logits, str_tokens, tokens, True)
        assert model.get_token_position(model.tokenizer.bos_token_id, PROMPT) == 0
        outs[lib] = (logits, str_tokens, N(tokens))
    assert tl_port.close(outs["refgpt"][0], outs["tl"][0])
    assert outs["refgpt"][1] == outs["tl"][1] and np.array_equal(outs["refgpt"][2], outs["tl"][2])


def test_default_prepend_bos_to_false(pair):
    outs = {}
    for lib, model, _ in both(pair):
        model.cfg.default_prepend_bos = False  # from_pretrained(default_prepend_bos=False)
        logits = model(PROMPT)
        str_tokens = model.to_str_tokens(PROMPT)
        tokens = model.to_tokens(PROMPT)
        check_first_token(model, str_tokens, tokens, False)
        check_tokens_length(logits, str_tokens, tokens, False)
        outs[lib] = logits
    assert tl_port.close(outs["refgpt"], outs["tl"])


@pytest.mark.parametrize("intended_prepend_bos", [True, False])
def test_override_prepend_bos(pair, intended_prepend_bos):
    outs = {}
    for lib, model, _ in both(pair):
        for default_prepend_bos in [True, False]:
            model.cfg.default_prepend_bos = default_prepend_bos
            logits = model(PROMPT, prepend_bos=intended_prepend_bos)
            str_tokens = model.to_str_tokens(PROMPT, prepend_bos=intended_prepend_bos)
            tokens = model.to_tokens(PROMPT, prepend_bos=intended_prepend_bos)
            check_first_token(model, str_tokens, tokens, intended_prepend_bos)
            check_tokens_length(logits, str_tokens, tokens, intended_prepend_bos)
            outs[lib, default_prepend_bos] = logits
    for default in (True, False):
        assert tl_port.close(outs["refgpt", default], outs["tl", default])


def test_prepend_bos_with_get_token_position(pair):
    for lib, model, error in both(pair):
        assert model.get_token_position(model.tokenizer.bos_token_id, PROMPT) == 0
        with pytest.raises(error):  # TL: AssertionError; refgpt: RefGPTError
            model.get_token_position(model.tokenizer.bos_token_id, PROMPT, prepend_bos=False)
        model.cfg.default_prepend_bos = False
        with pytest.raises(error):
            model.get_token_position(model.tokenizer.bos_token_id, PROMPT)
        assert model.get_token_position(model.tokenizer.bos_token_id, PROMPT, prepend_bos=True) == 0


def test_same_tokenization(pair):
    prompts = ["Italy is in Europe.", "Pyeongchang Olympics was held in 2018", "2023-09-09", "287594812673495"]
    outs = {}
    for lib, model, _ in both(pair):
        model.tokenizer.padding_side = "right"
        for input in [PROMPT, prompts]:
            tokens_with_bos = N(model.to_tokens(input, prepend_bos=True))
            tokens_without_bos = N(model.to_tokens(input, prepend_bos=False))
            assert np.array_equal(tokens_with_bos[..., 1:], tokens_without_bos)
            str_tokens_with_bos = model.to_str_tokens(input, prepend_bos=True)
            str_tokens_without_bos = model.to_str_tokens(input, prepend_bos=False)
            if isinstance(str_tokens_with_bos[0], list):
                for i in range(len(str_tokens_with_bos)):
                    assert str_tokens_with_bos[i][1:] == str_tokens_without_bos[i]
            else:
                assert str_tokens_with_bos[1:] == str_tokens_without_bos
            outs[lib, isinstance(input, list)] = (tokens_with_bos, str_tokens_with_bos)
    for batched in (False, True):
        assert np.array_equal(outs["refgpt", batched][0], outs["tl", batched][0])
        assert outs["refgpt", batched][1] == outs["tl", batched][1]


# ---- beyond the ported files: the examples, against TL -------------------------------


def test_endoftext_in_text_is_the_special_token_and_batches_pad_like_tl(pair):
    texts = ["a<|endoftext|>b", "The quick brown fox", "x"]
    for side in ("left", "right"):
        got = {lib: N(model.to_tokens(texts, padding_side=side)) for lib, model, _ in both(pair)}
        assert np.array_equal(got["refgpt"], got["tl"]), side
    ref, tl = pair
    assert ref.to_string(ref.to_tokens(texts)) == tl.to_string(tl.to_tokens(texts))
    assert ref.to_single_token(" be") == tl.to_single_token(" be")
    with pytest.raises(RefGPTError, match="not one"):
        ref.to_single_token(" be or")
    long = "word " * 100
    assert np.array_equal(ref.to_tokens(long), N(tl.to_tokens(long)))  # truncated to n_ctx = 64 as TL
    assert ref.to_tokens(long, truncate=False).shape[1] == 1 + 101  # BOS, 100 words, the last space


def test_forward_keywords_equal_tl(pair):
    """Beyond the ported files: return_type, loss_per_token, start_at_layer/stop_at_layer, text input."""
    ref, tl = pair
    for m in (ref, tl):
        m.cfg.default_prepend_bos = True
    texts = ["To be, or not to be", "that is the question"]
    assert close_all(ref(texts, return_type="loss"), tl(texts, return_type="loss"))
    assert close_all(ref(texts, return_type="loss", loss_per_token=True), tl(texts, return_type="loss", loss_per_token=True))
    (l1, s1), (l2, s2) = ref(texts, return_type="both"), tl(texts, return_type="both")
    assert close_all(l1, l2) and close_all(s1, s2)
    assert ref(texts, return_type=None) is None and tl(texts, return_type=None) is None
    for stop in (0, 1, -1):
        assert close_all(ref(texts, stop_at_layer=stop), tl(texts, stop_at_layer=stop))
    resid = ref(texts, stop_at_layer=1)
    tokens = ref.to_tokens(texts)
    for start in (1, -1):
        got = ref(resid if start == 1 else ref(texts, stop_at_layer=-1), start_at_layer=start, tokens=tokens, return_type="both")
        want = tl(torch.tensor(resid if start == 1 else ref(texts, stop_at_layer=-1)), start_at_layer=start,
                  tokens=torch.tensor(tokens), return_type="both")
        assert close_all(got[0], want[0]) and close_all(got[1], want[1])
    for side in ("left", "right"):
        a = ref(texts, padding_side=side, return_type="loss", loss_per_token=True)
        b = tl(texts, padding_side=side, return_type="loss", loss_per_token=True)
        assert close_all(a, b), side


def close_all(a, b):
    return tl_port.close(np.asarray(N(a)), np.asarray(N(b)))
