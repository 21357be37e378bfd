"""Training: what only training needs, on top of the core's loss and exact backward pass.

- ``optim`` — AdamW and SGD, step for step as ``torch.optim.AdamW`` and ``torch.optim.SGD``.
- ``tuned_lens`` — a tuned lens trained as the tuned-lens package trains one, with an analytic gradient.
- ``bpe_trainer`` — a byte-level BPE vocabulary learned from text, in GPT-2's format.

The loss and the gradients themselves are the reference's (``refgpt.gpt2.loss``, ``refgpt.backward``):
ports check their backward pass against them. ``weights/train_default.py`` is the training loop
that made the embedded model.
"""
