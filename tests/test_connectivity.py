"""When a worker may rescue other workers' tasks (pure: the worker's own view of its database;
the rescue statement still judges the holder gone by the server's clock)."""

from __future__ import annotations

import time

from konduit.worker.connectivity import Connectivity


def test_a_worker_that_never_lost_the_database_rescues_after_a_heartbeat_not_a_lease():
    c = Connectivity(lease_seconds=60.0, settle_seconds=0.05)
    assert not c.may_rescue  # not connected yet
    c.connected()
    assert not c.may_rescue
    time.sleep(0.06)
    assert c.may_rescue  # a fresh worker: it saw no outage, no lease to live first


def test_a_worker_that_lost_the_database_waits_a_full_lease_of_being_connected_again():
    c = Connectivity(lease_seconds=0.3, settle_seconds=0.0)
    c.connected()
    assert c.may_rescue
    c.disconnected()  # an outage: live workers' heartbeats may not have landed either
    c.connected()
    time.sleep(0.05)
    assert not c.may_rescue
    time.sleep(0.3)
    assert c.may_rescue
