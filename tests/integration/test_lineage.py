"""`runledger lineage RUN`: OpenLineage events for a run's start, each attempt and its end, validated against
the OpenLineage spec's JSON Schema, with inputs, outputs and decisions matching the ledger.

openlineage-python ships no JSON Schema file (its classes are generated from the spec), so the spec's
schemas of the version the client writes (OpenLineage.json 2-0-2 and the standard facets used) are kept
in tests/openlineage/, from the OpenLineage repository (Apache-2.0), and runledger's own facets' schema
in interop/facets/."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.lineage import LINEAGE_RUN, write_ledger
from support.processes import cli


def test_lineage_posts_with_the_clients_http_transport(root):
    write_ledger(root)
    received = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = cli("lineage", LINEAGE_RUN, "--root", str(root), "--to", f"http://127.0.0.1:{server.server_port}/api/v1/lineage")
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert [p for p, _ in received] == ["/api/v1/lineage"] * 4
    assert [e["eventType"] for _, e in received] == ["START", "OTHER", "RUNNING", "COMPLETE"]
