"""Summarises an Autobahn fuzzingclient report and compares it with the expected results.

Usage: summarize.py INDEX_JSON EXPECTED_JSON [--update]

Prints the number of cases per behavior (OK, NON-STRICT, INFORMATIONAL, UNIMPLEMENTED,
FAILED), lists every FAILED case, and compares each case's `behavior` and `behaviorClose`
with autobahn/expected.json. Exits 1 when a case FAILED, a case is missing, or a case is
worse than expected; a case better than expected is reported (update expected.json with
--update) but does not fail. Runs on Python 2.7 and 3.
"""
from __future__ import print_function

import json
import sys

ORDER = ["OK", "NON-STRICT", "INFORMATIONAL", "UNIMPLEMENTED", "FAILED"]
# Higher is worse. INFORMATIONAL cases are neither passed nor failed by the suite (the spec
# leaves the outcome open), so they rank with OK.
RANK = {"OK": 0, "INFORMATIONAL": 0, "NON-STRICT": 1, "UNIMPLEMENTED": 2, "FAILED": 3}


def case_key(case_id):
    return [int(p) if p.isdigit() else p for p in case_id.split(".")]


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    index_path, expected_path = argv[1], argv[2]
    update = "--update" in argv[3:]
    with open(index_path) as f:
        index = json.load(f)
    if len(index) != 1:
        print("autobahn: expected one agent in the report, found %d" % len(index))
        return 1
    agent, cases = list(index.items())[0]
    counts = dict((b, 0) for b in ORDER)
    close_counts = dict((b, 0) for b in ORDER)
    failed = []
    for cid in sorted(cases, key=case_key):
        r = cases[cid]
        counts[r["behavior"]] = counts.get(r["behavior"], 0) + 1
        close_counts[r["behaviorClose"]] = close_counts.get(r["behaviorClose"], 0) + 1
        # Close behaviors other than OK/NON-STRICT/INFORMATIONAL ("WRONG CODE", "UNCLEAN",
        # ...) fail the case too.
        if RANK.get(r["behavior"], 3) >= 3 or RANK.get(r["behaviorClose"], 3) >= 3:
            failed.append(cid)

    print("autobahn: agent %s, %d cases" % (agent, len(cases)))
    print("  %-14s %8s %14s" % ("behavior", "cases", "close behavior"))
    for b in ORDER + sorted((set(counts) | set(close_counts)) - set(ORDER)):
        print("  %-14s %8d %14d" % (b, counts.get(b, 0), close_counts.get(b, 0)))
    for cid in sorted(cases, key=case_key):
        r = cases[cid]
        if r["behavior"] != "OK" or r["behaviorClose"] != "OK":
            print("  %-8s %-13s close %-13s (%s)" % (
                cid, r["behavior"], r["behaviorClose"], r.get("reportfile", "")))
    if failed:
        print("autobahn: FAILED cases: %s" % " ".join(failed))

    actual = dict(
        (cid, {"behavior": r["behavior"], "behaviorClose": r["behaviorClose"]})
        for cid, r in cases.items()
    )
    if update:
        with open(expected_path, "w") as f:
            f.write("{\n")
            ids = sorted(actual, key=case_key)
            for i, cid in enumerate(ids):
                a = actual[cid]
                f.write('  "%s": {"behavior": "%s", "behaviorClose": "%s"}%s\n' % (
                    cid, a["behavior"], a["behaviorClose"], "," if i + 1 < len(ids) else ""))
            f.write("}\n")
        print("autobahn: wrote %s (%d cases)" % (expected_path, len(actual)))

    with open(expected_path) as f:
        expected = json.load(f)
    worse, better = [], []
    missing = sorted(set(expected) - set(actual), key=case_key)
    extra = sorted(set(actual) - set(expected), key=case_key)
    for cid in sorted(set(expected) & set(actual), key=case_key):
        for field in ("behavior", "behaviorClose"):
            e, a = expected[cid][field], actual[cid][field]
            if RANK.get(a, 3) > RANK.get(e, 3):
                worse.append("%s %s: expected %s, got %s" % (cid, field, e, a))
            elif a != e:
                better.append("%s %s: expected %s, got %s" % (cid, field, e, a))
    for line in better:
        print("autobahn: better than expected (update autobahn/expected.json): " + line)
    for cid in extra:
        print("autobahn: case not in expected.json: %s (%s)" % (cid, actual[cid]["behavior"]))
    if missing:
        shown = " ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
        print("autobahn: REGRESSION: %d expected cases did not run: %s" % (len(missing), shown))
    for line in worse:
        print("autobahn: REGRESSION: " + line)
    bad = failed or worse or missing
    print("autobahn: %s (%d OK, %d NON-STRICT, %d INFORMATIONAL, %d UNIMPLEMENTED, %d FAILED)" % (
        "FAIL" if bad else "PASS", counts.get("OK", 0), counts.get("NON-STRICT", 0),
        counts.get("INFORMATIONAL", 0), counts.get("UNIMPLEMENTED", 0),
        counts.get("FAILED", 0)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
