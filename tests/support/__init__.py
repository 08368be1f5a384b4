"""What the tests share: fixture paths, tiny models and corpora, the in-process Hub server. No tests live here."""
