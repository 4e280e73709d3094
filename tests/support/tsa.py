"""A local RFC 3161 time-stamping authority for tests: a CA and a TSA certificate (extendedKeyUsage
critical timeStamping) made with `openssl` in a folder, and an HTTP server in a thread that answers each
POSTed `application/timestamp-query` with what `openssl ts -reply` makes of it. It keeps its port across
stop/start (an authority that was down and is back). Nothing is downloaded; no network beyond loopback."""

from __future__ import annotations

import http.server
import subprocess
import tempfile
import threading
from pathlib import Path

OPENSSL = "/usr/bin/openssl"

CONFIG = """\
[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
serial = {dir}/serial
crypto_device = builtin
signer_cert = {dir}/tsa.crt
signer_key = {dir}/tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = yes
tsa_name = yes
ess_cert_id_alg = sha256
[ tsa_ext ]
basicConstraints = critical,CA:false
keyUsage = critical,digitalSignature
extendedKeyUsage = critical,timeStamping
"""


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"openssl {' '.join(args)}: {r.stderr}"


class LocalTSA:
    """A TSA named `name` in `folder`: `certs` is the PEM file of its root (what a verifier is given),
    `url` where it answers once started."""

    def __init__(self, folder: Path, name: str = "test TSA") -> None:
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "ts.cnf"
        self.config.write_text(CONFIG.format(dir=self.dir))
        (self.dir / "serial").write_text("01\n")
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
        _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
                 "-subj", f"/CN={name} root", cwd=self.dir)
        _openssl("req", *ec, "-keyout", "tsa.key", "-out", "tsa.csr", "-subj", f"/CN={name}", cwd=self.dir)
        _openssl("x509", "-req", "-in", "tsa.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "tsa.crt", "-days", "3650", "-extfile", "ts.cnf", "-extensions", "tsa_ext", cwd=self.dir)
        self.certs = self.dir / "ca.crt"
        self.port = 0
        self.requests = 0
        self._lock = threading.Lock()  # (openssl ts keeps its serial in a file)
        self._server: http.server.ThreadingHTTPServer | None = None

    def reply(self, query: bytes) -> bytes:
        """What `openssl ts -reply` answers to `query` (a DER TimeStampReq)."""
        with self._lock, tempfile.TemporaryDirectory(dir=self.dir) as tmp:
            (Path(tmp) / "q.tsq").write_bytes(query)
            _openssl("ts", "-reply", "-config", str(self.config), "-queryfile", "q.tsq", "-out", "r.tsr", cwd=Path(tmp))
            self.requests += 1
            return (Path(tmp) / "r.tsr").read_bytes()

    def start(self) -> "LocalTSA":
        tsa = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                query = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Type") != "application/timestamp-query":
                    self.send_error(415)
                    return
                body = tsa.reply(query)
                self.send_response(200)
                self.send_header("Content-Type", "application/timestamp-reply")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="local TSA", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
