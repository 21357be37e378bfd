"""GPT-2's math: its config and tokenizer, and the ops the Model runs (layernorm and its two views,
attention, mlp, activations, linear, loss, kv_cache, padding), each with its backward beside it."""
