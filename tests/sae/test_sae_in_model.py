"""SAEs in the model, SAELens's HookedSAETransformer as the judge: spliced logits, cached feature
activations and reconstructions agree, and with use_error_term the stream is the unspliced one."""

from __future__ import annotations

import numpy as np
import pytest

import refgpt
from peers import random_hf_config, random_hf_model, require_peers, save_hf_layout, tl_model_from_hf
from refgpt.errors import RefGPTError
from refgpt.sae import in_model
from refgpt.tl import processing
from sae_peer import require_sae_lens, sae_lens_sae

#: refgpt and TransformerLens compute the same float64 forward pass in other orders: the logits
#: agree to TL_TOL (tests/peers.py, measured), and the SAE adds a few float64 products.
TOL = 1e-10
HOOKS = ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_z", "blocks.0.hook_mlp_out", "blocks.1.hook_resid_post"]


pytestmark = pytest.mark.peer  # every test here runs SAELens's HookedSAETransformer beside refgpt


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(refgpt model, SAELens HookedSAETransformer) holding one random GPT-2's float64 weights."""
    require_peers()
    sae_lens = require_sae_lens()
    config = random_hf_config(11, act_fns=("gelu_new",), n_layer=2, n_head=2, n_embd=8, vocab_size=40,
                              n_positions=16)
    hf = random_hf_model(config, seed=11)
    model = refgpt.load(save_hf_layout(hf, tmp_path_factory.mktemp("model"), "F64"))
    tl = tl_model_from_hf(hf)
    hooked = sae_lens.HookedSAETransformer(tl.cfg)
    hooked.load_state_dict(tl.state_dict(), strict=False)
    hooked.eval()
    return model, hooked


def _both(tmp_path, model, hook, architecture="standard", seed=0, **cfg):
    d_in = model.cfg.d_model
    if "hook_z" in hook:
        cfg["reshape_activations"] = "hook_z"
    peer = sae_lens_sae(architecture, d_in, 20, seed=seed, hook_name=hook, **cfg)
    peer.save_model(tmp_path / "sae")
    if "hook_z" in hook:
        peer.turn_on_forward_pass_hook_z_reshaping()
    return peer, refgpt.load_sae(tmp_path / "sae")


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(1e-300, np.max(np.abs(b))))


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("architecture", ["standard", "topk", "jumprelu", "gated"])
def test_spliced_and_error_term_runs_agree_with_sae_lens(tmp_path, pair, hook, architecture):
    import torch

    model, hooked = pair
    peer, sae = _both(tmp_path, model, hook, architecture, **({"k": 4} if architecture == "topk" else {}))
    tokens = np.random.default_rng(1).integers(0, model.cfg.d_vocab, (2, 7))  # [batch, pos]
    with torch.no_grad():
        theirs, their_cache = hooked.run_with_cache_with_saes(torch.tensor(tokens), saes=[peer])
        their_error_logits = hooked.run_with_saes(torch.tensor(tokens), saes=[peer], use_error_term=True)
        plain_theirs = hooked(torch.tensor(tokens))
    ours, cache = in_model.run_with_cache_with_saes(model, tokens, saes=[sae], check=False)
    assert rel(ours, theirs.numpy()) <= TOL
    acts = cache[f"{hook}.hook_sae_acts_post"]
    assert np.array_equal(acts > 0, their_cache[f"{hook}.hook_sae_acts_post"].numpy() > 0)
    assert rel(acts, their_cache[f"{hook}.hook_sae_acts_post"].numpy()) <= TOL
    assert rel(cache[f"{hook}.hook_sae_recons"], their_cache[f"{hook}.hook_sae_recons"].numpy()) <= TOL
    # use_error_term: SAELens's stream is the unspliced one to rounding; refgpt's is it bit for bit
    plain = model(tokens)
    with_error = in_model.run_with_saes(model, tokens, saes=[sae], use_error_term=True, check=False)
    assert np.array_equal(with_error, plain)
    assert rel(their_error_logits.numpy(), plain_theirs.numpy()) <= TOL
    assert rel(with_error, their_error_logits.numpy()) <= TOL


def test_features_edited_under_the_error_term_agree_with_sae_lens(tmp_path, pair):
    import torch

    model, hooked = pair
    hook = "blocks.1.hook_resid_pre"
    peer, sae = _both(tmp_path, model, hook, seed=2)
    tokens = np.random.default_rng(3).integers(0, model.cfg.d_vocab, (1, 6))
    with torch.no_grad():
        with hooked.saes(saes=[peer], use_error_term=True):
            theirs = hooked.run_with_hooks(
                torch.tensor(tokens),
                fwd_hooks=[(f"{hook}.hook_sae_acts_post", lambda a, hook: a + torch.eye(20, dtype=a.dtype)[5] * 3.0)])
    ours, cache = in_model.run_with_cache_with_saes(
        model, tokens, saes=[sae], use_error_term=True, check=False,
        sae_hooks=[(f"{hook}.hook_sae_acts_post", in_model.steer_features({5: 3.0}))])
    assert rel(ours, theirs.numpy()) <= TOL
    resid = cache[hook]  # the stream as it flowed on: x + 3·W_dec[5], exactly the edit through the decoder
    _, plain = model.run_with_cache(tokens, names=[hook])
    assert rel(resid - plain[hook], np.broadcast_to(3.0 * sae.W_dec[5], resid.shape)) <= 1e-12


