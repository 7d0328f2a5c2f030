#!/usr/bin/env python3
"""The harness's own logic that runs without any engine: how it reads tokentap's refusals
(`tokentap_faults_total` on its /metrics and the refusal log lines of src/proxy/refusals.rs) and
fails a run that met one. Only the standard library:

    python3 -m unittest conformance/test_harness.py

`tests/hardening_tests.rs` (`the_conformance_harness_reads_a_real_tokentaps_refusals`) runs the
same reading against a real tokentap's page and log lines.
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

PAGE = """# TYPE tokentap_faults_total counter
tokentap_faults_total{listener="proxy",fault="route_refused"} 3
tokentap_faults_total{listener="proxy",fault="code_field_refused"} 0
tokentap_faults_total{listener="admin",fault="route_refused"} 9
tokentap_faults_total{listener="proxy",fault="header_timeout"} 4
"""

LOG = "\n".join([
    "2026-12-01T10:00:00.000001Z  INFO tokentap::app::serve: listening",
    '2026-12-01T10:00:01.000001Z  WARN tokentap::proxy::refusals: refused on the data port (logged once per path): '
    'tokentap: `/flush_cache` is a control route of sglang kind="route_refused" path=/flush_cache',
    '{"timestamp":"2026-12-01T10:00:02Z","level":"WARN","fields":{"message":"refused on the data port (logged once per path): x",'
    '"kind":"session_refused","path":"/close_session"},"target":"tokentap::proxy::refusals"}',
    '2026-12-01T10:00:03.000001Z  WARN tokentap::proxy::refusals: refused on the data port: 5 more requests to paths '
    'past the first 256 logged (tokentap_faults_total counts them all) kind="route_refused" refused=5',
    "2026-12-01T10:00:04.000001Z  WARN tokentap::upstream: path=/not-a-refusal",
])


class FakeTap:
    """A tap whose /metrics pages and log the test writes."""

    def __init__(self, log_path):
        self.pages = [PAGE.replace("} 3", "} 0")]
        self.proc = type("Proc", (), {"log_path": log_path})()

    def metrics(self):
        return self.pages[0] if len(self.pages) == 1 else self.pages.pop(0)


class RefusalsTest(unittest.TestCase):
    def test_counts_are_the_proxy_listeners_refusal_faults(self):
        counts = harness.refusal_counts(PAGE)
        self.assertEqual(counts, {"route_refused": 3.0, "code_field_refused": 0.0, "session_refused": 0.0})
        self.assertEqual(harness.refusal_counts("")["route_refused"], 0.0)

    def test_paths_come_from_the_refusal_lines_only(self):
        self.assertEqual(
            harness.refused_paths(LOG),
            ["/flush_cache", "/close_session", "(more paths, see tokentap_faults_total)"],
        )

    def test_a_step_with_a_refusal_is_recorded_and_fails_the_engine(self):
        with tempfile.TemporaryDirectory() as tmp:
            log_path = os.path.join(tmp, "tokentap.log")
            with open(log_path, "w") as f:
                f.write("INFO listening\n")
            tap = FakeTap(log_path)
            watch = harness.RefusalWatch(tap)
            eng = {}
            # A step without refusals.
            self.assertIsNone(watch.check("cases", eng))
            harness.RefusalWatch.fail(eng)
            # A step whose client met a 403: the counter moved and a line names the path.
            with open(log_path, "a") as f:
                f.write(LOG.splitlines()[1] + "\n")
            tap.pages = [PAGE]
            refusal = watch.check("sglang.benchmark.serving (sglang)", eng)
            self.assertEqual(refusal["counts"], {"route_refused": 3})
            self.assertEqual(refusal["paths"], ["/flush_cache"])
            # The same path refused again later is not logged again: the whole log names it.
            tap.pages = [PAGE.replace("} 3", "} 5")]
            again = watch.check("vllm bench serve", eng)
            self.assertEqual(again["counts"], {"route_refused": 2})
            self.assertEqual(again["paths"], ["/flush_cache"])
            with self.assertRaises(RuntimeError) as failed:
                harness.RefusalWatch.fail(eng)
            said = str(failed.exception)
            self.assertIn("sglang.benchmark.serving (sglang): 3 route_refused (/flush_cache)", said)
            self.assertIn("vllm bench serve: 2 route_refused", said)


if __name__ == "__main__":
    unittest.main()
