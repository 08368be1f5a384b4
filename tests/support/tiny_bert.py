"""Tiny random BERT checkpoints (hidden 32, 2 layers) for the paths that start from BERT: `init_from_bert`, the
command line's `train --from-bert`, the examples and the benches' `--bert`."""

import torch
from transformers import BertConfig, BertForPreTraining

from realm_hf import RealmTokenizer
from tests.support.paths import CORPUS_VOCAB


def tiny_bert_config(tokenizer):
    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=64,
        hidden_act="gelu",
    )


def save_tiny_bert(path, tokenizer=None, max_positions=None, seed=0):
    """A BertForPreTraining directory with `tokenizer` (the fixture corpus's 600-wordpiece vocabulary by default);
    `seed` fixes its weights (None: whatever torch's generator holds)."""
    if tokenizer is None:
        tokenizer = RealmTokenizer(vocab=CORPUS_VOCAB)
    if seed is not None:
        torch.manual_seed(seed)
    config = tiny_bert_config(tokenizer)
    if max_positions is not None:
        config.max_position_embeddings = max_positions
    BertForPreTraining(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
