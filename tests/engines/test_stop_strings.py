"""The stop-string matcher both engines run on each row's raw generated text."""

from __future__ import annotations

from kinfer.engines.stop_strings import StopStringMatcher


def feed_all(matcher: StopStringMatcher, pieces: tuple[str, ...]) -> tuple[str, str | None]:
    released, matched = [], None
    for piece in pieces:
        scan = matcher.feed(piece)
        released.append(scan.text)
        if scan.stopped:
            matched = scan.matched
            break
    return "".join(released), matched


def test_a_stop_split_across_pieces_is_found_and_named():
    matcher = StopStringMatcher(("STOP", "END"))
    assert feed_all(matcher, ("one S", "T", "OP two", " three")) == ("one ", "STOP")


def test_text_that_could_start_a_stop_is_held_back_and_released_when_it_does_not():
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("one ST").text == "one "
    assert matcher.feed("AR").text == "STAR"
    assert matcher.feed("ST").text == ""
    assert matcher.flush() == "ST"  # the reply ended another way: the held tail goes out


def test_the_stop_that_starts_first_wins_and_the_longest_on_a_tie():
    assert StopStringMatcher(("two", "one")).feed("zero one two").matched == "one"
    assert StopStringMatcher(("on", "one")).feed("zero one").matched == "one"


def test_no_stops_release_everything_at_once():
    scan = StopStringMatcher(("",)).feed("anything")
    assert (scan.text, scan.matched) == ("anything", None)
