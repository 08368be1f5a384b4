"""
`realm-hf serve`: the Gradio app over a tiny model and corpus, through Gradio's API (`gradio_client`, on loopback) and
through its page in a real headless browser (Debian's chromium and chromium-driver, driven by selenium).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

import realm_hf
from realm_hf.models.openqa_answers import DEFAULT_NO_ANSWER_THRESHOLD
from realm_hf.models.provenance import PROVENANCE_KEYS
from realm_hf.retrieval.retriever import RealmRetriever
from realm_hf.serving import RealmQAService, WriteRefused
from tests.support.paths import REPO
from tests.support.tiny_model import DOCS, build_tiny_model

gradio = pytest.importorskip("gradio", reason="realm-hf[serve] is not installed (pip install 'realm-hf[serve]')")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from realm_hf.serving import answers_html, build_app  # noqa: E402

TOKEN = "test-write-token"
QUESTION = "who wrote unix?"
EXTRA = {"title": "Fortran", "text": "Fortran is a programming language created by John Backus.", "doc_id": "fortran"}
ARTIFACTS = os.path.join(REPO, "test-artifacts")


def _tiny_served_model(tmp_dir):
    """The pipeline tests' tiny model, with a corpus built from documents (so blocks carry a doc_id)."""
    model, tokenizer = build_tiny_model(tmp_dir, reader_beam_size=3)
    documents = [{"title": t, "text": x, "doc_id": t.lower()} for t, x in DOCS]
    retriever = RealmRetriever.from_documents(
        documents, model.embedder, tokenizer, max_block_length=48, show_progress=False
    )
    model.set_retriever(retriever)
    return model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = _tiny_served_model(str(tmp_path_factory.mktemp("serve")))
    # The tiny model's reader is random (its best spans score ~0.01-0.03): served with no threshold, it answers.
    app = build_app(model, write_token=TOKEN, top_k=3, title="Tiny REALM", no_answer_threshold=0)
    _, url, _ = app.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        yield model, app, url
    finally:
        app.close()


@pytest.fixture(scope="module")
def client(served):
    return Client(served[2], verbose=False)


def _comparable(records):
    return [
        (
            r["question"],
            r["rank"],
            r["answer"],
            round(r["score"], 5),
            r["start"],
            r["end"],
            (r["block"] or {}).get("block_id"),
        )
        for r in records
    ]


def test_api_answers_in_the_provenance_schema(served, client):
    model, _, _ = served
    records = client.predict(QUESTION, 3, api_name="/answer")
    assert [r["rank"] for r in records] == list(range(1, len(records) + 1)) and 1 <= len(records) <= 3
    for record in records:
        assert list(record)[:7] == ["question", "rank", "answer", "score", "logit", "start", "end"]
        block = record["block"]
        assert tuple(block)[: len(PROVENANCE_KEYS)] == PROVENANCE_KEYS
        assert block["text"][record["start"] : record["end"]] == record["answer"]
        assert (block["title"], block["text"]) in DOCS and block["doc_id"] == block["title"].lower()
        assert 0 < record["score"] <= 1
    # The same records as the pipeline (hence `realm-hf ask --json`), and the best one as `model.answer()`.
    pipeline_answers = realm_hf.pipeline("question-answering", model=model)(QUESTION, top_k=3)
    expected = [{"question": QUESTION, "rank": i, **a} for i, a in enumerate(pipeline_answers, 1) if a["answer"]]
    assert _comparable(records) == _comparable(expected)
    assert records[0]["block"] == pytest.approx(expected[0]["block"])
    best = model.answer(QUESTION)
    assert (records[0]["answer"], records[0]["block"]["block_id"]) == (best["answer"], best["block"]["block_id"])
    assert records[0]["score"] == pytest.approx(best["score"], abs=1e-5)


def test_api_refuses_bad_input_with_its_reason(client):
    with pytest.raises(AppError, match="top_k must be an integer from 1 to 20"):
        client.predict(QUESTION, 0, api_name="/answer")
    with pytest.raises(AppError, match="Empty question"):
        client.predict("   ", 1, api_name="/answer")


