"""Silence: NO_REPLY and narration never reach the chat, in whole replies and in streams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.silence import NO_REPLY, SilencePolicy, SilenceStreamFilter, apply_silence, is_silent

SILENT_REPLIES = [
    "NO_REPLY",
    " no_reply \n",
    "**NO_REPLY**",
    "__NO_REPLY__",
    "_NO_REPLY_",
    "*NO_REPLY*",
    "`NO_REPLY`",
    "```\nNO_REPLY\n```",
    "```text\nNO_REPLY\n```",
    "~~~\nno_reply\n~~~",
    "NO_REPLY.",
    "NO_REPLY!",
    '"NO_REPLY"',
    "'NO_REPLY'",
    "“NO_REPLY”",
    "[NO_REPLY]",
    "(NO_REPLY)",
    "{NO_REPLY}",
    "<NO_REPLY>",
    "NO REPLY",
    "no-reply",
    "No_Reply",
    "NO__REPLY",
    "\u200bNO_REPLY\u200b",
    "\ufeffNO_REPLY\u2060",
    "\u00a0NO_REPLY\u00a0",
    "NO\u200b_REPLY",
    "> NO_REPLY",
    "- **`NO_REPLY`** -",
]


@pytest.mark.parametrize("text", SILENT_REPLIES)
def test_token_forms_are_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "I will answer NO_REPLY when unsure",
        "Silent Night is a carol",
        "Silent",
        "NO",
        "NO_REPLY please",
        "NOREPLY",
        "",
        "   ",
    ],
)
def test_prose_and_other_words_are_not_silent(text: str) -> None:
    assert not is_silent(text)


@pytest.mark.parametrize("value", [None, 0, b"NO_REPLY", ["NO_REPLY"]])
def test_non_strings_are_never_silent(value: object) -> None:
    assert not is_silent(value)  # type: ignore[arg-type]
    assert apply_silence(value) is value  # type: ignore[arg-type]


def test_no_reply_constant() -> None:
    assert NO_REPLY == "NO_REPLY"
    assert SilencePolicy().tokens == (NO_REPLY,)


@pytest.mark.parametrize("token", ["[silent]", "SILENT", "Silent."])
def test_configured_tokens_are_normalised_like_replies(token: str) -> None:
    policy = SilencePolicy(tokens=(token,))
    assert is_silent("[SILENT]", policy)
    assert is_silent("silent", policy)
    assert not is_silent("NO_REPLY", policy)
    assert not is_silent("Silent Night is a carol", policy)


def test_tokens_from_a_list_or_string_keep_the_policy_hashable() -> None:
    from_list = SilencePolicy(tokens=["NO_REPLY", "[SILENT]"])  # type: ignore[arg-type]
    assert from_list.tokens == ("NO_REPLY", "[SILENT]")
    assert hash(from_list) == hash(SilencePolicy(tokens=("NO_REPLY", "[SILENT]")))
    assert SilencePolicy(tokens="SKIP").tokens == ("SKIP",)  # type: ignore[arg-type]


def test_token_that_normalises_to_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="silence tokens"):
        SilencePolicy(tokens=("NO_REPLY", "**"))


@pytest.mark.parametrize(
    ("text", "sent"),
    [
        ("Here is the answer.\n\nNO_REPLY", "Here is the answer."),
        ("NO_REPLY\nHere is more.", "Here is more."),
        ("NO_REPLY\n\n  indented\nline\n\n", "  indented\nline\n\n"),
        ("Answer  \r\n**NO_REPLY**\r\n", "Answer  \r"),
        ("NO_REPLY\nmiddle\nNO_REPLY", "middle"),
        ("first\nNO_REPLY\nNO_REPLY\n", "first"),
        ("NO_REPLY\nNO_REPLY", None),
        ("NO_REPLY\n\n\n", None),
        ("NO_REPLY\n(silent)", None),
        ("(silent)\nNO_REPLY", None),
        ("```\nNO_REPLY\n```\nNO_REPLY", None),
        ("a\nNO_REPLY\nb", "a\nNO_REPLY\nb"),
        ("Say NO_REPLY\nto me", "Say NO_REPLY\nto me"),
        ("\n\nHello\n\n", "\n\nHello\n\n"),
    ],
)
def test_token_lines_at_either_end_are_stripped(text: str, sent: str | None) -> None:
    assert apply_silence(text) == sent


def test_token_lines_are_kept_without_strip_trailing() -> None:
    policy = SilencePolicy(strip_trailing=False)
    assert apply_silence("Here is the answer.\n\nNO_REPLY", policy) == (
        "Here is the answer.\n\nNO_REPLY"
    )
    assert apply_silence("NO_REPLY", policy) is None


NARRATION = [
    "*(silent)*",
    "(no reply)",
    "(silence)",
    "*stays silent*",
    "_remains quiet_",
    "[no response]",
    "(doesn’t respond)",
    "*Silent*",
    "🔇",
    " 🔇\ufe0f ",
    "🤐",
    ".",
    "...",
    "…",
    "**",
]


@pytest.mark.parametrize("text", NARRATION)
def test_narration_is_dropped(text: str) -> None:
    assert apply_silence(text) is None


@pytest.mark.parametrize("text", [t for t in NARRATION if t != "(no reply)"])
def test_narration_is_kept_without_drop_narration(text: str) -> None:
    assert apply_silence(text, SilencePolicy(drop_narration=False)) == text


@pytest.mark.parametrize(
    "text", ["Silent", "Silence.", "Nothing", "Quiet please", "(silent night)", "🔇 muted now"]
)
def test_unmarked_words_are_answers_not_narration(text: str) -> None:
    assert apply_silence(text) == text


@pytest.mark.parametrize("text", ["", "  ", "\n\n", "\u200b", "\u00a0\n"])
def test_empty_replies_are_never_sent(text: str) -> None:
    assert apply_silence(text) is None
    assert apply_silence(text, SilencePolicy(drop_narration=False, strip_trailing=False)) is None


def test_plain_prose_passes_untouched() -> None:
    text = "  Hello **world**.\n\n```py\nprint('NO_REPLY')\n```\n"
    assert apply_silence(text) is text


# --- streaming ---------------------------------------------------------------------------


def _stream(text: str, cuts: list[int], policy: SilencePolicy | None = None) -> str | None:
    """Feed `text` cut at `cuts`; the concatenated output, or None when finish() said so."""
    stream = SilenceStreamFilter(policy)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(text)), len(text)]
    sent = "".join(stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    rest = stream.finish()
    if rest is None:
        assert sent == ""
        return None
    return sent + rest


def test_stream_holds_back_token_prefixes() -> None:
    stream = SilenceStreamFilter()
    assert [stream.feed(c) for c in ["N", "O", "_", "REP", "LY"]] == ["", "", "", "", ""]
    assert stream.finish() is None


@pytest.mark.parametrize("prefix", ["n", "No", "no_", "**NO", "`no re", "```py", "[NO-R"])
def test_stream_holds_back_case_insensitive_prefixes(prefix: str) -> None:
    assert SilenceStreamFilter().feed(prefix) == ""


def test_stream_releases_prose_as_soon_as_it_is_decided() -> None:
    stream = SilenceStreamFilter()
    assert stream.feed("N") == ""
    assert stream.feed("ow ") == "Now"
    assert stream.feed("then.") == " then."
    assert stream.finish() == ""


def test_stream_holds_a_possible_last_line_token() -> None:
    stream = SilenceStreamFilter()
    assert stream.feed("Here is the answer.\n\nNO_RE") == "Here is the answer."
    assert stream.feed("PLY") == ""
    assert stream.finish() == ""


def test_stream_releases_a_middle_token_line() -> None:
    stream = SilenceStreamFilter()
    assert stream.feed("a\nNO_REPLY\n") == "a"
    assert stream.feed("b") == "\nNO_REPLY\nb"
    assert stream.finish() == ""


def test_stream_strips_a_first_line_token() -> None:
    stream = SilenceStreamFilter()
    assert stream.feed("NO_REPLY\n") == ""
    assert stream.feed("Here is more.") == "Here is more."
    assert stream.finish() == ""


@pytest.mark.parametrize(
    "text",
    [
        "NO_REPLY",
        "Hello world",
        "Here is the answer.\n\nNO_REPLY",
        "NO_REPLY\nHere is more.",
        "(silent)\nNO_REPLY",
        "```text\nNO_REPLY\n```",
        "```py\nprint(1)\n```",
        "Now\n\n",
        "a\nNO_REPLY\nb",
        "*stays silent*",
        ".",
    ],
)
def test_stream_char_by_char_equals_apply_silence(text: str) -> None:
    assert _stream(text, list(range(len(text)))) == apply_silence(text)


PIECES = st.sampled_from(
    [
        "NO_REPLY",
        "no reply",
        "**NO_REPLY**",
        "`NO_REPLY`",
        "[no-reply]",
        "NO",
        "Now",
        "N",
        "Hello",
        "world",
        "the answer is 42",
        "(silent)",
        "*stays silent*",
        "🔇",
        ".",
        "```",
        "```py",
        " ",
        "\n",
        "\n\n",
        "\u200b",
    ]
)
replies = st.lists(PIECES, max_size=10).map("".join)
token_or_prose = st.lists(
    st.sampled_from(["NO_REPLY", "Hello there.", "It is 42", "Now"]), min_size=1, max_size=4
).map("\n".join)
cut_lists = st.lists(st.integers(min_value=0, max_value=120), max_size=12)
silence_policies = st.builds(
    SilencePolicy,
    tokens=st.sampled_from([("NO_REPLY",), ("NO_REPLY", "[SILENT]")]),
    strip_trailing=st.booleans(),
    drop_narration=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(replies, silence_policies)
def test_apply_silence_never_sends_a_silent_reply(text: str, policy: SilencePolicy) -> None:
    sent = apply_silence(text, policy)
    assert sent is None or not is_silent(sent, policy)
    if is_silent(text, policy):
        assert sent is None


@settings(max_examples=300, deadline=None)
@given(token_or_prose, cut_lists)
def test_stream_equals_apply_silence_for_tokens_and_prose(text: str, cuts: list[int]) -> None:
    assert _stream(text, cuts) == apply_silence(text)


@settings(max_examples=500, deadline=None)
@given(replies, cut_lists, silence_policies)
def test_stream_equals_apply_silence_for_any_mix(
    text: str, cuts: list[int], policy: SilencePolicy
) -> None:
    assert _stream(text, cuts, policy) == apply_silence(text, policy)
