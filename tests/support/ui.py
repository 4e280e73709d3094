"""ui: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from runledger.ui.access import configure
from runledger.ui.app import create_app


def client(root: Path, host: str, **tokens) -> TestClient:
    """The app as the page calls it: every request with the header no other origin's page can send."""
    return TestClient(create_app(root, None, configure(host, **tokens)), base_url="http://127.0.0.1:8765",
                      headers={"x-requested-with": "runledger"})
