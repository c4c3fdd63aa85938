"""The fence helpers take the fencing domain from the client that took the
lock (INFO's ``domain`` field), against a real ``ticketing dev`` and sqlite3:
marks land under the domain, never under the cluster id."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import tempfile
import unittest
import uuid

import ticketing
from ticketing import fence

from ._dev import DevCluster
from .test_fence import SQLITE_SCHEMA

cluster: "DevCluster | None" = None


def setUpModule() -> None:
    global cluster
    cluster = DevCluster()


def tearDownModule() -> None:
    if cluster is not None:
        cluster.stop()


class FenceDomainTest(unittest.TestCase):
    def setUp(self) -> None:
        assert cluster is not None
        self.client = ticketing.Client(cluster.socket)
        self.addCleanup(self.client.close)
        d = tempfile.mkdtemp(prefix="tk-fd-")
        self.addCleanup(shutil.rmtree, d, True)
        self.conn = sqlite3.connect(os.path.join(d, "f.db"), timeout=10, isolation_level=None)
        self.addCleanup(self.conn.close)
        with open(SQLITE_SCHEMA, encoding="utf-8") as f:
            self.conn.executescript(f.read())
        self.f = fence.Fence("qmark")
        self.key = f"fence-domain/{uuid.uuid4().hex[:8]}"

    def high_water(self, domain: str, key: str) -> int:
        return self.f.high_water(self.conn.cursor(), domain, key)

    def test_client_domain_is_infos(self) -> None:
        info = self.client.info()
        self.assertIsNotNone(info.domain)
        self.assertNotEqual(info.domain, info.cluster)
        self.assertEqual(self.client.domain(), info.domain)
        self.assertEqual(fence.domain_of(self.client), info.domain)

    def test_fenced_with_the_client(self) -> None:
        info = self.client.info()
        with self.client.lock(self.key, lease=30, wait=0) as token:
            with fence.fenced(self.conn, self.client, self.key, token):
                pass
            self.assertEqual(self.high_water(info.domain, self.key), token)
            self.assertEqual(self.high_water(info.cluster, self.key), 0)
            # A newer token under the domain: the lock's write is stale.
            with fence.fenced(self.conn, info.domain, self.key, token + 1):
                pass
            with self.assertRaises(fence.StaleTokenError):
                with fence.fenced(self.conn, self.client, self.key, token):
                    self.fail("the stale block ran")

    def test_fenced_block_with_the_client(self) -> None:
        info = self.client.info()
        keys = [self.key + "/a", self.key + "/b"]
        with self.client.lock_block(keys, lease=30, wait=0) as token:
            with fence.fenced_block(self.conn, self.client, keys, token):
                pass
            with self.f.block_transaction(self.conn, self.client, keys, token):
                pass
        for k in keys:
            self.assertEqual(self.high_water(info.domain, k), token)
            self.assertEqual(self.high_water(info.cluster, k), 0)

    def test_async_client_must_be_awaited(self) -> None:
        assert cluster is not None

        async def main() -> str:
            async with ticketing.AsyncClient(cluster.socket) as ac:
                with self.assertRaises(TypeError):
                    fence.domain_of(ac)
                return await ac.domain()

        self.assertEqual(asyncio.run(main()), self.client.domain())


class DomainOfTest(unittest.TestCase):
    def test_domain_of(self) -> None:
        self.assertEqual(fence.domain_of("d1"), "d1")
        self.assertRaises(ValueError, fence.domain_of, "")
        self.assertRaises(TypeError, fence.domain_of, 42)

        class NoDomainYet:
            def domain(self) -> str:
                raise ticketing.NoDomainError("domain=-")

        self.assertRaises(ticketing.NoDomainError, fence.domain_of, NoDomainYet())
