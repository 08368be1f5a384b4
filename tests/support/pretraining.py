"""The tiny REALM pre-training and Inverse Cloze Task setups: a RealmConfig of hidden 32 and 2 layers, an 8-block
corpus and its retriever, the ICT blocks."""

import torch

from realm_hf import RealmConfig
from realm_hf.models.pretraining_inputs import encode_blocks

TITLES = ["paris", "cat", "london", "python", "river", "linux", "berlin", "compiler"]
TEXTS = [
    "paris is the capital of france .",
    "the cat sat on the mat .",
    "london is a big city in england .",
    "guido van rossum created python .",
    "the river seine flows through paris .",
    "linux is an open source operating system kernel .",
    "berlin is the capital of germany .",
    "a compiler does translate source code into machine code .",
]


def tiny_config(tokenizer, **kwargs):
    values = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        retriever_proj_size=16,
        max_position_embeddings=128,
        num_candidates=4,
        pad_token_id=0,
        max_block_length=32,
        max_joint_length=64,
    )
    values.update(kwargs)
    return RealmConfig(**values)


def make_retriever(embeddings, tokenizer, titles=TITLES, texts=TEXTS):
    from realm_hf.retrieval.retriever import RealmRetriever

    return RealmRetriever.from_embeddings(embeddings, list(texts), titles=list(titles), tokenizer=tokenizer)


def embed_corpus(model, tokenizer):
    was_training = model.training
    model.eval()
    with torch.no_grad():
        blocks = encode_blocks(tokenizer, TITLES, TEXTS, model.max_block_length)
        embeddings = model.embedder(**blocks).projected_score
    model.train(was_training)
    return embeddings


def ict_config(tokenizer, **kwargs):
    values = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        retriever_proj_size=16,
        max_position_embeddings=128,
        pad_token_id=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    values.update(kwargs)
    return RealmConfig(**values)


ICT_BLOCKS = [
    {"title": "paris", "text": "paris is the capital of france. the seine flows through paris. paris has many cafes."},
    {
        "title": "linux",
        "text": "linux is an operating system kernel. linux is free and open source. it runs on a computer.",
    },
    {"title": "python", "text": "guido van rossum created python. python is a language. python code is read fast."},
    {"title": "berlin", "text": "berlin is the capital of germany. berlin has many museums. the city is big and old."},
    {"title": "cat", "text": "the cat sat on the mat. the cat is black. a dog and a cat do sit in the house."},
    {"title": "moon", "text": "the moon is in the night sky. the sun is in the day sky. the moon is old."},
    {"title": "compiler", "text": "a compiler does translate code. the compiler reads source code. it is a program."},
    {"title": "river", "text": "a river flows into the sea. the river is long. many river boats run on it."},
]
