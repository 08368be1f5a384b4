"""Tokenizers for REALM: BERT WordPiece tokenizers with the legacy `batch_encode_candidates`."""

from __future__ import annotations

from transformers import BatchEncoding, BertTokenizer
from transformers.utils import PaddingStrategy

from ..io.auto_map import prepare_save, tokenizer_auto_map, write_auto_module
from ..io.consistent_reads import consistent_read
from ..text.tokenizer_calls import check_vocabulary, tokenizer_lock


class RealmTokenizer(BertTokenizer):
    r"""
    REALM tokenizer: a BERT WordPiece tokenizer (backed by 🤗 Tokenizers) with one extra method,
    [`~RealmTokenizer.batch_encode_candidates`], which encodes a `(batch_size, num_candidates)` grid of texts into
    fixed-length tensors as [`RealmScorer`] and [`RealmKnowledgeAugEncoder`] expect.

    Legacy `tokenizer_config.json` files of the google/realm-* checkpoints name `RealmTokenizer` or
    `RealmTokenizerFast`; both names resolve to this implementation once `realm_hf` is imported.

    Example:

    ```python
    >>> from realm_hf import RealmTokenizer

    >>> tokenizer = RealmTokenizer.from_pretrained("path/to/realm-checkpoint")
    >>> text = [["Hello world!", "Nice to meet you!"], ["The cute cat.", "The adorable dog."]]
    >>> batch = tokenizer.batch_encode_candidates(text, max_length=10, return_tensors="pt")
    >>> batch.input_ids.shape
    torch.Size([2, 2, 10])
    ```"""

    def _encode_plus(self, *args, **kwargs) -> BatchEncoding:
        # Setting the backend's padding/truncation and encoding happen as one step (see `tokenizer_lock` in
        # text/tokenizer_calls.py), so a RealmTokenizer can be called from several threads, also outside realm-hf.
        with tokenizer_lock(self):
            return super()._encode_plus(*args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """
        [`~transformers.PreTrainedTokenizerBase.from_pretrained`], reading a local directory as one save, as the
        models do: a save into it (or into the model directory holding it) interrupted while swapping its files in is
        completed first, a save in progress is waited for, and its files must not be links leading out of it (see
        [`realm_hf.io.consistent_reads.consistent_read`]). A folder or Hub repo without the vocabulary (`vocab.txt` or
        `tokenizer.json`) is an `OSError` naming the missing file, as the transformers 4 tokenizer raised, instead of
        a tokenizer of only special tokens ([`~realm_hf.text.tokenizer_calls.check_vocabulary`]).
        """
        with consistent_read(pretrained_model_name_or_path, kwargs.get("subfolder")):
            tokenizer = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        check_vocabulary(tokenizer, pretrained_model_name_or_path)
        return tokenizer

    def save_pretrained(self, save_directory, *args, **kwargs):
        """
        [`~transformers.PreTrainedTokenizerBase.save_pretrained`], plus an `auto_map` in `tokenizer_config.json` and
        the small `realm_hf_auto.py` it names, so that `AutoTokenizer` without `import realm_hf` points to realm-hf
        instead of building a generic tokenizer (see `realm_hf/io/auto_map.py` and docs/hub.md).
        """
        prepare_save(self)
        # transformers writes a tokenizer's `_auto_map` as the `auto_map` of tokenizer_config.json.
        self._auto_map = tokenizer_auto_map()
        files = super().save_pretrained(save_directory, *args, **kwargs)
        write_auto_module(save_directory)
        return files

    def batch_encode_candidates(self, text, **kwargs) -> BatchEncoding:
        r"""
        Encode a batch of candidate texts (or text pairs). Unlike `__call__`, it

        1. handles the extra `num_candidates` axis: `text` is a list of `batch_size` lists of `num_candidates`
           strings (and so is `text_pair`, if given);
        2. always pads to `max_length`, which must be given, so that candidate packs stack into one tensor.

        Args:
            text (`list[list[str]]`):
                Candidate texts, shape `(batch_size, num_candidates)`.
            text_pair (`list[list[str]]`, *optional*):
                Second segments, same shape as `text`.
            **kwargs:
                Keyword arguments of `__call__` (`max_length` is required).

        Returns:
            [`BatchEncoding`]: `input_ids`, `attention_mask` and `token_type_ids` of shape
            `(batch_size, num_candidates, max_length)`.
        """
        if kwargs.get("max_length") is None:
            raise ValueError("`batch_encode_candidates` needs `max_length` so that candidates stack into one tensor.")
        # A fixed length is what lets candidate packs of different questions stack into a batch.
        kwargs["padding"] = PaddingStrategy.MAX_LENGTH
        kwargs.setdefault("truncation", True)
        batch_text_pair = kwargs.pop("text_pair", None)
        return_tensors = kwargs.pop("return_tensors", None)

        output_data = {"input_ids": [], "attention_mask": [], "token_type_ids": []}
        for idx, candidate_text in enumerate(text):
            candidate_text_pair = batch_text_pair[idx] if batch_text_pair is not None else None
            encoded = self(candidate_text, candidate_text_pair, return_tensors=None, **kwargs)
            for key in output_data:
                if encoded.get(key) is not None:
                    output_data[key].append(encoded[key])
        output_data = {key: value for key, value in output_data.items() if len(value) != 0}
        return BatchEncoding(output_data, tensor_type=return_tensors)


class RealmTokenizerFast(RealmTokenizer):
    """Alias of [`RealmTokenizer`] under the legacy fast-tokenizer name (transformers 5 has one tokenizer class)."""


__all__ = ["RealmTokenizer", "RealmTokenizerFast"]
