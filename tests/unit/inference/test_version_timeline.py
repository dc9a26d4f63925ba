"""The client's version timeline for servers that report no per-token versions: updates while
paused take effect at the next resume, updates while running at once, ``set_version`` at once."""

from __future__ import annotations

from areal_tasks.inference.client.versions import VersionTimeline


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_update_while_paused_takes_effect_at_the_next_resume() -> None:
    clock = Clock()
    timeline = VersionTimeline(0, clock)
    clock.now = 1.0
    timeline.updated(1, paused=True)
    assert timeline.at(1.5) == 0  # answered between pause and resume: generated before the pause
    clock.now = 2.0
    timeline.resuming()
    assert (timeline.at(1.99), timeline.at(2.0), timeline.at(9.0)) == (0, 1, 1)
    timeline.resuming()  # a resume without an update changes nothing
    assert timeline.at(9.0) == 1


def test_only_the_last_of_several_paused_updates_takes_effect() -> None:
    clock = Clock()
    timeline = VersionTimeline(5, clock)
    timeline.updated(6, paused=True)
    timeline.updated(7, paused=True)
    clock.now = 3.0
    timeline.resuming()
    assert (timeline.at(2.0), timeline.at(3.0)) == (5, 7)


def test_an_update_while_running_and_set_version_take_effect_at_once() -> None:
    clock = Clock()
    timeline = VersionTimeline(0, clock)
    clock.now = 1.0
    timeline.updated(2, paused=False)
    clock.now = 2.0
    timeline.updated(9, paused=True)
    timeline.reset(4)  # set by hand: overrides the pending update
    timeline.resuming()
    assert (timeline.at(0.5), timeline.at(1.0), timeline.at(2.0), timeline.at(5.0)) == (0, 2, 4, 4)


def test_a_coarse_clock_still_orders_changes_and_memory_stays_bounded() -> None:
    clock = Clock()
    timeline = VersionTimeline(0, clock)
    for version in range(1, 10_001):
        timeline.updated(version, paused=False)  # same clock reading every time
    assert timeline.at(clock.now + 1.0) == 10_000
    assert timeline.at(float("-inf")) <= timeline.at(0.0)
    assert len(timeline._times) <= 4096
