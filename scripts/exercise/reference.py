#!/usr/bin/env python3
"""A reference solution of the lab's exercise: an idempotent POST /charges.

Python's standard library and SQLite only. The decision is one transaction:
the key's row is claimed (its uniqueness is the table's primary key), the
charge is written, and the answer is stored with the key; a retry finds the
row and gets the stored answer back, byte for byte. See docs/exercise.md.

    python3 scripts/exercise/reference.py --port 8700
    go run ./cmd/lab check -target http://127.0.0.1:8700/charges -token t1 -token2 t2 \
        -readback 'http://127.0.0.1:8700/charges?key={key}' -slow-header 'Work-Ms: 300'
"""

import argparse
import hashlib
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status      INTEGER NOT NULL,
    body        BLOB NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE TABLE IF NOT EXISTS charges (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    key          TEXT NOT NULL,
    account      TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency     TEXT NOT NULL,
    created_at   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS charges_by_key ON charges (tenant, key);
"""

MAX_WORK_MS = 5000


class Problem(Exception):
    """An error answered as application/problem+json (RFC 9457)."""

    def __init__(self, status, code, detail):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail

    def body(self):
        return (json.dumps({"type": "about:blank", "title": self.code.replace("_", " "),
                            "status": self.status, "code": self.code, "detail": self.detail}) + "\n").encode()


def parse_key(lines):
    """The Idempotency-Key: the draft's sf-string ("...", escapes \\" and \\\\) or a bare value."""
    if not lines:
        raise Problem(400, "idempotency_key_missing", "send an Idempotency-Key header")
    if len(lines) > 1:
        raise Problem(400, "invalid_parameter", "Idempotency-Key must be sent once")
    raw = lines[0].strip(" \t")
    if raw.startswith('"'):
        out, i = [], 1
        while i < len(raw):
            c = raw[i]
            if c == "\\" and i + 1 < len(raw) and raw[i + 1] in '"\\':
                out.append(raw[i + 1])
                i += 2
                continue
            if c == '"' and i == len(raw) - 1:
                key = "".join(out)
                break
            if c in '"\\' or not " " <= c <= "~":
                raise Problem(400, "invalid_parameter", "Idempotency-Key is not a valid quoted string")
            out.append(c)
            i += 1
        else:
            raise Problem(400, "invalid_parameter", "Idempotency-Key opens a quote it never closes")
    else:
        key = raw
    if not 1 <= len(key) <= 255 or not all(" " <= c <= "~" for c in key) or key != key.strip():
        raise Problem(400, "invalid_parameter", "Idempotency-Key must be 1..255 printable characters")
    return key


def parse_charge(raw):
    """The business fields, validated; the fingerprint is computed from these, not from the bytes."""
    try:
        req = json.loads(raw)
    except ValueError:
        raise Problem(400, "invalid_parameter", "the body must be JSON")
    if not isinstance(req, dict) or set(req) - {"account", "amount_cents", "currency"}:
        raise Problem(400, "invalid_parameter", "the body holds account, amount_cents and currency only")
    account, amount, currency = req.get("account"), req.get("amount_cents"), req.get("currency", "USD")
    if not isinstance(account, str) or not 1 <= len(account) <= 64:
        raise Problem(400, "invalid_parameter", "account: a string of 1..64 characters")
    if not isinstance(amount, int) or isinstance(amount, bool) or not 1 <= amount <= 10_000_000:
        raise Problem(400, "invalid_parameter", "amount_cents: an integer in 1..10000000")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        raise Problem(400, "invalid_parameter", "currency: three letters")
    return {"account": account, "amount_cents": amount, "currency": currency.upper()}


def fingerprint(charge):
    return hashlib.sha256(json.dumps(charge, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Ledger:
    """The database: one connection per thread, every write serialised by SQLite's write lock."""

    def __init__(self, path, retention_s):
        self.path, self.retention_s = path, retention_s
        self.local = threading.local()
        with self.connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    def connect(self):
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def db(self):
        if not hasattr(self.local, "db"):
            self.local.db = self.connect()
        return self.local.db

    def charge(self, tenant, key, charge, work_s):
        """The decision, in one transaction: claim, charge, store the answer; or replay."""
        fp = fingerprint(charge)
        db = self.db()
        db.execute("BEGIN IMMEDIATE")  # the write lock from the first statement: a twin waits here
        try:
            db.execute("DELETE FROM idempotency_keys WHERE tenant = ? AND key = ? AND created_at < ?",
                       (tenant, key, time.time() - self.retention_s))  # past the retention a key is new
            claimed = db.execute(
                "INSERT INTO idempotency_keys (tenant, key, fingerprint, status, body, created_at)"
                " VALUES (?, ?, ?, 0, x'', ?) ON CONFLICT (tenant, key) DO NOTHING",
                (tenant, key, fp, time.time())).rowcount == 1
            if not claimed:
                status, body, stored_fp = db.execute(
                    "SELECT status, body, fingerprint FROM idempotency_keys WHERE tenant = ? AND key = ?",
                    (tenant, key)).fetchone()
                db.execute("COMMIT")
                if stored_fp != fp:
                    raise Problem(422, "idempotency_key_reused", "this key was used with another request")
                return status, bytes(body), True
            time.sleep(work_s)  # the charge's work (a call to a bank), inside the claim
            status, body = 201, self.apply(db, tenant, key, charge)
            db.execute("UPDATE idempotency_keys SET status = ?, body = ? WHERE tenant = ? AND key = ?",
                       (status, body, tenant, key))
            db.execute("COMMIT")
            return status, body, False
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @staticmethod
    def apply(db, tenant, key, charge):
        """Writes the charge; the answer's bytes are what every replay returns."""
        cid = "ch_" + uuid.uuid4().hex
        created = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        db.execute("INSERT INTO charges (id, tenant, key, account, amount_cents, currency, created_at)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (cid, tenant, key, charge["account"], charge["amount_cents"], charge["currency"], created))
        return (json.dumps({"id": cid, **charge, "created_at": created}) + "\n").encode()

    def charges_under(self, tenant, key):
        rows = self.db().execute(
            "SELECT id, account, amount_cents, currency, created_at FROM charges"
            " WHERE tenant = ? AND key = ? ORDER BY created_at", (tenant, key)).fetchall()
        return [dict(zip(("id", "account", "amount_cents", "currency", "created_at"), r)) for r in rows]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    ledger = None  # set by serve()

    def log_message(self, *args):
        pass

    def send(self, status, body, content_type="application/json", headers=()):
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: the answer is stored, its retry gets it

    def tenant(self):
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise Problem(401, "unauthorized", "send Authorization: Bearer <token>")
        return auth[7:].strip()

    def route(self, method):
        url = urlsplit(self.path)
        if url.path != "/charges":
            raise Problem(404, "not_found", "only /charges is here")
        if method == "GET":  # the read-back: the charges made under a key
            key = parse_qs(url.query).get("key", [""])[0]
            return 200, (json.dumps(self.ledger.charges_under(self.tenant(), key)) + "\n").encode(), False
        length = self.headers.get("Content-Length")
        if length is None:
            raise Problem(411, "length_required", "send Content-Length")
        if int(length) > 65536:
            raise Problem(413, "too_large", "a body holds at most 64 KiB")
        raw = self.rfile.read(int(length))
        tenant = self.tenant()
        key = parse_key(self.headers.get_all("Idempotency-Key") or [])
        charge = parse_charge(raw)
        work_ms = self.headers.get("Work-Ms", "0")
        if not work_ms.isdigit() or int(work_ms) > MAX_WORK_MS:
            raise Problem(400, "invalid_parameter", f"Work-Ms: an integer in 0..{MAX_WORK_MS}")
        return self.ledger.charge(tenant, key, charge, int(work_ms) / 1000)

    def handle_method(self, method):
        try:
            status, body, replayed = self.route(method)
            self.send(status, body, headers=[("Idempotent-Replayed", "true")] if replayed else [])
        except Problem as p:
            self.send(p.status, p.body(), "application/problem+json")
        except (ValueError, sqlite3.Error) as e:
            self.send(500, Problem(500, "internal", str(e)).body(), "application/problem+json")

    def do_POST(self):
        self.handle_method("POST")

    def do_GET(self):
        self.handle_method("GET")


def serve(ledger_class=Ledger, doc=__doc__):
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])  # the calling script's own docstring
    ap.add_argument("--port", type=int, default=8700, help="0 picks a free port")
    ap.add_argument("--db", default="", help="SQLite file (default: a new one in a temporary directory)")
    ap.add_argument("--retention-s", type=float, default=86400, help="how long a key is kept")
    args = ap.parse_args()
    path = args.db or os.path.join(tempfile.mkdtemp(prefix="exercise-"), "charges.db")
    Handler.ledger = ledger_class(path, args.retention_s)
    ThreadingHTTPServer.request_queue_size = 128  # a storm opens its connections at once
    ThreadingHTTPServer.daemon_threads = True
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{srv.server_address[1]} (database {path})", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(serve())
