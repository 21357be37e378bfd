"""Every hook point of GPT-2, once: its TransformerLens name, where the forward pass reaches it, and
what each axis of its activation means.

    hook_embed, hook_pos_embed                                  [batch, pos, d_model]
    for each block L (names start with blocks.L.):
        hook_resid_pre                                          [batch, pos, d_model]
        ln1.hook_mean, ln1.hook_scale                           [batch, pos, 1]
        ln1.hook_normalized                                     [batch, pos, d_model]
        attn.hook_q, hook_k, hook_v                             [batch, pos, head, d_head]
        attn.hook_attn_scores, hook_pattern                     [batch, head, pos, key_pos]
        attn.hook_z                                             [batch, pos, head, d_head]
        hook_attn_out, hook_resid_mid                           [batch, pos, d_model]
        ln2.hook_mean, hook_scale, hook_normalized              as ln1's
        mlp.hook_pre, mlp.hook_post                             [batch, pos, d_mlp]
        hook_mlp_out, hook_resid_post                           [batch, pos, d_model]
    ln_final.hook_mean, hook_scale, hook_normalized             as ln1's

TransformerLens has more under cfg switches (config.TL_SWITCHES), off by default; with the
switch on the point is reached where TransformerLens reaches it (``OPTIONAL``):

    hook_tokens                 use_hook_tokens    [batch, pos]             before hook_embed
    blocks.L.attn.hook_result   use_attn_result    [batch, pos, head, d_model]   after attn.hook_z
    blocks.L.hook_mlp_in        use_hook_mlp_in    [batch, pos, d_model]    after hook_resid_mid
    blocks.L.hook_attn_in       use_attn_in        [batch, pos, head, d_model]   after hook_resid_pre
    blocks.L.hook_q_input, hook_k_input, hook_v_input
                                use_split_qkv_input  [batch, pos, head, d_model]  after hook_attn_in

With use_attn_in or use_split_qkv_input, attention reads a per-head copy of the stream, and ln1
runs on each of the query, key and value inputs (its hooks then have a head axis and run three
times; the cache keeps the last, the value input's), as in TransformerLens.

``pos`` of the attention scores and pattern is the query position. The model's ``hook_names``,
the cache's short keys (``cache["q", 3]``), the backward pass's gradient names, the oracle's
forward order and axis labels and the interventions' position axis all come from this table.
"""

from __future__ import annotations

import re

RESID = ("batch", "pos", "d_model")
STAT = ("batch", "pos", "1")
HEADS = ("batch", "pos", "head", "d_head")
PATTERN = ("batch", "head", "pos", "key_pos")

#: A LayerNorm's hook points (under ``blocks.L.ln1.``, ``blocks.L.ln2.``, ``ln_final.``).
LN_HOOKS = {"hook_mean": STAT, "hook_scale": STAT, "hook_normalized": RESID}
#: Attention's hook points (under ``blocks.L.attn.``), in forward order.
ATTN_HOOKS = {"hook_q": HEADS, "hook_k": HEADS, "hook_v": HEADS, "hook_attn_scores": PATTERN,
              "hook_pattern": PATTERN, "hook_z": HEADS}
#: The MLP's hook points (under ``blocks.L.mlp.``).
MLP_HOOKS = {"hook_pre": ("batch", "pos", "d_mlp"), "hook_post": ("batch", "pos", "d_mlp")}

#: Before the blocks, one block (names relative to ``blocks.L.``), after the blocks: name → axes.
EMBED = {"hook_embed": RESID, "hook_pos_embed": RESID}
BLOCK = {
    "hook_resid_pre": RESID,
    **{"ln1." + h: a for h, a in LN_HOOKS.items()},
    **{"attn." + h: a for h, a in ATTN_HOOKS.items()},
    "hook_attn_out": RESID,
    "hook_resid_mid": RESID,
    **{"ln2." + h: a for h, a in LN_HOOKS.items()},
    **{"mlp." + h: a for h, a in MLP_HOOKS.items()},
    "hook_mlp_out": RESID,
    "hook_resid_post": RESID,
}
FINAL = {"ln_final." + h: a for h, a in LN_HOOKS.items()}

#: Hook points behind TransformerLens's cfg switches: name (inside a block: relative to
#: ``blocks.L.``) → (switch, axes, the point it comes right after; None: first of all).
OPTIONAL = {
    "hook_tokens": ("use_hook_tokens", ("batch", "pos"), None),
    "hook_attn_in": ("use_attn_in", ("batch", "pos", "head", "d_model"), "hook_resid_pre"),
    "hook_q_input": ("use_split_qkv_input", ("batch", "pos", "head", "d_model"), "hook_resid_pre"),
    "hook_k_input": ("use_split_qkv_input", ("batch", "pos", "head", "d_model"), "hook_resid_pre"),
    "hook_v_input": ("use_split_qkv_input", ("batch", "pos", "head", "d_model"), "hook_resid_pre"),
    "attn.hook_result": ("use_attn_result", ("batch", "pos", "head", "d_model"), "attn.hook_z"),
    "hook_mlp_in": ("use_hook_mlp_in", RESID, "hook_resid_mid"),
}

_IN_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def hook_names(n_layers: int, switches=()) -> list[str]:
    """Every hook point of a GPT-2 with ``n_layers`` blocks, in the order the forward pass reaches them;
    with the ``OPTIONAL`` points whose switch is in ``switches`` (a set of names, or "all")."""
    on = {name for name, (switch, _, _) in OPTIONAL.items() if switches == "all" or switch in switches}
    block = []
    for name in BLOCK:
        block.append(name)
        block += [extra for extra in OPTIONAL if extra in on and OPTIONAL[extra][2] == name]
    blocks = [f"blocks.{L}.{name}" for L in range(n_layers) for name in block]
    return [*(["hook_tokens"] if "hook_tokens" in on else []), *EMBED, *blocks, *FINAL]


def switches_on(cfg) -> set[str]:
    """The switches of ``OPTIONAL`` that are on in ``cfg``."""
    return {switch for switch, _, _ in OPTIONAL.values() if getattr(cfg, switch, False)}


def switch_of(name: str):
    """The cfg switch hook point ``name`` needs, or None."""
    layer, rest = split(name)
    entry = OPTIONAL.get(rest)
    return entry[0] if entry and (layer is not None) == (rest != "hook_tokens") else None


def split(name: str) -> tuple[int | None, str]:
    """``blocks.3.attn.hook_q`` → (3, ``attn.hook_q``); a name outside the blocks → (None, name)."""
    m = _IN_BLOCK.fullmatch(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


def axes(name: str) -> tuple[str, ...] | None:
    """What each axis of hook point ``name``'s activation means (None: not a hook point)."""
    layer, rest = split(name)
    optional = {k: v[1] for k, v in OPTIONAL.items()}
    return {**BLOCK, **optional}.get(rest) if layer is not None else {**EMBED, **FINAL, **optional}.get(name)


def position_axis(name: str) -> int:
    """The axis that indexes (query) positions: 2 for attention scores and patterns, else 1."""
    return (axes(name) or RESID).index("pos")
