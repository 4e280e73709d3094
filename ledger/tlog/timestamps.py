"""RFC 3161 timestamps of checkpoints: a time-stamping authority's signed word that a checkpoint existed
by its genTime. The message stamped is the checkpoint's text (origin, size, root hash: what the log's key
and the witnesses sign), hashed with SHA-256. The authority's reply (a DER TimeStampResp, as
`openssl ts -reply` writes it) is kept per checkpoint size at `tlog/timestamp/<size>.tsr` beside the tiles
(a log never signs two roots for one size, so the size names the checkpoint), public like them.

A token is checked (rfc3161-client, the `[attest]` extra, imported only here and only when a token is
asked for or checked) against the authority's certificates, a PEM file ($RUNLEDGER_TLOG_TSA_CERTS): the
signature chains to one of its self-signed roots (its other certificates serve as intermediates), the
signer's certificate has the critical timeStamping key usage, and the imprint is the SHA-256 of the
checkpoint's text. The nonce is checked when the ledger receives the reply, and not kept."""

from __future__ import annotations

import datetime
import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

TSA_ENV = "RUNLEDGER_TLOG_TSA"  # the authority's URL (RFC 3161 over HTTP)
TSA_CERTS_ENV = "RUNLEDGER_TLOG_TSA_CERTS"  # a PEM file: the authority's root certificate(s), intermediates
FOLDER = "timestamp"  # tlog/timestamp/<size>.tsr
SUFFIX = ".tsr"
QUERY_TYPE = "application/timestamp-query"  # RFC 3161 section 3.4
REPLY_TYPE = "application/timestamp-reply"
SHA256 = "2.16.840.1.101.3.4.2.1"  # id-sha256: the only imprint algorithm accepted
GRANTED = 0  # RFC 3161 PKIStatus granted (1, grantedWithMods, is refused as rfc3161-client refuses it)
TIMEOUT_S = 10.0  # one request; an authority slower than that is taken as down this round
MAX_REPLY = 1 << 16  # a reply with its certificates is a few KiB


class TimestampRefused(Exception):
    """A token that does not check, an authority that gave none, or certificates that do not load; one line."""


@dataclass(frozen=True)
class Stamp:
    """A token that checked: the size of the checkpoint it stamps, its genTime, the authority's name, and the
    accuracy of its genTime that the token states (0 when it states none)."""

    size: int
    gen_time: datetime.datetime
    authority: str
    accuracy_s: float = 0.0


def rfc3161():
    """The rfc3161_client module, or TimestampRefused saying how to install it."""
    try:
        import rfc3161_client
    except ImportError:
        raise TimestampRefused("RFC 3161 timestamps need rfc3161-client: pip install 'runledger[attest]'") from None
    return rfc3161_client


def path_of(size: int) -> str:
    """A checkpoint's token, relative to its log's folder."""
    return f"{FOLDER}/{size}{SUFFIX}"


def sizes_in(log_dir: Path) -> list[int]:
    """The checkpoint sizes a log's folder holds a token for, ascending."""
    names = (p.name[:-len(SUFFIX)] for p in (Path(log_dir) / FOLDER).glob(f"*{SUFFIX}"))
    return sorted(int(n) for n in names if n.isdigit())


