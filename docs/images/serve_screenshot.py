"""
Makes docs/images/serve.png, the README's picture of `realm-hf serve`: the tests' tiny model (hidden 32, 2 layers,
random weights, so its answers are not meant to be right) and its six-document corpus, served by
`realm_hf.serving.build_app` and photographed in headless chromium (Debian's chromium and chromium-driver, driven by
selenium), as tests/serving/test_app.py does.

    PYTHONPATH=src python docs/images/serve_screenshot.py [OUTPUT.png]
"""

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_serve import _tiny_served_model  # noqa: E402

from realm_hf.serving import build_app  # noqa: E402

QUESTION = "who wrote unix?"


def main(path=os.path.join(ROOT, "docs", "images", "serve.png")):
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    with tempfile.TemporaryDirectory() as tmp:
        app = build_app(_tiny_served_model(tmp), top_k=3, title="Tiny REALM")
        _, url, _ = app.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
        flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
        flags += ["--window-size=1100,1000", f"--user-data-dir={tmp}/profile"]
        for flag in flags:
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService("/usr/bin/chromedriver"))
        try:
            wait = WebDriverWait(driver, 60)
            driver.get(url)
            box = wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#question textarea")))
            box.send_keys(QUESTION)
            wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#ask"))).click()
            wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#answers mark")))
            driver.save_screenshot(path)
        finally:
            driver.quit()
            app.close()
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:])
