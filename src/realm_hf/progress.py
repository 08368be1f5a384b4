"""Progress bars of realm-hf: drawn through huggingface_hub's tqdm, and only when no ecosystem switch turned them off."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

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
        and _datasets_bars_enabled()
        and not are_progress_bars_disabled(PROGRESS_BAR_GROUP)
    )


def _datasets_bars_enabled() -> bool:
    # datasets is imported only by the paths that use it (importing it costs a second): until then, its switch can
    # only be its environment variable, read as datasets reads it.
    datasets = sys.modules.get("datasets")
    if datasets is not None:
        return datasets.is_progress_bar_enabled()
    value = os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS")
    return value is None or value.upper() not in ("1", "ON", "YES", "TRUE")


@contextlib.contextmanager
def datasets_bars_follow_switches() -> Iterator[None]:
    """
    Within the block, datasets' own progress bars (the "Saving the dataset" bar of a corpus save) are off whenever
    [`progress_bars_enabled`] says realm-hf's are: datasets heeds only its own switch, so
    `HF_HUB_DISABLE_PROGRESS_BARS=1`, transformers' `disable_progress_bar()` or `TQDM_DISABLE=1` left its bars on.
    """
    datasets = sys.modules.get("datasets")
    if datasets is None or progress_bars_enabled() or not datasets.is_progress_bar_enabled():
        yield
        return
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.enable_progress_bars()


def _tqdm_disabled() -> bool:
    # tqdm reads TQDM_DISABLE only as the default of `disable`; realm-hf always passes `disable`, so it reads it here.
    return os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def progress_bar(iterable=None, *, disable: bool = False, **kwargs) -> hub_tqdm:
    """
    A tqdm progress bar over `iterable` (huggingface_hub's `tqdm`, in realm-hf's group), drawn only when `disable` is
    false and [`progress_bars_enabled`]; `kwargs` go to tqdm (`desc`, `unit`, `total`, `leave`, `file`, ...).
    """
    return hub_tqdm(iterable, disable=disable or not progress_bars_enabled(), name=PROGRESS_BAR_GROUP, **kwargs)


__all__ = ["PROGRESS_BAR_GROUP", "datasets_bars_follow_switches", "progress_bar", "progress_bars_enabled"]
