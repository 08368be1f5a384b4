"""
Makes docs/images/serve.png, the README's picture of `realm-hf serve`: the tests' tiny model (hidden 32, 2 layers)
and its six-document corpus, its question embedder and reader trained for a few seconds on questions about those
documents, served by `realm_hf.serving.build_app` and photographed in headless chromium (Debian's chromium and
chromium-driver, driven by selenium).

    PYTHONPATH=src python docs/images/serve_screenshot.py
"""

import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_pipeline import DOCS, build_tiny_model  # noqa: E402

from realm_hf.retrieval_realm import RealmRetriever  # noqa: E402
from realm_hf.serving import build_app  # noqa: E402

TRAIN = [
    ("who wrote unix?", ["Ken Thompson", "Dennis Ritchie"]),
    ("who created unix?", ["Ken Thompson", "Dennis Ritchie"]),
    ("who created python?", ["Guido van Rossum"]),
    ("who created lisp?", ["John McCarthy"]),
    ("who started emacs?", ["Richard Stallman"]),
    ("when was lisp created?", ["1958"]),
    ("when was python released?", ["1991"]),
    ("what is a compiler?", ["a program that translates source code into machine code"]),
    ("which language influenced pascal?", ["Algol"]),
]
QUESTION = "who wrote unix?"


def trained_tiny_model(tmp_dir, steps=300):
    model, tokenizer = build_tiny_model(tmp_dir, reader_beam_size=6)
    documents = [{"title": t, "text": x, "doc_id": t.lower()} for t, x in DOCS]
    model.set_retriever(
        RealmRetriever.from_documents(documents, model.embedder, tokenizer, max_block_length=48, show_progress=False)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    questions, answers = [q for q, _ in TRAIN], [a for _, a in TRAIN]
    model.train()
    for step in range(steps):
        if step % 50 == 0:
            print(f"training step {step}/{steps}", file=sys.stderr, flush=True)
        out = model(**tokenizer(questions, padding=True, return_tensors="pt"), answers=answers)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def main(path=os.path.join(ROOT, "docs", "images", "serve.png")):
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = trained_tiny_model(tmp)
        app = build_app(model, top_k=3, num_blocks=3, title="REALM question answering")
        _, url, _ = app.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1000,760",
            "--hide-scrollbars",
            f"--user-data-dir={tmp}/profile",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService("/usr/bin/chromedriver"))
        try:
            wait = WebDriverWait(driver, 60)
            driver.get(url)
            wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#question textarea"))).send_keys(
                QUESTION
            )
            wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#ask"))).click()
            wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#answers mark")))
            driver.save_screenshot(path)
        finally:
            driver.quit()
            app.close()
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:])
