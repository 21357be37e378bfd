"""TransformerLens compatibility: hook points and hooks, the activation cache and its decomposition
API, the circuit helpers, text and input handling, ``generate`` and weight processing, each under
TransformerLens's names and semantics (deliberate differences: docs/transformerlens.md)."""
