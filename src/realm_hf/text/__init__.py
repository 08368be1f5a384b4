"""
The rules for text that every layer above shares, one module per rule: calling a tokenizer safely
(`tokenizer_calls`), what user text may be (`user_text`), where sentences end (`sentences`), REALM's salient spans
(`salient_spans`), and where gold answers occur in wordpiece ids (`answer_spans`). Import the functions from their
modules; nothing is re-exported here.
"""
