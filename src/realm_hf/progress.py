"""Progress bars of realm-hf: drawn through huggingface_hub's tqdm, and only when no ecosystem switch turned them off."""

from __future__ import annotations

import datasets
from huggingface_hub.utils import are_progress_bars_disabled
from huggingface_hub.utils import tqdm as hub_tqdm
from transformers.utils import logging as transformers_logging

#: realm-hf's progress-bar group in huggingface_hub: `huggingface_hub.utils.disable_progress_bars("realm_hf")`
#: silences realm-hf's bars and leaves the other libraries' alone.
PROGRESS_BAR_GROUP = "realm_hf"


def progress_bars_enabled() -> bool:
    """
    Whether realm-hf draws progress bars: only when none of the switches a Hugging Face user may have turned off is
    off. Any one of these silences them:

    - `transformers.utils.logging.disable_progress_bar()`;
    - `datasets.disable_progress_bars()` or the environment variable `HF_DATASETS_DISABLE_PROGRESS_BARS=1`;
    - `huggingface_hub.utils.disable_progress_bars()` or the environment variable `HF_HUB_DISABLE_PROGRESS_BARS=1`;
    - `huggingface_hub.utils.disable_progress_bars("realm_hf")` (realm-hf's bars only).

    realm-hf's bars (embedding a corpus, evaluating, the CLI's) are as much a part of a transformers or datasets run as
    those libraries' own bars, so whichever switch a user knows silences them all.
    """
    return (
        transformers_logging.is_progress_bar_enabled()
        and datasets.is_progress_bar_enabled()
        and not are_progress_bars_disabled(PROGRESS_BAR_GROUP)
    )


def progress_bar(iterable=None, *, disable: bool = False, **kwargs) -> hub_tqdm:
    """
    A tqdm progress bar over `iterable` (huggingface_hub's `tqdm`, in realm-hf's group), drawn only when `disable` is
    false and [`progress_bars_enabled`]; `kwargs` go to tqdm (`desc`, `unit`, `total`, `leave`, `file`, ...).
    """
    return hub_tqdm(iterable, disable=disable or not progress_bars_enabled(), name=PROGRESS_BAR_GROUP, **kwargs)


__all__ = ["PROGRESS_BAR_GROUP", "progress_bar", "progress_bars_enabled"]
