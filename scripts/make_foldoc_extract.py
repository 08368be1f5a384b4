"""Write the compact FOLDOC extract shipped with realm-hf (`src/realm_hf/data/foldoc_extract.jsonl.gz`).

Needs Debian's `dict-foldoc` (`apt-get install dict-foldoc`). The extract is a well-linked, self-consistent subset,
so that link questions and salient spans mostly point at entries that are in it:

1. the `--core` entries most linked to across the whole dictionary;
2. then, in batches of 200, the entries that best connect to the selection: for each candidate, the share of its
   links that point into the selection plus the number of selected entries linking to it;
3. link targets outside the extract are set to None (`target_title`).

Entries keep the dictionary's order. FOLDOC is under the GNU FDL 1.1 or later; see `FOLDOC_LICENSE.md`.

Usage: python scripts/make_foldoc_extract.py [--num-entries 3000] [--output PATH]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

from realm_hf.data.foldoc import DEFAULT_DICT_PATH, EXTRACT_PATH, parse_foldoc, write_foldoc_jsonl


def select_entries(entries: list[dict], num_entries: int, num_core: int, batch_size: int = 200) -> list[dict]:
    """Pick a well-linked subset of `entries` (see the module docstring), returned in the input order."""
    by_title = {e["title"]: e for e in entries}
    in_degree = collections.Counter(
        link["target_title"] for e in entries for link in e["links"] if link["target_title"] in by_title
    )
    ranked = sorted(in_degree, key=lambda t: (-in_degree[t], t))
    selected = set(ranked[:num_core])
    while len(selected) < min(num_entries, len(entries)):
        scores: dict[str, float] = {}
        for entry in entries:
            if entry["title"] in selected:
                continue
            inside = sum(1 for link in entry["links"] if link["target_title"] in selected)
            # Favour entries whose links stay inside the selection: those make answerable, consistent questions.
            scores[entry["title"]] = inside / (1 + len(entry["links"]) - inside)
        for title in selected:
            for link in by_title[title]["links"]:
                target = link["target_title"]
                if target in by_title and target not in selected:
                    scores[target] = scores.get(target, 0.0) + 1.0
        if not scores:
            break
        batch = sorted(scores, key=lambda t: (-scores[t], t))[: min(batch_size, num_entries - len(selected))]
        selected.update(batch)
    return [e for e in entries if e["title"] in selected]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dict-path", default=DEFAULT_DICT_PATH)
    parser.add_argument("--index-path", default=None)
    parser.add_argument("--num-entries", type=int, default=3000)
    parser.add_argument("--core", type=int, default=800, help="most-linked-to entries that seed the selection")
    parser.add_argument("--output", default=EXTRACT_PATH)
    args = parser.parse_args(argv)

    if not os.path.exists(args.dict_path):
        print(f"{args.dict_path} not found: apt-get install dict-foldoc", file=sys.stderr)
        return 1
    entries = parse_foldoc(args.dict_path, args.index_path)
    # FOLDOC's own front matter ("<introduction>") is about the dictionary, not computing.
    entries = [e for e in entries if e["text"] and "introduction" not in e["categories"]]
    subset = select_entries(entries, args.num_entries, args.core)

    titles = {e["title"] for e in subset}
    n_links = n_resolved = 0
    for entry in subset:
        for link in entry["links"]:
            # Resolved against the whole dictionary (index headwords included), kept only if inside the extract.
            if link["target_title"] not in titles:
                link["target_title"] = None
            n_links += 1
            n_resolved += link["target_title"] is not None
    write_foldoc_jsonl(subset, args.output)
    size = os.path.getsize(args.output)
    print(
        f"{len(subset)} of {len(entries)} entries, {n_links} links, {n_resolved / max(n_links, 1):.1%} pointing "
        f"inside the extract; {args.output}: {size / 1e6:.2f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