@dataclass(frozen=True)
class Authority:
    """A time-stamping authority: its URL (None when only checking), its roots and intermediates."""

    url: str | None
    roots: tuple
    intermediates: tuple

    @classmethod
    def load(cls, certs: str | Path, url: str | None = None) -> "Authority":
        """The authority whose certificates are the PEM file `certs` (TimestampRefused if it holds no root)."""
        rfc3161()
        from cryptography import x509

        try:
            found = x509.load_pem_x509_certificates(Path(certs).read_bytes())
        except OSError as err:
            raise TimestampRefused(f"{certs}: {err.strerror}") from None
        except ValueError as err:
            raise TimestampRefused(f"{certs}: not PEM certificates ({err})") from None
        roots = tuple(c for c in found if c.issuer == c.subject)
        if not roots:
            raise TimestampRefused(f"{certs}: no self-signed root certificate (a token is checked up to a root)")
        return cls(url, roots, tuple(c for c in found if c.issuer != c.subject))

    def verifier(self, request=None):
        r = rfc3161()
        builder = r.VerifierBuilder.from_request(request) if request is not None else r.VerifierBuilder()
        for c in self.roots:
            builder = builder.add_root_certificate(c)
        for c in self.intermediates:
            builder = builder.add_intermediate_certificate(c)
        return builder.build()

    def check(self, reply: bytes, text: str, size: int, request=None) -> Stamp:
        """The Stamp of `reply` over checkpoint `text` (of `size`); TimestampRefused with the reason."""
        r = rfc3161()
        try:
            resp = r.decode_timestamp_response(reply)
            status = resp.status
            algorithm = resp.tst_info.message_imprint.hash_algorithm.dotted_string if status == GRANTED else None
        except Exception as err:  # (the Rust parser's errors are ValueError and others)
            raise TimestampRefused(f"not an RFC 3161 reply ({err.__class__.__name__}: {str(err)[:120]})") from None
        if status != GRANTED:
            raise TimestampRefused(f"the authority did not grant it (status {status}: "
                                   f"{' '.join(resp.status_string)[:120] or 'no reason given'})")
        if algorithm != SHA256:
            raise TimestampRefused("its imprint is not a SHA-256 hash")
        try:
            self.verifier(request).verify(resp, hashlib.sha256(text.encode()).digest())
        except (r.VerificationError, ValueError) as err:
            raise TimestampRefused(_reason(str(err))) from None
        return Stamp(size, resp.tst_info.gen_time, _name_of(resp), _accuracy_of(resp))

    def request(self, text: str, size: int) -> tuple[bytes, Stamp]:
        """Ask the authority to stamp checkpoint `text`: the reply, checked (nonce included), and its Stamp."""
        r = rfc3161()
        req = r.TimestampRequestBuilder().data(text.encode()).hash_algorithm(r.HashAlgorithm.SHA256).build()
        http = urllib.request.Request(self.url, data=req.as_bytes(), method="POST",
                                      headers={"Content-Type": QUERY_TYPE, "Accept": REPLY_TYPE})
        try:
            with urllib.request.urlopen(http, timeout=TIMEOUT_S) as answer:  # noqa: S310 (the URL configured)
                reply = answer.read(MAX_REPLY + 1)
                ctype = answer.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            raise TimestampRefused(f"HTTP {err.code} {err.reason}") from None
        except (OSError, ValueError) as err:
            raise TimestampRefused(f"unreachable ({err.__class__.__name__}: {err})") from None
        if ctype.split(";")[0].strip() != REPLY_TYPE:
            raise TimestampRefused(f"a reply of type {ctype or 'none'!r}, not {REPLY_TYPE}")
        if len(reply) > MAX_REPLY:
            raise TimestampRefused(f"a reply longer than {MAX_REPLY} bytes")
        return reply, self.check(reply, text, size, req)


def _reason(err: str) -> str:
    """rfc3161-client's reason, said as what it means for a checkpoint's token."""
    if "Mismatch between messages" in err:
        return "it stamps another message, not this checkpoint's text"
    if "certificate" in err.lower() and "verify" in err.lower():
        return "its signature does not check against the authority's certificates (altered, or another signer)"
    if "Nonce mismatch" in err:
        return "its nonce is not the request's (a replayed reply?)"
    return err.split("\n")[0][:200]


def _accuracy_of(resp) -> float:
    """The token's stated accuracy of its genTime, in seconds (RFC 3161 Accuracy; 0 when absent)."""
    try:
        a = resp.tst_info.accuracy
        return float(a.seconds or 0) + (a.millis or 0) / 1e3 + (a.micros or 0) / 1e6
    except Exception:  # noqa: BLE001 (a token without the optional accuracy field)
        return 0.0


def _name_of(resp) -> str:
    """The authority's name as the token gives it (its tsa field, else its signer's issuer)."""
    try:
        name = resp.tst_info.name
        value = getattr(name, "value", None)
        if value is not None:
            return value.rfc4514_string() if hasattr(value, "rfc4514_string") else str(value)
    except Exception:  # noqa: BLE001 (a token without the optional tsa field)
        pass
    infos = list(resp.signed_data.signer_infos)
    return infos[0].issuer.rfc4514_string() if infos else "?"


def from_env() -> Authority | None:
    """The authority of $RUNLEDGER_TLOG_TSA with the certificates of $RUNLEDGER_TLOG_TSA_CERTS; None when
    no URL is set. TimestampRefused (one line) when the certificates are missing or do not load, or
    rfc3161-client is not installed."""
    url = os.environ.get(TSA_ENV)
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise TimestampRefused(f"${TSA_ENV} is not an http(s) URL: {url[:80]!r}")
    certs = os.environ.get(TSA_CERTS_ENV)
    if not certs:
        raise TimestampRefused(f"${TSA_ENV} is set but not ${TSA_CERTS_ENV} (the authority's certificates, PEM): a "
                               f"token the ledger cannot check is not kept")
    return Authority.load(certs, url)