def test_api_writes_need_the_token(served, client):
    model, _, _ = served
    before = model.retriever.num_blocks
    for token in ("", "wrong-token"):
        with pytest.raises(AppError, match="Refused: missing or wrong write token"):
            client.predict(token, EXTRA["text"], EXTRA["title"], EXTRA["doc_id"], api_name="/add_document")
        with pytest.raises(AppError, match="Refused"):
            client.predict(token, "unix", api_name="/remove_document")
    assert model.retriever.num_blocks == before
    added = client.predict(TOKEN, EXTRA["text"], EXTRA["title"], EXTRA["doc_id"], api_name="/add_document")
    assert added["doc_id"] == "fortran" and len(added["block_ids"]) == 1
    block = model.retriever.store.blocks(added["block_ids"])[0]
    assert (block["title"], block["text"], block["doc_id"]) == (EXTRA["title"], EXTRA["text"], EXTRA["doc_id"])
    removed = client.predict(TOKEN, "fortran", api_name="/remove_document")
    assert removed == {"doc_id": "fortran", "block_ids": added["block_ids"]}
    assert model.retriever.num_blocks == before
    with pytest.raises(AppError, match="No document with doc_id 'fortran'"):
        client.predict(TOKEN, "fortran", api_name="/remove_document")


def test_a_server_started_without_a_token_refuses_every_write(served, monkeypatch):
    monkeypatch.delenv("REALM_HF_SERVE_WRITE_TOKEN", raising=False)
    service = RealmQAService(served[0])
    assert not service.writes_enabled
    for token in (None, "", TOKEN):
        with pytest.raises(WriteRefused, match="disabled.*--write-token"):
            service.add_document(token, EXTRA["text"])
    monkeypatch.setenv("REALM_HF_SERVE_WRITE_TOKEN", "from-env")
    service = RealmQAService(served[0])
    with pytest.raises(WriteRefused, match="wrong write token"):
        service.remove_document(TOKEN, "unix")
    with pytest.raises(ValueError, match="The write token is empty"):
        RealmQAService(served[0], write_token="  ")


def test_concurrent_requests_answer_from_one_index_state_each(served, client):
    """
    Eight questions at once (four run together) while a writer adds and removes a document: every answer is one of
    the two states' answers (with or without the extra document), never a mix.
    """
    model, app, _ = served
    service = app.realm_service
    questions = ["who wrote unix?", "what is a compiler?", "who created python?", "which language is lisp?"]
    # The expected answers of each state, from the service itself called one at a time.
    without = {q: _state_view(service.answer(q)) for q in questions}
    ids = service.add_document(TOKEN, EXTRA["text"], EXTRA["title"], "fortran-state")["block_ids"]
    with_extra = {q: _state_view(service.answer(q)) for q in questions}
    service.remove_document(TOKEN, "fortran-state")
    assert len(ids) == 1

    inflight, peak, lock = [0], [0], threading.Lock()
    answer = service.answer

    def counted_answer(*args, **kwargs):
        with lock:
            inflight[0] += 1
            peak[0] = max(peak[0], inflight[0])
        try:
            time.sleep(0.05)  # holds each request long enough for the queue to start the next ones beside it
            return answer(*args, **kwargs)
        finally:
            with lock:
                inflight[0] -= 1

    stop, errors = threading.Event(), []

    def write():
        try:
            while not stop.is_set():
                service.add_document(TOKEN, EXTRA["text"], EXTRA["title"], "fortran-state")
                service.remove_document(TOKEN, "fortran-state")
        except Exception as error:  # noqa: BLE001 - reported by the test
            errors.append(repr(error))

    service.answer = counted_answer
    writer = threading.Thread(target=write)
    writer.start()
    try:
        jobs = [(q, client.submit(q, 3, api_name="/answer")) for q in questions * 2]
        results = [(q, job.result(timeout=60)) for q, job in jobs]
    finally:
        stop.set()
        writer.join(timeout=60)
        del service.answer
    assert not errors, errors
    assert peak[0] >= 2  # requests really ran together
    for question, records in results:
        assert _state_view(records) in (without[question], with_extra[question]), question


def _state_view(records):
    # Block ids of the extra document change with every add: compare blocks by their content.
    return [(r["answer"], round(r["score"], 4), r["block"]["title"], r["block"]["text"]) for r in records]


