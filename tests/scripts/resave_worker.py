"""Child process of tests/io/test_consistent_reads.py: saves two models into one directory in turn while the test
loads it.

    python resave_worker.py TARGET DIR_A DIR_B SAVES

Loads the models saved in DIR_A and DIR_B (each with its retriever), prints "ready", then saves them alternately
into TARGET, SAVES times in all, and prints "done".
"""

import os
import sys

os.environ["OMP_NUM_THREADS"] = "1"

import datasets  # noqa: E402
import transformers  # noqa: E402

from realm_hf import RealmForOpenQA  # noqa: E402

datasets.disable_progress_bars()
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def main():
    target, dir_a, dir_b, saves = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    models = [RealmForOpenQA.from_pretrained(dir_a), RealmForOpenQA.from_pretrained(dir_b)]
    print("ready", flush=True)
    for i in range(saves):
        models[i % 2].save_pretrained(target, model_card=False)
    print("done", flush=True)


if __name__ == "__main__":
    main()