def test_a_transcoder_reads_one_hook_and_writes_another(tmp_path, pair):
    model, _ = pair
    peer = sae_lens_sae("skip_transcoder", model.cfg.d_model, 12, seed=4, hook_name="blocks.0.hook_resid_mid",
                        hook_name_out="blocks.0.hook_mlp_out")
    peer.save_model(tmp_path / "tc")
    tc = refgpt.load_sae(tmp_path / "tc")
    tokens = np.random.default_rng(5).integers(0, model.cfg.d_vocab, (1, 5))
    _, cache = in_model.run_with_cache_with_saes(model, tokens, saes=[tc], check=False)
    _, plain = model.run_with_cache(tokens, names=["blocks.0.hook_resid_mid"])
    assert np.array_equal(cache["blocks.0.hook_mlp_out"], tc.forward(plain["blocks.0.hook_resid_mid"]))
    assert np.array_equal(in_model.run_with_saes(model, tokens, saes=[tc], use_error_term=True, check=False),
                          model(tokens))


def test_weight_processing_is_checked(tmp_path, pair):
    """An SAE trained on centred writing weights refuses the raw model, and the reverse (#405)."""
    model, _ = pair
    _, sae = _both(tmp_path, model, "blocks.1.hook_resid_pre")
    tokens = np.arange(4)[None]
    in_model.run_with_saes(model, tokens, saes=[sae])  # trained raw, run raw
    centred = processing.process(model, ["center_writing_weights"])
    with pytest.raises(RefGPTError, match="center_writing_weights=False .* are centred"):
        in_model.run_with_saes(centred, tokens, saes=[sae])
    sae.cfg["metadata"]["model_from_pretrained_kwargs"] = {"center_writing_weights": True}
    in_model.run_with_saes(centred, tokens, saes=[sae])
    with pytest.raises(RefGPTError, match="center_writing_weights=True .* are not centred"):
        in_model.run_with_saes(model, tokens, saes=[sae])
    z_sae = _both(tmp_path, model, "blocks.0.attn.hook_z")[1]
    with pytest.raises(RefGPTError, match="fold_value_biases=False"):
        in_model.run_with_saes(processing.process(model, True), tokens, saes=[z_sae])


def test_a_hook_the_model_lacks_or_another_dtype_is_refused(tmp_path, pair):
    model, _ = pair
    _, sae = _both(tmp_path, model, "blocks.7.hook_resid_pre")
    with pytest.raises(RefGPTError, match="'blocks.7.hook_resid_pre' is not a hook point"):
        in_model.run_with_saes(model, np.arange(3)[None], saes=[sae])
    _, sae = _both(tmp_path, model, "blocks.1.hook_resid_pre")
    with pytest.raises(RefGPTError, match="float32, the model float64"):
        in_model.run_with_saes(model, np.arange(3)[None], saes=[refgpt.load_sae(tmp_path / "sae", "float32")])


@pytest.mark.parametrize("architecture", ["transcoder", "jumprelu_transcoder", "skip_transcoder"])
def test_transcoders_in_the_model_agree_with_sae_lens(tmp_path, pair, architecture):
    """A transcoder from blocks.0.hook_resid_mid to blocks.0.hook_mlp_out, spliced in. SAELens 6.54's
    HookedSAETransformer runs ``decode(encode(x))``, which for a skip transcoder leaves out
    x·W_skipᵀ (only SkipTranscoder.forward adds it); refgpt runs the transcoder's forward, so there
    the two differ by exactly that term, carried through the rest of the model."""
    import torch

    model, hooked = pair
    peer = sae_lens_sae(architecture, model.cfg.d_model, 12, seed=6, hook_name="blocks.0.hook_resid_mid",
                        hook_name_out="blocks.0.hook_mlp_out")
    peer.save_model(tmp_path / "tc")
    tc = refgpt.load_sae(tmp_path / "tc")
    tokens = np.random.default_rng(7).integers(0, model.cfg.d_vocab, (2, 5))
    with torch.no_grad():
        theirs, their_cache = hooked.run_with_cache_with_saes(torch.tensor(tokens), saes=[peer])
    ours, cache = in_model.run_with_cache_with_saes(model, tokens, saes=[tc], check=False)
    acts = "blocks.0.hook_mlp_out.hook_sae_acts_post"
    assert rel(cache[acts], their_cache[acts].numpy()) <= TOL
    if architecture != "skip_transcoder":
        assert rel(ours, theirs.numpy()) <= TOL
        return
    skip = cache["blocks.0.hook_resid_mid"] @ tc.W_skip.T  # [batch, pos, d_model]
    output = "blocks.0.hook_mlp_out.hook_sae_output"
    assert np.array_equal(cache[output], cache["blocks.0.hook_mlp_out"])  # what flowed on
    assert rel(cache[output] - skip, their_cache[output].numpy()) <= TOL
    assert rel(ours, theirs.numpy()) > 1e-3  # and so the logits differ
