"""GPT-2 124M (the real GPT-2 small config) with random weights: a real-size model."""

from tiny_gpt2 import build as build_gpt2  # the model's folder is on sys.path, as for a script


def build():
    return build_gpt2(seq=64, n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
