"""Paths of the repository and of the test fixtures, wherever a test file sits under tests/."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
FIXTURES = os.path.join(TESTS, "fixtures")
SCRIPTS = os.path.join(TESTS, "scripts")
LEGACY = os.path.join(FIXTURES, "legacy")
LEGACY_OPENQA = os.path.join(LEGACY, "openqa")
CORPUS_DIR = os.path.join(FIXTURES, "corpus")
CORPUS_DOCUMENTS = os.path.join(CORPUS_DIR, "documents.jsonl")
CORPUS_VOCAB = os.path.join(CORPUS_DIR, "vocab.txt")
BENCH = os.path.join(REPO, "bench")
EXAMPLES = os.path.join(REPO, "examples")
TRAIN_CONFIG_EXAMPLE = os.path.join(EXAMPLES, "train_config_example.json")