def test_the_answers_html_escapes_corpus_text_and_marks_the_span():
    from realm_hf.serving import answers_html

    text = "<b>Unix</b> was written by Ken Thompson & Dennis Ritchie ${1+1} {{value}}."
    start = text.index("Ken")
    block = {"block_id": 3, "doc_id": "<i>unix</i>", "title": "Unix <script>", "text": text, "retrieval_score": 1.0}
    record = {"question": "q", "rank": 1, "answer": "Ken Thompson", "score": 0.25, "start": start, "end": start + 12}
    page = answers_html([{**record, "block": block}])
    assert "<script>" not in page and "<b>Unix</b>" not in page and "<i>unix" not in page
    assert "&lt;b&gt;Unix&lt;/b&gt; was written by <mark" in page
    assert ">Ken Thompson</mark> &amp; Dennis Ritchie ${1+1} {{value}}." in page
    assert "p = 0.250" in page and "Unix &lt;script&gt;" in page and "doc_id &lt;i&gt;unix&lt;/i&gt;" in page
    assert "retrieval score 1.00" in page  # each source with its retrieval score, beside the answer's probability
    # No offsets (a slow tokenizer): the text without a highlight; no span found: said so.
    assert "<mark" not in answers_html([{**record, "start": None, "end": None, "block": block}])
    assert "No answer found" in answers_html([{**record, "answer": "", "block": None}])


def test_a_question_the_reader_is_unsure_of_gets_no_answer_with_its_probability(served):
    model = served[0]
    best = model.answer(QUESTION)
    assert best["score"] < DEFAULT_NO_ANSWER_THRESHOLD  # the tiny reader is random
    service = RealmQAService(model)  # the served default: config.no_answer_threshold, else 0.1
    assert service.no_answer_threshold == DEFAULT_NO_ANSWER_THRESHOLD
    (record,) = service.answer(QUESTION, 3)
    assert (record["rank"], record["answer"], record["block"]) == (1, "", None)
    assert record["score"] == pytest.approx(best["score"], abs=1e-5)  # the declined span's probability
    page = answers_html([record], service.no_answer_threshold)
    assert "No answer" in page and f"p = {best['score']:.3f}" in page and "threshold (0.1)" in page
    # A model's own threshold is the served default; 0 answers every question.
    model.config.no_answer_threshold = best["score"] / 2
    try:
        assert RealmQAService(model).answer(QUESTION, 1)[0]["answer"] == best["answer"]
    finally:
        model.config.no_answer_threshold = None
    assert RealmQAService(model, no_answer_threshold=0).answer(QUESTION, 1)[0]["answer"] == best["answer"]


def test_an_error_replaces_the_previous_answers_on_the_page(served):
    from realm_hf.serving.app import _page_answers

    service = served[1].realm_service
    page, records = _page_answers(service, QUESTION, 2)
    assert "realm-answer" in page and len(records) == 2
    # The page's outputs are replaced whole: the error, and no records left from the question before.
    page, records = _page_answers(service, "   ", 2)
    assert records == [] and "realm-error" in page and "Empty question" in page and "realm-answer" not in page


def _untrained_notices(app):
    return [block for block in app.blocks.values() if getattr(block, "elem_id", None) == "untrained-notice"]


def test_the_page_says_when_the_reader_was_never_trained(served):
    model = served[0]
    assert _untrained_notices(served[1]) == []  # a trained reader: no notice
    model.config.reader_trained = False
    try:
        app = build_app(model, no_answer_threshold=0)
    finally:
        model.config.reader_trained = True
    (notice,) = _untrained_notices(app)
    assert "reader was never trained" in notice.value and "realm-hf train" in notice.value
    assert not app.realm_service.reader_trained


