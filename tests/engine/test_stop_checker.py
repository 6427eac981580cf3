"""Stop checker tests: every rule, streamed visible text, and a brute-force reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.request import FinishReason
from core.sampling import SamplingParams
from engine.stop_checker import StopChecker, StopDecision

EOS = 2


def run(
    pieces: list[str],
    params: SamplingParams,
    token_ids: list[int] | None = None,
    max_model_len: int = 1000,
    num_prompt_tokens: int = 3,
) -> tuple[StopDecision, str, list[str], int]:
    """Feed one text piece per token; returns the final decision, the final visible text,
    the visible text after every step and the number of tokens consumed."""
    checker = StopChecker(params, [EOS], max_model_len, num_prompt_tokens)
    token_ids = token_ids or [100 + i for i in range(len(pieces))]
    text, visible = "", []
    decision = StopDecision(False)
    for n, piece in enumerate(pieces, start=1):
        text += piece
        decision = checker.check(token_ids[:n], text)
        visible.append(text[: checker.visible_len(text, decision.finished)])
        if decision.finished:
            return decision, visible[-1], visible, n
    return decision, visible[-1] if visible else "", visible, len(pieces)


def test_eos_stops_and_its_text_is_not_shown() -> None:
    decision, visible, _, n = run(["a", "b", "</s>", "c"], SamplingParams(), [5, 6, EOS, 7])
    assert decision == StopDecision(True, FinishReason.STOP, None)
    assert (visible, n) == ("ab", 3)


def test_ignore_eos() -> None:
    decision, visible, _, n = run(
        ["a", "</s>", "b"], SamplingParams(ignore_eos=True, max_tokens=3), [5, EOS, 6]
    )
    assert decision.finish_reason == FinishReason.LENGTH and (visible, n) == ("a</s>b", 3)


def test_stop_token_id_reports_the_id() -> None:
    params = SamplingParams(stop_token_ids=(42,))
    decision, visible, _, n = run(["a", "\n", "b"], params, [5, 42, 6])
    assert decision == StopDecision(True, FinishReason.STOP, 42)
    assert (visible, n) == ("a", 2)
    params = SamplingParams(stop_token_ids=(42,), include_stop_str_in_output=True)
    assert run(["a", "\n", "b"], params, [5, 42, 6])[1] == "a\n"


def test_max_tokens_and_max_model_len() -> None:
    decision, visible, _, n = run(list("abcdef"), SamplingParams(max_tokens=4))
    assert decision == StopDecision(True, FinishReason.LENGTH, None)
    assert (visible, n) == ("abcd", 4)
    decision, _, _, n = run(list("abcdef"), SamplingParams(), max_model_len=8, num_prompt_tokens=5)
    assert decision.finish_reason == FinishReason.LENGTH and n == 3
    decision, _, _, n = run(list("ab"), SamplingParams(), max_model_len=8, num_prompt_tokens=8)
    assert decision.finish_reason == FinishReason.LENGTH and n == 1


def test_stop_beats_length_on_the_same_token() -> None:
    decision, _, _, n = run(["a", "b"], SamplingParams(max_tokens=2), [5, EOS])
    assert decision.finish_reason == FinishReason.STOP and n == 2
    decision, visible, _, _ = run(["a", "bEND"], SamplingParams(max_tokens=2, stop=("END",)))
    assert decision.stop_reason == "END" and visible == "ab"


def test_stop_string_spanning_several_tokens() -> None:
    params = SamplingParams(stop=("lo Wo",))
    decision, visible, streamed, n = run(["Hel", "lo", " W", "orld", "!"], params)
    assert decision == StopDecision(True, FinishReason.STOP, "lo Wo")
    assert (visible, n) == ("Hel", 4)
    assert streamed == ["He", "Hel", "Hel", "Hel"]  # "l", "lo", "lo W" could start a stop


def test_stop_string_in_the_middle_of_a_token() -> None:
    decision, visible, _, _ = run(["ab", "cSTOPdef"], SamplingParams(stop=("STOP",)))
    assert decision.stop_reason == "STOP" and visible == "abc"
    params = SamplingParams(stop=("STOP",), include_stop_str_in_output=True)
    assert run(["ab", "cSTOPdef"], params)[1] == "abcSTOP"


def test_earliest_stop_string_wins() -> None:
    params = SamplingParams(stop=("STOP", "END", "ENDING"))
    decision, visible, _, _ = run(["x", "y END STOP ENDING"], params)
    assert decision.stop_reason == "END" and visible == "xy "
    # Two strings completed by the same token: the one starting first wins.
    decision, visible, _, _ = run(["ab", "cd"], SamplingParams(stop=("cd", "bc")))
    assert decision.stop_reason == "bc" and visible == "a"


def test_held_back_suffix_is_released_when_it_cannot_be_a_stop() -> None:
    params = SamplingParams(stop=("STOP",))
    _, _, streamed, _ = run(["Hello ", "ST", "X", "S"], params)
    assert streamed == ["Hello ", "Hello ", "Hello STX", "Hello STX"]


def test_finished_decision_is_sticky() -> None:
    checker = StopChecker(SamplingParams(), [EOS], 100, 1)
    assert checker.check([EOS], "").finished
    assert checker.check([EOS, 7], "more").finish_reason == FinishReason.STOP


def test_empty_step_is_not_finished() -> None:
    checker = StopChecker(SamplingParams(stop=("x",)), [EOS], 100, 1)
    assert not checker.check([], "").finished


def reference_cut(pieces: list[str], stops: tuple[str, ...]) -> tuple[str | None, str]:
    """Brute force: after each piece search the whole text; the first step where any stop
    string appears ends the request, cut at the earliest (then shortest) occurrence."""
    text = ""
    for piece in pieces:
        text += piece
        found = [(text.find(s), len(s), s) for s in stops if s in text]
        if found:
            start, _, stop = min(found)
            return stop, text[:start]
    return None, text


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="abc", max_size=4), min_size=1, max_size=12),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_streaming_never_shows_a_stop_string(pieces: list[str], stops: list[str]) -> None:
    params = SamplingParams(stop=tuple(stops), max_tokens=len(pieces))
    decision, visible, streamed, _ = run(pieces, params)
    stop, expected = reference_cut(pieces, tuple(stops))
    assert decision.finished and visible == expected
    assert decision.stop_reason == stop
    assert decision.finish_reason == (FinishReason.LENGTH if stop is None else FinishReason.STOP)
    for shown in streamed:
        assert visible.startswith(shown), "streamed text must never be taken back"
        assert not any(s in shown for s in stops)


def test_min_tokens_holds_off_stop_tokens_and_strings() -> None:
    params = SamplingParams(stop=["b"], stop_token_ids=(9,), min_tokens=4)
    decision, visible, _, n = run(["a", "b", "</s>", "c", "b"], params, [5, 6, EOS, 9, 6])
    assert decision == StopDecision(True, FinishReason.STOP, 9)  # the first stop at >= 4
    assert (visible, n) == ("ab</s>", 4)
    checker = StopChecker(params, [EOS], 1000, 3)
    assert checker.banned_token_ids(3) == {EOS, 9}  # (the 4th token may stop)
    assert checker.banned_token_ids(4) == frozenset()
