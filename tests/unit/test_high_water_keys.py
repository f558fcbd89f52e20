"""The high-water mark of fencing tokens: one key per Redis Cluster slot, in that slot."""

from __future__ import annotations

import redis.crc

from celery_redlock._redis.keys import CLUSTER_SLOTS, high_water_of, key_slot, keys_for, slot_tag


def test_every_cluster_slot_has_a_tag_that_hashes_to_it() -> None:
    tags = [slot_tag(slot) for slot in range(CLUSTER_SLOTS)]
    assert len(set(tags)) == CLUSTER_SLOTS
    for slot, tag in enumerate(tags):
        assert set(tag) <= {"0", "1"} and len(tag) == 14
        assert redis.crc.key_slot(f"redlock:fence:{{{tag}}}".encode()) == slot


def test_the_mark_of_a_lock_lives_in_the_lock_s_slot_whatever_its_name() -> None:
    names = ["a", "job", "sync_account:" + "f" * 32, "ü-ñ", "a:b:c", *map(str, range(500))]
    for name in names:
        keys = keys_for("redlock", name, limit=3)
        slot = redis.crc.key_slot(keys.lock.encode())
        assert key_slot(keys.lock) == slot
        assert redis.crc.key_slot(keys.high_water.encode()) == slot
        assert keys.high_water.startswith("redlock:fence:{")


def test_names_of_one_slot_share_one_mark_so_marks_are_bounded_by_the_slots() -> None:
    marks = {high_water_of(keys_for("p", str(i)).lock) for i in range(50_000)}
    assert len(marks) <= CLUSTER_SLOTS
    assert high_water_of(keys_for("other:prefix", "x").lock).startswith("other:prefix:fence:{")
