"""Child process of tests/io/test_staged_saves.py: saves a model (and its tokenizer) over an earlier save and dies
there by SIGKILL.

Started once (the imports take seconds); each request forks a fresh child that loads the "new" model and saves it
over the target directory, killed with SIGKILL before its N-th filesystem operation (`kill-after N`) or after a
delay (`kill-at SECONDS`). Requests come as JSON lines on stdin, answers go as JSON lines to stdout.

    {"target": DIR, "kill_after": N}   -> {"killed": true} or {"killed": false, "ops": [...]}
    {"target": DIR, "kill_at": SECONDS} -> the same
"""

import builtins
import io
import json
import os
import signal
import sys
import threading

# Before torch is imported: no OpenMP thread pool, so the children of fork() start clean.
os.environ["OMP_NUM_THREADS"] = "1"

import datasets  # noqa: E402
import transformers  # noqa: E402

from realm_hf import RealmForOpenQA, RealmTokenizer  # noqa: E402

datasets.disable_progress_bars()
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

# Operations that change the filesystem (or open files, where writes start): each one is a kill point.
OS_OPERATIONS = ("replace", "rename", "remove", "unlink", "rmdir", "mkdir", "fsync", "open", "link", "symlink")


def count_operations(kill_after):
    ops = []

    def tick(name, args):
        ops.append(f"{name} {args[0] if args else ''}")
        if kill_after is not None and len(ops) >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(name, function, writes_only=False):
        def wrapper(*args, **kwargs):
            mode = args[1] if len(args) > 1 else kwargs.get("mode", "r")
            if not writes_only or any(c in str(mode) for c in "wax+"):
                tick(name, args)
            return function(*args, **kwargs)

        return wrapper

    for name in OS_OPERATIONS:
        setattr(os, name, wrap(name, getattr(os, name)))
    builtins.open = io.open = wrap("open-file", io.open, writes_only=True)
    return ops


def child(request, model_dir):
    model = RealmForOpenQA.from_pretrained(model_dir)
    tokenizer = RealmTokenizer.from_pretrained(model_dir)
    if request.get("kill_at") is not None:
        threading.Timer(request["kill_at"], os.kill, (os.getpid(), signal.SIGKILL)).start()
    ops = count_operations(request.get("kill_after"))
    model.save_pretrained(request["target"], tokenizer=tokenizer)
    return ops


def main():
    model_dir = sys.argv[1]
    for line in sys.stdin:
        request = json.loads(line)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                ops = child(request, model_dir)
                os.write(write, json.dumps(ops).encode())
                code = 0
            except BaseException as err:  # noqa: BLE001 - reported to the parent
                os.write(write, json.dumps({"error": repr(err)}).encode())
                code = 1
            os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            payload = pipe.read()
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        answer = {"killed": killed}
        if payload:
            answer["result"] = json.loads(payload)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