def test_serve_help_imports_nothing_heavy():
    # As for every command (tests/cli/test_cli.py): `--help` answers before torch, realm_hf or gradio is imported.
    probe = (
        "import contextlib, io, sys\n"
        "from realm_hf_cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    status = main(['serve', '--help'])\n"
        "heavy = [m for m in ('realm_hf', 'torch', 'transformers', 'gradio') if m in sys.modules]\n"
        "print(status, heavy, 'examples:' in out.getvalue(), '--write-token' in out.getvalue())\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(ARTIFACTS), "src"))
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert result.stdout.split("\n")[0] == "0 [] True True", result.stderr


def test_serve_without_gradio_names_the_extra(tmp_path, monkeypatch, capsys):
    from realm_hf.cli import main

    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` now raises ImportError
    assert main(["serve", str(tmp_path / "no-model")]) == 2
    assert "pip install 'realm-hf[serve]'" in capsys.readouterr().err
    assert main(["serve", "x", "--port", "70000"]) == 2
    assert "--port must be from 0 to 65535" in capsys.readouterr().err


# --- the page, in a real browser --------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1100,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_shows_answers_with_the_span_highlighted_and_refuses_a_write(served, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    model, app, url = served
    expected = app.realm_service.answer(QUESTION)
    wait = WebDriverWait(browser, 30)
    browser.get(url)
    box = wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#question textarea")))
    box.send_keys(QUESTION)
    wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#ask"))).click()
    marks = wait.until(
        expected_conditions.presence_of_all_elements_located((By.CSS_SELECTOR, "#answers mark.realm-answer-span"))
    )
    cards = browser.find_elements(By.CSS_SELECTOR, "#answers .realm-answer")
    assert len(cards) == len(expected) == len(marks)
    for card, mark, record in zip(cards, marks, expected):
        assert mark.text == record["answer"]
        assert card.find_element(By.CSS_SELECTOR, ".realm-title").text == record["block"]["title"]
        assert card.find_element(By.CSS_SELECTOR, ".realm-doc-id").text == f"doc_id {record['block']['doc_id']}"
        assert f"p = {record['score']:.3f}" in card.text
        assert card.find_element(By.CSS_SELECTOR, ".realm-block").text == record["block"]["text"]
    os.makedirs(ARTIFACTS, exist_ok=True)
    for path in (tmp_path / "serve-page.png", os.path.join(ARTIFACTS, "serve-page.png")):
        assert browser.save_screenshot(str(path))

    # A write from the page without the token is refused, on the page, and the corpus is unchanged.
    before = model.retriever.num_blocks
    wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#documents button"))).click()
    text = wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#doc-text textarea")))
    text.send_keys(EXTRA["text"])
    wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#add-document"))).click()
    status = wait.until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#write-status .realm-write-status"))
    )
    assert re.search(r"Refused: missing or wrong write token", status.text)
    assert model.retriever.num_blocks == before
    browser.save_screenshot(os.path.join(ARTIFACTS, "serve-page-refused-write.png"))


def test_realm_hf_serve_loads_binds_loopback_and_answers(served, tmp_path, monkeypatch, capsys):
    """The command's wiring, in this process: a saved model loaded, loopback bound, answers and refusals served."""
    from realm_hf.cli import main

    model, _, _ = served
    model_dir = str(tmp_path / "model")
    model.save_pretrained(model_dir)
    monkeypatch.setenv("REALM_HF_SERVE_WRITE_TOKEN", TOKEN)
    launched = {}
    launch = gradio.Blocks.launch

    def launch_and_return(self, **kwargs):
        # `realm-hf serve` blocks until Ctrl+C; here the server keeps running in its thread and the test goes on.
        launched.update(kwargs, app=self)
        return launch(self, **kwargs, prevent_thread_lock=True)

    monkeypatch.setattr(gradio.Blocks, "launch", launch_and_return)
    port = _free_port()
    assert main(["serve", model_dir, "--port", str(port), "--top-k", "2"]) == 0
    try:
        assert (launched["server_name"], launched["server_port"]) == ("127.0.0.1", port)
        assert "document writes are allowed with the write token" in capsys.readouterr().err
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        records = client.predict(QUESTION, 2, api_name="/answer")
        assert _comparable(records) == _comparable(RealmQAService(model).answer(QUESTION, 2))
        with pytest.raises(AppError, match="Refused"):
            client.predict("wrong", "unix", api_name="/remove_document")
        removed = client.predict(TOKEN, "unix", api_name="/remove_document")  # the served copy, not `model`
        assert len(removed["block_ids"]) == 1 and model.retriever.num_blocks == len(DOCS)
    finally:
        launched["app"].close()


@pytest.mark.slow
def test_realm_hf_serve_command_answers_over_gradio_client(served, tmp_path):
    """The console command end to end: load a saved model, bind loopback, answer a client, refuse a tokenless write."""
    model, _, _ = served
    model_dir = str(tmp_path / "model")
    model.save_pretrained(model_dir)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", REALM_HF_SERVE_WRITE_TOKEN=TOKEN)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(ARTIFACTS), "src"), env.get("PYTHONPATH", "")])
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "realm_hf.cli", "serve", model_dir, "--port", str(port), "--top-k", "2"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300  # a loaded machine imports torch slowly
        while "Running on local URL" not in log_path.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the server did not start:\n" + log_path.read_text())
            time.sleep(0.2)
        assert f"http://127.0.0.1:{port}" in log_path.read_text()
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        records = client.predict(QUESTION, 2, api_name="/answer")
        expected = RealmQAService(model).answer(QUESTION, 2)
        assert _comparable(records) == _comparable(expected)
        with pytest.raises(AppError, match="Refused"):
            client.predict("wrong", "unix", api_name="/remove_document")
    finally:
        server.terminate()
        server.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------ what the server exposes


def _raw(url, method="GET", path="/", **kwargs):
    import httpx

    with httpx.Client(timeout=30) as http:
        return http.request(method, url.rstrip("/") + path, **kwargs)


def test_requests_naming_another_host_are_refused(served):
    """A page on another site re-pointing its name to 127.0.0.1 (DNS rebinding) could read `/answer`."""
    url = served[2]
    port = url.rstrip("/").rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", ""):
        response = _raw(url, headers={"Host": host})
        assert response.status_code == 400, host
        assert "--allowed-host" in response.json()["error"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
        assert _raw(url, headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_are_served(served):
    from realm_hf.serving.app import served_hosts

    model = served[0]
    app = build_app(model, allowed_hosts=["realm.example.org", "*.corp.example"], title="Proxied")
    _, url, _ = app.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        for host in ("realm.example.org", "realm.example.org:443", "a.corp.example"):
            assert _raw(url, headers={"Host": host}).status_code == 200, host
        assert _raw(url, headers={"Host": "corp.example.evil"}).status_code == 400
    finally:
        app.close()
    assert served_hosts("0.0.0.0") == ("localhost", "127.0.0.1", "::1")
    assert "10.1.2.3" in served_hosts("10.1.2.3")


def test_uploads_need_the_write_token_and_are_bounded(served):
    """Without a token, any client could store files of any size in Gradio's temporary folder and read them back."""
    url = served[2]
    files = {"files": ("notes.txt", b"hello", "text/plain")}
    for headers in ({}, {"X-Realm-Write-Token": "wrong-token"}):
        response = _raw(url, "POST", "/gradio_api/upload", files=files, headers=headers)
        assert response.status_code == 403
        assert "X-Realm-Write-Token".lower() in response.json()["error"]
    good = _raw(url, "POST", "/gradio_api/upload", files=files, headers={"X-Realm-Write-Token": TOKEN})
    assert good.status_code == 200, good.text
    big = {"files": ("big.bin", b"x" * (2 << 20), "application/octet-stream")}
    response = _raw(url, "POST", "/gradio_api/upload", files=big, headers={"X-Realm-Write-Token": TOKEN})
    assert response.status_code == 413


def test_request_bodies_are_bounded_with_or_without_a_length(served):
    url = served[2]
    payload = json.dumps({"data": ["x" * (2 << 20), 3]}).encode()
    response = _raw(
        url, "POST", "/gradio_api/call/answer", content=payload, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413

    def chunks():
        for _ in range(64):
            yield b"x" * 65536

    response = _raw(
        url, "POST", "/gradio_api/call/answer", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413


def test_request_fields_are_bounded_and_typed(served):
    from realm_hf.serving.service import MAX_DOCUMENT_CHARS, MAX_QUESTION_CHARS

    service = served[1].realm_service
    with pytest.raises(ValueError, match=f"at most {MAX_QUESTION_CHARS:,}"):
        service.answer("who wrote unix? " * 1000)
    with pytest.raises(ValueError, match=f"at most {MAX_DOCUMENT_CHARS:,}"):
        service.add_document(TOKEN, "x " * MAX_DOCUMENT_CHARS)
    with pytest.raises(ValueError, match="title must be a string, got int"):
        service.add_document(TOKEN, "Fortran is a language.", title=5)
    with pytest.raises(ValueError, match="doc_id must be a string, got list"):
        service.remove_document(TOKEN, ["unix"])


def test_a_non_string_token_gets_a_clear_refusal(served, client):
    service = served[1].realm_service
    for token in (5, ["test-write-token"], {"a": 1}):
        with pytest.raises(WriteRefused, match="must be a string"):
            service.add_document(token, EXTRA["text"])
    with pytest.raises(AppError, match="must be a string, got int"):
        client.predict(5, "unix", api_name="/remove_document")


@pytest.mark.parametrize("spelling", ["0_5", "+4", "٣", "05", "4.0"])
def test_integer_doc_ids_are_read_only_in_their_own_spelling(tmp_path, spelling):
    model, tokenizer = build_tiny_model(str(tmp_path), reader_beam_size=3)
    documents = [{"title": t, "text": x, "doc_id": i} for i, (t, x) in enumerate(DOCS)]
    model.set_retriever(
        RealmRetriever.from_documents(documents, model.embedder, tokenizer, max_block_length=48, show_progress=False)
    )
    service = RealmQAService(model, write_token=TOKEN)
    before = model.retriever.num_blocks
    with pytest.raises(ValueError, match="ASCII digits"):
        service.remove_document(TOKEN, spelling)
    assert model.retriever.num_blocks == before
    assert service.remove_document(TOKEN, "3")["doc_id"] == "3"
    assert model.retriever.num_blocks == before - 1
