"""Progress bars of realm-hf: drawn through huggingface_hub's tqdm, and only when no ecosystem switch turned them off."""

from __future__ import annotations

import os

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
    - `huggingface_hub.utils.disable_progress_bars("realm_hf")` (realm-hf's bars only);
    - the environment variable `TQDM_DISABLE=1` (tqdm's own switch, which realm-hf's explicit `disable=` would
      otherwise override).

    realm-hf's bars (embedding a corpus, evaluating, the CLI's) are as much a part of a transformers or datasets run as
    those libraries' own bars, so whichever switch a user knows silences them all.
    """
    return (
        not _tqdm_disabled()
        and transformers_logging.is_progress_bar_enabled()
        and datasets.is_progress_bar_enabled()
        and not are_progress_bars_disabled(PROGRESS_BAR_GROUP)
    )


def _tqdm_disabled() -> bool:
    # tqdm reads TQDM_DISABLE only as the default of `disable`; realm-hf always passes `disable`, so it reads it here.
    return os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def progress_bar(iterable=None, *, disable: bool = False, **kwargs) -> hub_tqdm:
    """
    A tqdm progress bar over `iterable` (huggingface_hub's `tqdm`, in realm-hf's group), drawn only when `disable` is
    false and [`progress_bars_enabled`]; `kwargs` go to tqdm (`desc`, `unit`, `total`, `leave`, `file`, ...).
    """
    return hub_tqdm(iterable, disable=disable or not progress_bars_enabled(), name=PROGRESS_BAR_GROUP, **kwargs)


__all__ = ["PROGRESS_BAR_GROUP", "progress_bar", "progress_bars_enabled"]
