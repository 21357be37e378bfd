"""What tests/tl_torch/test_notebooks.py expects of each demo notebook's cells, by code-cell index
(0 = the notebook's first code cell), with the reason for every entry.

Every cell not listed here that runs on TransformerLens (3.9, or TL 4's bridge where 3.9 cannot)
must run on refgpt's torch-facing model and agree.
"""

#: Cells left for REFGPT_NOTEBOOKS=long (beside TL's own ``# NBVAL_SKIP`` cells): loops of hundreds
#: of forward passes over a 50,257-token vocabulary, and the cells that only show their results.
#: Measured on the default run's machine (2 shared cores), refgpt's process.
LONG = {
    "Exploratory_Analysis_Demo": [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 34, 37, 43],
    "Activation_Patching_in_TL_Demo": [12, 13],
    "Head_Detector_Demo": [22],
    "Patchscopes_Generation_Demo": [17, 19],
}

#: Cells of TL's NBVAL_SKIP that even the long run leaves out (REFGPT_NOTEBOOKS=all runs them):
#: activation patching by head *and* position, 2,160 and 10,800 forward passes per backend (hours
#: on two cores), and the cell that only plots one of them.
VERY_LONG = {
    "Activation_Patching_in_TL_Demo": [14, 17],
    "Attribution_Patching_Demo": [34, 36],
}

#: The notebooks TL 4's bridge runs in the default run: those with cells TransformerLens 3.9 cannot run
#: (the long run gives every notebook to the bridge).
BRIDGE_DEFAULT = ["Attribution_Patching_Demo"]

#: Cells about models that are not GPT-2 (they need the hub for them, which no backend has here).
NOT_GPT2 = {
    "Main_Demo": {
        56: "get_checkpoint_labels of attn-only/SoLU/Stanford checkpoints (the hub)",
    },
    "Activation_Patching_in_TL_Demo": {
        18: "attn-only-2l, an attention-only model", 19: "attn-only-2l", 20: "attn-only-2l", 21: "attn-only-2l",
        22: "attn-only-2l", 23: "attn-only-2l",
    },
}

#: Cells that fail on TransformerLens (every peer that ran), so there is nothing to compare.
TL_FAILS = {
    "Main_Demo": {
        16: "utils.get_act_name('in', layer) is blocks.L.hook_in, a hook point of neither TL 3.9 nor refgpt "
            "(TL 4's bridge has it: the long run compares there)",
        23: "tl_named_parameters is TL 4's bridge's (the long run compares there)",
        24: "tl_named_parameters is TL 4's bridge's",
    },
    "SVD_Interpreter_Demo": {
        6: "TL's SVDInterpreter makes float32 tensors and multiplies them with a float64 model's weights "
           "(it runs only in float32; the models here are float64)",
    },
    "Exploratory_Analysis_Demo": {
        0: "the notebook's own setup cell calls ip.extension_manager.load (no such method in IPython ≥ 8)",
        35: "IN_GITHUB undefined: cell 0 failed", 36: "IN_GITHUB undefined: cell 0 failed",
    },
}

#: Cells that run on both and differ, each for a row of docs/transformerlens.md §2.
DEPARTURES = {
    "Main_Demo": {
        11: "2.24: print(type(cache)) names refgpt's ActivationCache class",
        16: "2.27 (against the bridge): blocks.L.hook_in is a name of TL 4's bridge only",
        25: "2.21: TL 3.9 runs ln1 three times per block, so a hook on every point prints ln1's three times",
    },
    "Attribution_Patching_Demo": {
        11: "2.27 (against the bridge): its caches also hold the bridge's own component names (491 vs 222 "
            "entries, printed); the 222 refgpt has agree",
        15: "2.27 (against the bridge): the bridge's resid_mid backward hook sees only ∂ into ln2; refgpt's is "
            "∂metric/∂resid_mid (TL 3.9's, tests/tl_torch/test_torch_model.py), so the residual attribution differs",
        25: "2.27 (against the bridge): the attribution cache over the bridge's own names too",
    },
    "Patchscopes_Generation_Demo": {
        2: "2.24: the cell's last line, model.eval(), shows the module tree under refgpt's class name",
    },
    "Direct_Logit_Attribution_Demo": {
        4: "2.8: TL 3.9 sums the decomposition's bias row in float32 (1e-8); refgpt and TL 4's bridge in float64",
        5: "2.8", 6: "2.8", 7: "2.8",
        10: "2.25: the TorchDispatchMode watcher counts torch's tensors; refgpt's decomposition is NumPy's",
        11: "2.25",
    },
}

#: Variables not compared in a cell (each with its reason).
IGNORED_VALUES = {}
