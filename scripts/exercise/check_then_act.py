#!/usr/bin/env python3
"""The reference solution's broken twin: check, then act.

It looks the key up, finds nothing, and only then charges and records the
key, in two steps. Every retry that arrives between the look and the write
looks too, finds nothing too, and charges too. The pause between the two
steps (WINDOW_S) stands for the work a real server does there; it makes
concurrent retries always overlap, so the storm of lab check always breaks it.
See docs/exercise.md.

    python3 scripts/exercise/check_then_act.py --port 8701
"""

import sys
import time

from reference import Ledger, Problem, fingerprint, serve

WINDOW_S = 0.1


class LookFirstLedger(Ledger):
    def charge(self, tenant, key, charge, work_s):
        fp = fingerprint(charge)
        db = self.db()
        found = db.execute("SELECT status, body, fingerprint FROM idempotency_keys WHERE tenant = ? AND key = ?",
                           (tenant, key)).fetchone()  # 1. look
        if found:
            status, body, stored_fp = found
            if stored_fp != fp:
                raise Problem(422, "idempotency_key_reused", "this key was used with another request")
            return status, bytes(body), True
        time.sleep(WINDOW_S + work_s)  # ...everyone else looks meanwhile...
        db.execute("BEGIN IMMEDIATE")  # 2. act: charge and record, too late
        body = self.apply(db, tenant, key, charge)
        db.execute("INSERT OR REPLACE INTO idempotency_keys (tenant, key, fingerprint, status, body, created_at)"
                   " VALUES (?, ?, ?, 201, ?, ?)", (tenant, key, fp, body, time.time()))
        db.execute("COMMIT")
        return 201, body, False


if __name__ == "__main__":
    sys.exit(serve(LookFirstLedger, __doc__))
