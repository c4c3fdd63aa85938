"""Every scenario of clients/conformance/scenarios.json, with the blocking
Client and with the AsyncClient, against one real ``ticketing dev`` (which
the scenarios with restart_sidecar restart: stop and start it again with the
same socket and cluster state)."""

import unittest

from . import conformance
from ._dev import DevCluster

cluster: "DevCluster | None" = None


def setUpModule() -> None:
    global cluster
    cluster = DevCluster()


def tearDownModule() -> None:
    if cluster is not None:
        cluster.stop()


def _make_test(adapter_cls, scenario, index):
    def test(self: unittest.TestCase) -> None:
        assert cluster is not None
        conformance.run_scenario(adapter_cls, cluster.socket, scenario, index, cluster.restart)

    test.__doc__ = f"[{adapter_cls.name}] {scenario['name']}: {scenario.get('description', '')}"
    return test


class SyncConformance(unittest.TestCase):
    """The shared suite with ticketing.Client."""


class AsyncConformance(unittest.TestCase):
    """The shared suite with ticketing.AsyncClient."""


for _i, _s in enumerate(conformance.load_scenarios()):
    setattr(SyncConformance, f"test_{_s['name']}", _make_test(conformance.SyncAdapter, _s, _i))
    setattr(AsyncConformance, f"test_{_s['name']}", _make_test(conformance.AsyncAdapter, _s, _i))
