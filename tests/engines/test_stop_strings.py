"""The stop-string matcher both engines run on each row's raw generated text."""

from __future__ import annotations

from kinfer.engines.stop_strings import StopStringMatcher, Utf8Decoder


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


def test_utf8_pieces_make_whole_characters_and_an_unfinished_last_one_is_dropped():
    star = "🌟".encode()  # four bytes, which SmolLM2 writes as three byte tokens
    decoder = Utf8Decoder()
    released = [decoder.feed(p) for p in (b"go ", star[:2], star[2:3], star[3:], star[:2])]
    assert released == ["go ", "", "", "🌟", ""]
    # the reply ends (max_tokens) with half a star held back: it is dropped, never shown as U+FFFD
    assert decoder.flush() == ""


def test_bytes_that_can_never_be_utf8_still_show_as_replacement_characters():
    decoder = Utf8Decoder()
    assert decoder.feed(b"a\xffb") == "a\ufffdb"
    assert decoder.feed(b"\xc3") == "" and decoder.feed(b"(") == "\ufffd("  # a broken sequence
    assert decoder.flush() == ""
