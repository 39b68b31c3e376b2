"""GPT-2 124M (the real GPT-2 small config) at its full 1024-token context, random weights.

The recorder benchmark's long-sequence case: the forward does real work here (~2 s on 2 cores)
and the trace holds ~5 GB of activations (twelve 12x1024x1024 attention maps per step of
softmax), so it measures the recorder against the model rather than against fixed costs.
"""

from tiny_gpt2 import build as build_gpt2  # the model's folder is on sys.path, as for a script


def build():
    return build_gpt2(seq=1024, n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
