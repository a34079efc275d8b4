#!/usr/bin/env python3
"""The PostgreSQL lease in the server alone: today's lease (status and
lease_expires change, so every update writes a new row version and index
entries) against a lease that changes no indexed column (a heap-only
update, with room left on each page by fillfactor 70), and the raw
`DELETE … FOR UPDATE SKIP LOCKED` baseline, in turn, three rounds, medians.

    python3 benches/pg_hot_lease/run.py            # 200,000 rows a drain
    ROWS=60000 PGURL=postgres://postgres@127.0.0.1:5432 python3 benches/pg_hot_lease/run.py

Needs psql and pgbench. Creates the database `messaging_hot_lease` and drops
it at the end. Each drain: the table filled with ROWS pending rows of 120
bytes, `VACUUM ANALYZE`, then two clients leasing 300 at a time from their
half of the rows (as the framework's two concurrent leases do), each lease
committed before its rows are deleted by tuple id; "ahead" variants take
the next lease before deleting the previous one's rows, as a worker that
receives ahead does. The baseline deletes 100 at a time with 8 clients.
"""
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
MIGRATIONS = HERE.parent.parent / "messaging" / "migrations" / "postgres"
ROWS = int(os.environ.get("ROWS", "200000"))
BASE = os.environ.get("PGURL", "postgres://postgres@127.0.0.1:5432").rstrip("/")
DB = "messaging_hot_lease"

# name: (table, script, clients, transactions per client)
VARIANTS = {
    "today's lease": ("messaging_messages", "CALL drain_now('messaging_messages', :client_id, 2, 300);", 2, ROWS // 600 + 5),
    "today's lease, fillfactor 70": ("hot70", "CALL drain_now('hot70', :client_id, 2, 300);", 2, ROWS // 600 + 5),
    "heap-only lease, fillfactor 70": ("hot70", "CALL drain_hot('hot70', :client_id, 2, 300);", 2, ROWS // 600 + 5),
    "heap-only lease, fillfactor 100": ("hot100", "CALL drain_hot('hot100', :client_id, 2, 300);", 2, ROWS // 600 + 5),
    "today's lease, ahead": ("messaging_messages", "CALL drain_ahead('now', 'messaging_messages', :client_id, 2, 300);", 2, 1),
    "heap-only lease, fillfactor 70, ahead": ("hot70", "CALL drain_ahead('hot', 'hot70', :client_id, 2, 300);", 2, 1),
    "baseline DELETE 100, 8 clients": ("raw", "CALL drain_raw(100);", 8, ROWS // 800 + 3),
}


def psql(db, *commands):
    args = ["psql", f"{BASE}/{db}", "-q", "-At", "-v", "ON_ERROR_STOP=1"]
    for c in commands:
        args += ["-c", c]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def drain(table, script, clients, transactions):
    psql(DB, f"TRUNCATE {table}", f"CALL fill('{table}', {ROWS})", f"VACUUM ANALYZE {table}")
    with tempfile.NamedTemporaryFile("w", suffix=".pgb") as f:
        f.write(script + "\n")
        f.flush()
        start = time.monotonic()
        subprocess.run(["pgbench", "-n", "-c", str(clients), "-j", str(clients), "-t", str(transactions), "-f", f.name,
                        f"{BASE}/{DB}"], check=True, capture_output=True)
        took = time.monotonic() - start
    left = int(psql(DB, f"SELECT count(*) FROM {table}"))
    if left:
        sys.exit(f"{table}: {left} rows left after the drain")
    return ROWS / took


def main():
    psql("postgres", f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
    try:
        for migration in sorted(MIGRATIONS.glob("*.sql")):
            subprocess.run(["psql", f"{BASE}/{DB}", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(migration)], check=True,
                           capture_output=True)
        subprocess.run(["psql", f"{BASE}/{DB}", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(HERE / "hot_lease.sql")],
                       check=True, capture_output=True)
        rates = {name: [] for name in VARIANTS}
        for round_ in range(3):
            for name, variant in VARIANTS.items():
                rates[name].append(drain(*variant))
            print(f"round {round_ + 1}: " + ", ".join(f"{r[-1]:,.0f}" for r in rates.values()), flush=True)
        base = statistics.median(rates["today's lease"])
        print(f"\n{ROWS:,} rows a drain, medians of three:")
        for name, r in rates.items():
            print(f"  {name:40} {statistics.median(r):>9,.0f} rows/s  {statistics.median(r) / base:.2f} x today's lease")
    finally:
        psql("postgres", f"DROP DATABASE IF EXISTS {DB}")


if __name__ == "__main__":
    main()
