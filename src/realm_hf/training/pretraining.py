"""
REALM pre-training (Guu et al. 2020): its data collator, salient span masking (section 3.4), and its Trainer,
[`RealmPreTrainingTrainer`], whose model card describes the masking and the rest of the recipe.

REALM masks *salient spans* (named entities and dates) rather than random wordpieces: predicting "Dennis Ritchie"
or "1972" needs world knowledge, which is what makes the retriever useful. The paper's ablation: NQ EM 38.2 with
salient span masks against 32.3 with random wordpiece masks and 35.3 with random span masks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Trainer

from ..logging_utils import warn
from ..text.salient_spans import find_dates_and_numbers
from ..text.tokenizer_calls import tokenizer_call
from .callbacks import RealmReindexCallback
from .saving import RealmModelCardMixin

__all__ = [
    "DataCollatorForSalientSpanMasking",
    "RealmPreTrainingTrainer",
    "masking_description",
]


def _entity_label(entity: dict) -> str:
    label = entity.get("entity_group", entity.get("entity", "")) or ""
    return label[2:] if label[:2] in ("B-", "I-") else label


def _ner_spans(entities: Sequence[dict], labels: Collection[str] | None) -> list[tuple[int, int]]:
    """Character spans of NER entities; un-aggregated B-/I- token entities are merged into whole entities."""
    spans: list[list[Any]] = []
    for entity in sorted(entities, key=lambda e: e["start"]):
        if entity.get("start") is None or entity.get("end") is None:
            continue
        label = _entity_label(entity)
        if labels is not None and label not in labels:
            continue
        raw_label = entity.get("entity", "") or ""
        continues = raw_label.startswith("I-") or (
            "entity_group" not in entity and not raw_label.startswith("B-") and spans and spans[-1][2] == label
        )
        # Pipelines without aggregation return one entity per wordpiece: glue I- pieces to the entity they continue.
        if continues and spans and spans[-1][2] == label and entity["start"] <= spans[-1][1] + 1:
            spans[-1][1] = max(spans[-1][1], entity["end"])
        else:
            spans.append([entity["start"], entity["end"], label])
    return [(s, e) for s, e, _ in spans if e > s]


@dataclass
class DataCollatorForSalientSpanMasking:
    """
    Data collator for REALM pre-training with salient span masking: it tokenizes texts, finds *salient spans* and
    masks whole spans, so the model has to recover an entity or a date rather than a wordpiece.

    Salient spans come from three sources, merged:

    1. spans given with the data (`salient_spans`, character offsets), e.g. FOLDOC's `{braced}` cross-references
       (the `links` of [`~realm_hf.data.parse_foldoc`]);
    2. dates and numbers found by pattern ([`find_dates_and_numbers`]), if `detect_dates_and_numbers`;
    3. entities from a token-classification model, if `ner_pipeline` is given (REALM used a BERT-based tagger).

    Each character span covers every wordpiece that overlaps it, extended to whole words so that a `##` piece is
    never split from its word; spans longer than `max_span_length` wordpieces are dropped. Spans are then chosen at
    random: by default one per example, as in REALM (one salient span per sentence). Chosen spans never overlap and
    never touch, so two masked spans never merge into one; special tokens are never masked. Every wordpiece of a
    chosen span becomes `[MASK]` (REALM's choice); BERT's 80/10/10 replacement is available, decided once per span.

    An example with no salient span falls back to random whole words, with a warning the first time (counted in
    `num_fallbacks`).

    Args:
        tokenizer ([`PreTrainedTokenizerBase`]):
            A tokenizer that returns offsets (any tokenizer backed by 🤗 Tokenizers, e.g. `BertTokenizerFast`).
        max_length (`int`, *optional*):
            Truncate texts to this many wordpieces (special tokens included); defaults to the tokenizer's
            `model_max_length`, capped at 512. Salient spans cut by truncation are dropped.
        max_spans_per_example (`int`, *optional*, defaults to 1):
            Most spans masked per example; `None` for no limit (then `mask_rate` sets the amount).
        mask_rate (`float`, *optional*):
            Target fraction of an example's wordpieces to mask. The first span is always masked; further spans are
            added while the total stays within `mask_rate` (and `max_spans_per_example`).
        max_span_length (`int`, *optional*, defaults to 10):
            Longest maskable span, in wordpieces; longer spans are skipped, not truncated.
        detect_dates_and_numbers (`bool`, *optional*, defaults to `True`): Add dates and numbers found by pattern.
        ner_pipeline (`Callable`, *optional*):
            A `transformers` token-classification pipeline (preferably with `aggregation_strategy="simple"`) or any
            callable that takes a list of texts and returns, for each, a list of entities as dicts with `start` and
            `end` character offsets (and `entity_group` or `entity` labels).
        ner_labels (`Collection[str]`, *optional*): Entity labels to keep (e.g. `{"PER", "ORG", "LOC"}`); all if
            `None`.
        mask_replace_prob (`float`, *optional*, defaults to 1.0):
            Probability that a chosen span is replaced by `[MASK]` tokens (REALM: always).
        random_replace_prob (`float`, *optional*, defaults to 0.0):
            Probability that a chosen span is replaced by random tokens instead; otherwise it is kept unchanged but
            still predicted. BERT's recipe is `mask_replace_prob=0.8, random_replace_prob=0.1`.
        pad_to_multiple_of (`int`, *optional*): Pad the batch length to a multiple of this.
        return_salient_span_mask (`bool`, *optional*, defaults to `False`):
            Also return `salient_span_mask`: 1 at every wordpiece of every salient span found (masked or not).
        seed (`int`, *optional*): Seed of the collator's `torch.Generator`, for reproducible masks. Each DataLoader
            worker holds its own copy of the generator, so reseed per worker (`worker_init_fn`) if that matters.
        text_column (`str`, *optional*, defaults to `"text"`): Key of the text in each example.
        spans_column (`str`, *optional*, defaults to `"salient_spans"`): Key of the given character spans
            (`[[start, end], ...]`).

    Examples may instead be pre-tokenized: `input_ids` (special tokens included) with optional `offset_mapping` (then
    `text` enables character spans, patterns and NER) and optional `salient_token_spans` (`[[start, end), ...]` in
    wordpieces). Word boundaries then come from the `##` continuation prefix.

    Returns a dict of tensors: `input_ids`, `attention_mask`, `token_type_ids`, `labels` (original ids at the
    masked positions, -100 elsewhere), `mlm_mask` (1 at masked positions), optionally `salient_span_mask`, plus each
    other numeric field of the examples (e.g. `block_id`, `source_block_ids`) as a tensor (ragged lists padded with
    -1). Text and other non-numeric fields are not returned. With `Trainer`, set `remove_unused_columns=False` so the
    `text` column reaches the collator.

    Example:

    ```python
    >>> from transformers import AutoTokenizer
    >>> from realm_hf.training import DataCollatorForSalientSpanMasking

    >>> tokenizer = AutoTokenizer.from_pretrained("path/to/bert")
    >>> collator = DataCollatorForSalientSpanMasking(tokenizer, seed=0)
    >>> batch = collator([{"text": "Unix was first released in 1971.", "salient_spans": [[0, 4]], "block_id": 7}])
    >>> sorted(batch)
    ['attention_mask', 'block_id', 'input_ids', 'labels', 'mlm_mask', 'token_type_ids']
    ```
    """

    tokenizer: PreTrainedTokenizerBase
    max_length: int | None = None
    max_spans_per_example: int | None = 1
    mask_rate: float | None = None
    max_span_length: int = 10
    detect_dates_and_numbers: bool = True
    ner_pipeline: Callable | None = None
    ner_labels: Collection[str] | None = None
    mask_replace_prob: float = 1.0
    random_replace_prob: float = 0.0
    pad_to_multiple_of: int | None = None
    return_salient_span_mask: bool = False
    seed: int | None = None
    text_column: str = "text"
    spans_column: str = "salient_spans"
    num_fallbacks: int = field(default=0, init=False)
    _warned: bool = field(default=False, init=False, repr=False)
    _generator: torch.Generator = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.tokenizer.mask_token_id is None:
            raise ValueError("The tokenizer has no mask token, which masked language modelling needs.")
        if (
            not 0.0 <= self.mask_replace_prob + self.random_replace_prob <= 1.0
            or min(self.mask_replace_prob, self.random_replace_prob) < 0.0
        ):
            raise ValueError("`mask_replace_prob` and `random_replace_prob` must be >= 0 and sum to at most 1.")
        if self.mask_rate is not None and not 0.0 < self.mask_rate <= 1.0:
            raise ValueError(f"`mask_rate` must be in (0, 1], got {self.mask_rate}.")
        if self.max_spans_per_example is not None and self.max_spans_per_example < 1:
            raise ValueError("`max_spans_per_example` must be at least 1 (or None for no limit).")
        if self.max_spans_per_example is None and self.mask_rate is None:
            raise ValueError("With `max_spans_per_example=None`, set `mask_rate` to bound how much is masked.")
        if self.max_length is None:
            model_max = getattr(self.tokenizer, "model_max_length", 512) or 512
            self.max_length = min(int(model_max), 512)
        self._generator = torch.Generator()
        if self.seed is not None:
            self._generator.manual_seed(self.seed)
        else:
            self._generator.seed()
        special_ids = set(self.tokenizer.all_special_ids)
        # Random replacements never introduce special tokens.
        self._random_ids = torch.tensor([i for i in range(len(self.tokenizer)) if i not in special_ids])

    # ------------------------------------------------------------------------------------------------ encoding

    def _encode(self, examples: list[dict]) -> list[dict]:
        """Tokenize texts in one call; returns per example ids, special mask, offsets, word ids and truncation."""
        encoded: list[dict | None] = [None] * len(examples)
        to_tokenize = [i for i, ex in enumerate(examples) if "input_ids" not in ex]
        if to_tokenize:
            texts = [examples[i][self.text_column] for i in to_tokenize]
            batch = tokenizer_call(
                self.tokenizer,
                texts,
                truncation=True,
                max_length=self.max_length,
                return_offsets_mapping=True,
                return_special_tokens_mask=True,
                return_overflowing_tokens=False,
                return_length=False,
            )
            if not batch.is_fast:
                raise ValueError(
                    "DataCollatorForSalientSpanMasking needs a tokenizer that returns word ids and offsets."
                )
            for j, i in enumerate(to_tokenize):
                ids = batch["input_ids"][j]
                # The untruncated end tells whether a span ran past the kept text.
                offsets = [tuple(o) for o in batch["offset_mapping"][j]]
                encoded[i] = {
                    "input_ids": list(ids),
                    "token_type_ids": list(batch["token_type_ids"][j]) if "token_type_ids" in batch else None,
                    "special": [bool(s) for s in batch["special_tokens_mask"][j]],
                    "offsets": offsets,
                    "word_ids": batch.word_ids(j),
                    "text": texts[j],
                }
        for i, ex in enumerate(examples):
            if encoded[i] is not None:
                continue
            ids = list(ex["input_ids"])
            tokens = self.tokenizer.convert_ids_to_tokens(ids)
            special = self.tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
            word_ids, word = [], -1
            for token, is_special in zip(tokens, special):
                if is_special:
                    word_ids.append(None)
                    continue
                if not token.startswith("##") or word < 0:
                    word += 1
                word_ids.append(word)
            offsets = [tuple(o) for o in ex["offset_mapping"]] if ex.get("offset_mapping") is not None else None
            encoded[i] = {
                "input_ids": ids,
                "token_type_ids": list(ex["token_type_ids"]) if ex.get("token_type_ids") is not None else None,
                "special": [bool(s) for s in special],
                "offsets": offsets,
                "word_ids": word_ids,
                "text": ex.get(self.text_column) if offsets is not None else None,
            }
        return encoded

    @staticmethod
    def _extend_to_words(start: int, end: int, word_ids: list[int | None]) -> tuple[int, int]:
        while start > 0 and word_ids[start - 1] is not None and word_ids[start - 1] == word_ids[start]:
            start -= 1
        while end < len(word_ids) and word_ids[end] is not None and word_ids[end] == word_ids[end - 1]:
            end += 1
        return start, end

    def _char_span_to_tokens(self, start: int, end: int, enc: dict) -> tuple[int, int] | None:
        offsets, special = enc["offsets"], enc["special"]
        covered = [i for i, (a, b) in enumerate(offsets) if not special[i] and b > a and a < end and b > start]
        if not covered:
            return None
        # A span running past the last kept wordpiece was cut by truncation: its remainder would leak unmasked.
        last_end = max((b for i, (a, b) in enumerate(offsets) if not special[i] and b > a), default=0)
        text = enc["text"]
        if end > last_end and text is not None and text[last_end:end].strip():
            return None
        return self._extend_to_words(covered[0], covered[-1] + 1, enc["word_ids"])

    def _salient_spans(self, example: dict, enc: dict, entities: Sequence[dict] | None) -> list[tuple[int, int]]:
        char_spans: list[tuple[int, int]] = []
        if enc["offsets"] is not None and enc["text"] is not None:
            char_spans.extend((int(s), int(e)) for s, e in (example.get(self.spans_column) or []))
            if self.detect_dates_and_numbers:
                char_spans.extend(find_dates_and_numbers(enc["text"]))
            if entities is not None:
                char_spans.extend(_ner_spans(entities, self.ner_labels))
        token_spans = set()
        for s, e in char_spans:
            if e <= s:
                continue
            span = self._char_span_to_tokens(s, e, enc)
            if span is not None:
                token_spans.add(span)
        for s, e in example.get("salient_token_spans") or []:
            s, e = int(s), int(e)
            if 0 <= s < e <= len(enc["input_ids"]) and not any(enc["special"][s:e]):
                token_spans.add(self._extend_to_words(s, e, enc["word_ids"]))
        return sorted(sp for sp in token_spans if sp[1] - sp[0] <= self.max_span_length)

    def _word_spans(self, enc: dict) -> list[tuple[int, int]]:
        """Whole words (runs of wordpieces sharing a word id), preferring words that are not just punctuation."""
        spans, start = [], None
        word_ids = enc["word_ids"]
        for i, w in enumerate(word_ids + [None]):
            if start is not None and (w is None or w != word_ids[start]):
                spans.append((start, i))
                start = None
            if w is not None and start is None and not enc["special"][i]:
                start = i
        spans = [sp for sp in spans if sp[1] - sp[0] <= self.max_span_length]
        tokens = self.tokenizer.convert_ids_to_tokens([enc["input_ids"][s] for s, _ in spans])
        wordy = [sp for sp, tok in zip(spans, tokens) if any(ch.isalnum() for ch in tok)]
        return wordy or spans

    # ------------------------------------------------------------------------------------------------ masking

    def _choose(self, candidates: list[tuple[int, int]], num_tokens: int) -> list[tuple[int, int]]:
        budget = None if self.mask_rate is None else self.mask_rate * num_tokens
        order = torch.randperm(len(candidates), generator=self._generator).tolist()
        chosen, masked, taken = [], 0, set()
        for k in order:
            if self.max_spans_per_example is not None and len(chosen) >= self.max_spans_per_example:
                break
            start, end = candidates[k]
            # Leave at least one unmasked wordpiece between chosen spans so that they never merge.
            if any(i in taken for i in range(start - 1, end + 1)):
                continue
            if chosen and budget is not None and masked + (end - start) > budget:
                continue
            chosen.append((start, end))
            taken.update(range(start, end))
            masked += end - start
        return sorted(chosen)

    def _apply(self, input_ids: list[int], spans: list[tuple[int, int]]) -> tuple[list[int], list[int], list[int]]:
        labels = [-100] * len(input_ids)
        mlm_mask = [0] * len(input_ids)
        masked_ids = list(input_ids)
        for start, end in spans:
            # One decision per span (as SpanBERT does), so a span is never half [MASK], half original.
            draw = torch.rand((), generator=self._generator).item()
            for i in range(start, end):
                labels[i] = input_ids[i]
                mlm_mask[i] = 1
            if draw < self.mask_replace_prob:
                for i in range(start, end):
                    masked_ids[i] = self.tokenizer.mask_token_id
            elif draw < self.mask_replace_prob + self.random_replace_prob:
                picks = torch.randint(len(self._random_ids), (end - start,), generator=self._generator)
                for i, p in zip(range(start, end), picks.tolist()):
                    masked_ids[i] = int(self._random_ids[p])
        return masked_ids, labels, mlm_mask

    # ------------------------------------------------------------------------------------------------ call

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        examples = [dict(ex) for ex in examples]
        encoded = self._encode(examples)

        entities_per_example: list[Sequence[dict] | None] = [None] * len(examples)
        if self.ner_pipeline is not None:
            with_text = [i for i, enc in enumerate(encoded) if enc["text"] is not None and enc["offsets"] is not None]
            if with_text:
                results = self.ner_pipeline([encoded[i]["text"] for i in with_text])
                if len(with_text) == 1 and results and isinstance(results[0], dict):
                    results = [results]  # a pipeline given one text may return a flat list
                for i, entities in zip(with_text, results):
                    entities_per_example[i] = entities

        rows = []
        for example, enc, entities in zip(examples, encoded, entities_per_example):
            candidates = self._salient_spans(example, enc, entities)
            salient = [0] * len(enc["input_ids"])
            for s, e in candidates:
                for i in range(s, e):
                    salient[i] = 1
            if not candidates:
                self.num_fallbacks += 1
                if not self._warned:
                    warn(
                        "An example has no salient span (no given span, date, number or entity): masking random "
                        "whole words instead. Further fallbacks are counted in `collator.num_fallbacks` without a "
                        "warning.",
                        stacklevel=2,
                    )
                    self._warned = True
                candidates = self._word_spans(enc)
            num_tokens = sum(1 for s in enc["special"] if not s)
            chosen = self._choose(candidates, num_tokens)
            masked_ids, labels, mlm_mask = self._apply(enc["input_ids"], chosen)
            rows.append((enc, masked_ids, labels, mlm_mask, salient))

        return self._pad(examples, rows)

    def _pad(self, examples: list[dict], rows: list[tuple]) -> dict[str, torch.Tensor]:
        length = max(len(row[1]) for row in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch_size = len(rows)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((batch_size, length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((batch_size, length), dtype=torch.long)
        token_type_ids = torch.zeros((batch_size, length), dtype=torch.long)
        labels = torch.full((batch_size, length), -100, dtype=torch.long)
        mlm_mask = torch.zeros((batch_size, length), dtype=torch.long)
        salient_mask = torch.zeros((batch_size, length), dtype=torch.long)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        for b, (enc, ids, row_labels, row_mlm, row_salient) in enumerate(rows):
            n = len(ids)
            where = slice(length - n, length) if left else slice(0, n)
            input_ids[b, where] = torch.tensor(ids, dtype=torch.long)
            attention_mask[b, where] = 1
            if enc["token_type_ids"] is not None:
                token_type_ids[b, where] = torch.tensor(enc["token_type_ids"], dtype=torch.long)
            labels[b, where] = torch.tensor(row_labels, dtype=torch.long)
            mlm_mask[b, where] = torch.tensor(row_mlm, dtype=torch.long)
            salient_mask[b, where] = torch.tensor(row_salient, dtype=torch.long)
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "labels": labels,
            "mlm_mask": mlm_mask,
        }
        if self.return_salient_span_mask:
            batch["salient_span_mask"] = salient_mask
        batch.update(self._passthrough(examples))
        return batch

    _CONSUMED = frozenset(
        {"input_ids", "attention_mask", "token_type_ids", "offset_mapping", "special_tokens_mask", "labels"}
        | {"salient_token_spans", "word_ids"}
    )

    def _passthrough(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        """Numeric fields other than the ones consumed here (e.g. `block_id`), as tensors."""
        out = {}
        consumed = self._CONSUMED | {self.text_column, self.spans_column}
        for key in examples[0]:
            if key in consumed:
                continue
            values = [ex.get(key) for ex in examples]
            if all(isinstance(v, bool | int | float) and not isinstance(v, str) for v in values):
                dtype = torch.float32 if any(isinstance(v, float) for v in values) else torch.long
                out[key] = torch.tensor(values, dtype=dtype)
            elif all(
                isinstance(v, list | tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
                for v in values
            ):
                # Ragged id lists (several source blocks per example) are padded with -1, "no block".
                width = max((len(v) for v in values), default=0)
                out[key] = torch.tensor([list(v) + [-1] * (width - len(v)) for v in values], dtype=torch.long)
            elif all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in values):
                out[key] = torch.stack(values)
        return out


# The pre-training Trainer.

# Columns that name the block(s) an input was cut from: what keeps REALM from retrieving it (no trivial retrieval).
SOURCE_BLOCK_COLUMNS = ("block_id", "source_block_ids", "source_block_id")


class RealmPreTrainingTrainer(RealmModelCardMixin, Trainer):
    """
    [`~transformers.Trainer`] for REALM pre-training of [`RealmForPreTraining`] (retrieval-augmented masked language
    modelling), as built by [`~realm_hf.training.recipes.pretraining_trainer`].

    Training is the stock Trainer's; `create_model_card()` (hence `push_to_hub()`) writes realm-hf's pre-training
    card instead of transformers' draft: what the model is, the recipe as configured (the masking of the collator,
    whether source blocks are excluded, the index refresh), the training arguments, the training
    loss and the last evaluation logged (the masked-LM `eval_loss` and any other `eval_` metric). The arguments are
    those of [`~transformers.Trainer`]; `args.remove_unused_columns` must be `False` (the collator reads the raw text,
    spans and block ids).
    """

    def model_card_setup(self) -> dict[str, Any]:
        # The number of candidates (null document included) is the model's, in the card's model details.
        setup = {"Masking": masking_description(self.data_collator)}
        given = sorted(data_columns(self.train_dataset) & set(SOURCE_BLOCK_COLUMNS))
        setup["No trivial retrieval"] = (
            f"on: the block each input was cut from (`{given[0]}`) is never retrieved for it"
            if given
            else "off: the training data names no source block (`block_id` / `source_block_ids`)"
        )
        refreshers = [cb for cb in self.callback_handler.callbacks if isinstance(cb, RealmReindexCallback)]
        if refreshers:
            refresher = refreshers[0]
            how = "in the background" if getattr(refresher, "background", False) else "inline"
            setup["Index refresh"] = f"every {refresher.refresh_steps} steps, {how}"
        else:
            setup["Index refresh"] = "none (the index stays as built)"
        return setup


def data_columns(dataset) -> set[str]:
    """The columns (keys) of a Trainer dataset: a `datasets` dataset's columns, or the keys of a list's first dict."""
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        return set(columns)
    try:
        first = dataset[0]
    except (TypeError, IndexError, KeyError):
        return set()
    return set(first) if isinstance(first, dict) else set()


def masking_description(collator) -> str:
    """How a pre-training collator masks its inputs, in words (for the model card)."""
    if not isinstance(collator, DataCollatorForSalientSpanMasking):
        return f"`{type(collator).__name__}`"
    sources = [f"spans given with the data (`{collator.spans_column}`)"]
    if collator.detect_dates_and_numbers:
        sources.append("dates and numbers")
    if collator.ner_pipeline is not None:
        sources.append("named entities")
    amount = (
        f"up to {collator.max_spans_per_example} span(s) per input"
        if collator.max_spans_per_example is not None
        else "no span limit"
    )
    if collator.mask_rate is not None:
        amount += f", at most {collator.mask_rate:g} of its wordpieces"
    return (
        f"salient span masking: {', '.join(sources)}; {amount}, at most {collator.max_span_length} wordpieces each; "
        "random whole words where an input has no salient span"
    )
