"""Silence: NO_REPLY and narration never reach the chat, in whole replies and in streams."""

from __future__ import annotations

import json
import unicodedata

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
    assert stream.feed("ow ") == ""  # "Now → NO_REPLY" would be narration
    assert stream.feed("then.") == "Now then."
    assert stream.feed(" Here.\n") == " Here."
    assert stream.finish() == "\n"


def test_stream_holds_a_possible_last_line_token() -> None:
    stream = SilenceStreamFilter()
    assert stream.feed("Here is the answer.\n\nNO_RE") == "Here is the answer."
    assert stream.feed("PLY") == ""
    assert stream.finish() == ""


def test_stream_releases_a_middle_token_line() -> None:
    stream = SilenceStreamFilter()
    assert stream.feed("a\nNO_REPLY\n") == "a"
    assert stream.feed("b") == ""  # "b → NO_REPLY" would be narration
    assert stream.feed(". c") == "\nNO_REPLY\nb. c"
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
        "NO_REPLY NO_REPLY",
        "ＮＯ＿ＲＥＰＬＹ",
        "NО_REPLY",
        "\u200f",
        "😄",
        '{"action": "NO_REPLY"}',
        "{",
        "}",
        "<think>",
        "</think>",
        "<reasoning>plan</reasoning>",
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


# --- issue 9: look-alikes, repeats, emoji, Hermes' envelope, reasoning ---------------------

# Every character that renders as nothing: the format characters (Cf) used to hide text,
# CGJ and variation selectors.
INVISIBLE = [
    "\u200b",  # zero-width space
    "\u200c",  # zero-width non-joiner
    "\u200d",  # zero-width joiner
    "\u200e",  # left-to-right mark
    "\u200f",  # right-to-left mark
    "\u2060",  # word joiner
    "\u2061",  # function application
    "\u2062",  # invisible times
    "\u2063",  # invisible separator
    "\u2064",  # invisible plus
    "\ufeff",  # byte order mark
    "\u00ad",  # soft hyphen
    "\u061c",  # Arabic letter mark
    "\u180e",  # Mongolian vowel separator
    "\u202a",  # left-to-right embedding
    "\u202b",  # right-to-left embedding
    "\u202c",  # pop directional formatting
    "\u202d",  # left-to-right override
    "\u202e",  # right-to-left override
    "\u2066",  # left-to-right isolate
    "\u2067",  # right-to-left isolate
    "\u2068",  # first strong isolate
    "\u2069",  # pop directional isolate
    "\u206b",  # activate symmetric swapping
    "\U000e0001",  # language tag
    "\U000e0041",  # tag latin capital A
    "\u034f",  # combining grapheme joiner
    "\ufe00",  # variation selector-1
    "\ufe0f",  # variation selector-16
    "\U000e0100",  # variation selector-17
]
LOOKALIKE_VARIANTS = [
    *(f"NO_{mark}REPLY" for mark in INVISIBLE),
    "\u2067NO_REPLY\u2069",
    "\u202bNO_REPLY\u202c",
    "\u200fNO_REPLY",
    "NO_REPLY\u200e",
    "ＮＯ＿ＲＥＰＬＹ",  # full-width
    "ｎｏ＿ｒｅｐｌｙ",
    "ＮＯ_ＲＥＰＬＹ",
    "𝐍𝐎_𝐑𝐄𝐏𝐋𝐘",  # mathematical bold
    "ⓃⓄ_ⓇⒺⓅⓁⓎ",  # circled
    "NO\u3000REPLY",  # ideographic space
    "NO\u00a0REPLY",
    "NO\u202fREPLY",
    "NО_REPLY",  # Cyrillic О
    "NO_RЕPLY",  # Cyrillic Е
    "NO_REРLY",  # Cyrillic Р
    "NO_REPLУ",  # Cyrillic У
    "NO_REPLҮ",  # Cyrillic Ү
    "nо_rеply",  # Cyrillic о, е
    "ΝO_REPLY",  # Greek Ν
    "NΟ_REPLY",  # Greek Ο
    "NO_RΕPLY",  # Greek Ε
    "NO_REΡLY",  # Greek Ρ
    "NO_REPLΥ",  # Greek Υ
    "ΝΟ_RΕΡLΥ",
    *(f"NO{dash}REPLY" for dash in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"),
    "\u200f**ＮＯ＿ＲЕＰＬＹ**\u200e",
    "`NО\u200b_REPLY`",
    "[NO\u2011REPLY]",
]


def test_issue9_the_variant_table_is_large() -> None:
    assert len(LOOKALIKE_VARIANTS) >= 47
    assert len(set(LOOKALIKE_VARIANTS)) == len(LOOKALIKE_VARIANTS)


@pytest.mark.parametrize("text", LOOKALIKE_VARIANTS)
def test_issue9_invisible_and_lookalike_variants_are_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None
    assert _stream(text, list(range(len(text)))) is None
    assert apply_silence(f"Here is the answer.\n\n{text}") == "Here is the answer."


@pytest.mark.parametrize(
    "text",
    [
        "Reply with NО_REPLY when unsure",
        "ＮＯ＿ＲＥＰＬＹ means stay quiet",
        "The token is NO\u200b_REPLY.",
        "\u202eNO_REPLY is a token\u202c",
        "НЕТ ОТВЕТА",
        "Νο reply today?",
        "NO_REPLY\u2014I mean, here is the answer",
        "𝐍𝐎_𝐑𝐄𝐏𝐋𝐘 2",
    ],
)
def test_issue9_prose_with_lookalikes_is_sent_as_written(text: str) -> None:
    assert not is_silent(text)
    assert apply_silence(text) == text
    assert _stream(text, list(range(len(text)))) == text


@pytest.mark.parametrize(
    "text",
    [
        "NO_REPLY NO_REPLY",
        "NO_REPLY NO_REPLY NO_REPLY",
        "NO_REPLY, NO_REPLY.",
        "no_reply no-reply",
        "**NO_REPLY** **NO_REPLY**",
        "NO_REPLYNO_REPLY",
        "NO_REPLY\tNO_REPLY",
        "NO_REPLY ＮＯ＿ＲＥＰＬＹ",
    ],
)
def test_issue9_the_token_repeated_on_one_line_is_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None
    assert apply_silence(f"Done.\n{text}") == "Done."


@pytest.mark.parametrize(
    "text",
    [
        "😄 NO_REPLY",
        "NO_REPLY 🙏",
        "👍👍 NO_REPLY!!",
        "— NO_REPLY —",
        "NO_REPLY 🇺🇸",
        "NO_REPLY ❤️",
        "🧑\u200d💻 NO_REPLY",
        "NO_REPLY 👍🏽",
        "NO_REPLY \U0001fae8",  # newer than this Unicode database: unassigned here
        "NO_REPLY ✨✨",
        "(NO_REPLY) 😶",
        "NO_REPLY :)",
        "~ NO_REPLY ~",
        "😄 NO_REPLY 😄 NO_REPLY",
    ],
)
def test_issue9_a_token_with_only_emoji_or_punctuation_is_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None
    assert apply_silence(text, SilencePolicy(drop_narration=False)) is None
    assert _stream(text, list(range(len(text)))) is None


@pytest.mark.parametrize(
    "text",
    ["NO_REPLY 2", "NO_REPLY です", "😄 NO_REPLY means quiet", "Ok 👍 NO_REPLY", "NO_REPLY x"],
)
def test_issue9_a_token_next_to_a_word_or_number_is_sent(text: str) -> None:
    assert not is_silent(text)
    assert apply_silence(text) == text
    assert _stream(text, list(range(len(text)))) == text


@pytest.mark.parametrize(
    "text",
    [
        '{"action": "NO_REPLY"}',
        '{"action":"NO_REPLY"}',
        ' {\n  "action" : "NO_REPLY"\n}\n',
        '{ "action": "no_reply" }',
        '\u00a0{"action":\t"NO_REPLY"}',
    ],
)
def test_issue9_hermes_envelope_is_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None
    assert _stream(text, list(range(len(text)))) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"action": "NO_REPLY", "reason": "nothing to add"}',
        '{"action": "reply", "text": "hi"}',
        '{"action": "reply"}',
        '[{"action": "NO_REPLY"}]',
        '{"action": ["NO_REPLY"]}',
        '{"action": "NO_REPLY"} ok',
        '{"Action": "NO_REPLY"}',
        '{"action": "NO\\u005fREPLY"}',
        '{"action": "' + "NO_REPLY " * 40 + '"}',
        '{"action": 1' + "1" * 5000 + "}",
        '{"action": ' * 2000,
    ],
)
def test_issue9_other_json_is_sent(text: str) -> None:
    assert not is_silent(text)
    assert apply_silence(text) == text
    assert _stream(text, [7, 9, 30, 200]) == text


def test_issue9_envelope_value_is_a_configured_token() -> None:
    policy = SilencePolicy(tokens=("[SILENT]",))
    assert apply_silence('{"action": "SILENT"}', policy) is None
    assert apply_silence('{"action": "NO_REPLY"}', policy) == '{"action": "NO_REPLY"}'


def test_issue9_an_envelope_line_after_prose_is_stripped() -> None:
    assert apply_silence('Answer.\n{"action": "NO_REPLY"}') == "Answer."
    assert _stream('Answer.\n{"action": "NO_REPLY"}', [9, 12, 20]) == "Answer."


@pytest.mark.parametrize(
    "text",
    [
        "<think>nothing to add</think>",
        "<thinking>\nThey were talking to each other.\n</thinking>\n",
        "<reasoning>a</reasoning>",
        "<THINK>x</THINK>",
        "  <think>cut short, never closed",
        "<think>x</think>NO_REPLY",
        "<think>x</think>\n\n**NO_REPLY**",
        "<think>a</think><reasoning>b</reasoning> 😄 NO_REPLY",
    ],
)
def test_issue9_reasoning_alone_or_with_the_token_is_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None
    assert _stream(text, list(range(len(text)))) is None


@pytest.mark.parametrize(
    ("text", "sent"),
    [
        ("<think>plan</think>\n\nHello", "Hello"),
        ("Hello <think>x</think> world", "Hello world"),
        ("Answer.\n<reasoning>r</reasoning>\nMore.", "Answer.\nMore."),
        ("<thinking>a</thinking>Here.\n<think>b</think>", "Here.\n"),
        ("Hi.\n<think>cut short, never closed", "Hi.\n"),
        ("NO_REPLY\n<think>cut short", None),
        ("Use <b>bold</b>", "Use <b>bold</b>"),
    ],
)
def test_issue9_reasoning_is_removed_before_sending(text: str, sent: str | None) -> None:
    assert apply_silence(text) == sent
    assert apply_silence(text, SilencePolicy(strip_trailing=False, drop_narration=False)) == sent
    assert _stream(text, list(range(len(text)))) == sent


def test_issue9_a_token_line_after_reasoning_is_stripped() -> None:
    text = "Answer.\n<reasoning>r</reasoning>\nNO_REPLY"
    assert apply_silence(text) == "Answer."
    assert _stream(text, list(range(len(text)))) == "Answer."


def test_issue9_a_stream_of_reasoning_and_the_token_emits_nothing() -> None:
    stream = SilenceStreamFilter()
    chunks = ["<thi", "nk>The bots are", " talking to each other", "</think>", "\n", "NO_", "REPLY"]
    assert [stream.feed(chunk) for chunk in chunks] == [""] * len(chunks)
    assert stream.finish() is None


def test_issue9_a_stream_never_emits_reasoning() -> None:
    stream = SilenceStreamFilter()
    chunks = [
        "Hello ",
        "<thi",
        "nk>secret",
        " plan</thi",
        "nk>\n",
        "world.",
        " <reasoning>mo",
        "re",
    ]
    sent = [stream.feed(chunk) for chunk in chunks]
    rest = stream.finish()
    assert rest is not None
    assert "".join(sent) + rest == "Hello world. "
    assert not any(word in piece for piece in [*sent, rest] for word in ("secret", "plan", "mo"))


def test_issue9_hostile_replies_are_decided_quickly_and_sanely() -> None:
    assert apply_silence("(" * 100_000 + "NO_REPLY" + ")" * 100_000) is None
    assert apply_silence("😄" * 100_000 + "NO_REPLY") is None
    assert apply_silence("<think>" * 50_000) is None
    assert apply_silence("x " + "<think>" * 50_000) == "x "
    assert apply_silence("x " + "<think></think>" * 50_000) == "x "
    assert apply_silence("\ud800 hi") == "\ud800 hi"
    stream = SilenceStreamFilter()
    assert stream.feed("<think>") == ""
    for _ in range(20_000):
        assert stream.feed("plan ") == ""
    assert stream.finish() is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(INVISIBLE), max_size=3).map("".join), min_size=9, max_size=9)
)
def test_issue9_format_characters_anywhere_in_the_token_are_silent(gaps: list[str]) -> None:
    text = "".join(gap + char for gap, char in zip(gaps, [*NO_REPLY, ""], strict=True))
    assert is_silent(text)
    assert apply_silence(text) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([NO_REPLY, " ", *INVISIBLE]), min_size=1, max_size=8))
def test_issue9_only_format_characters_and_tokens_are_silent(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert apply_silence(text) is None
    if NO_REPLY in pieces:
        assert is_silent(text)


SECRET = "SECRET"
reasoning_blocks = st.builds(
    lambda tag, body: f"<{tag}>{body}{SECRET}{body}</{tag}>",
    st.sampled_from(["think", "thinking", "reasoning", "THINK"]),
    st.text(st.characters(blacklist_characters="<"), max_size=8),
)
with_reasoning = st.builds(
    lambda opening, pieces: opening + "".join(pieces),
    st.sampled_from(["", f"<think>{SECRET}", f"  <reasoning>{SECRET} cut"]),
    st.lists(PIECES | reasoning_blocks, max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(with_reasoning, cut_lists, silence_policies)
def test_issue9_reasoning_never_survives(text: str, cuts: list[int], policy: SilencePolicy) -> None:
    sent = apply_silence(text, policy)
    assert SECRET not in (sent or "")
    streamed = _stream(text, cuts, policy)
    assert streamed == sent


# --- issue 20: the token beside other words, invisible look-alikes ----------------------

OPENCLAW_RUN = (
    '{"runId": "9f1c", "status": "ok", "summary": "completed", "result": {"payloads": '
    '[{"text": "NO_REPLY", "mediaUrl": null}], "meta": {"durationMs": 2210, "agentMeta": '
    '{"sessionId": "s-1", "provider": "anthropic", "usage": {"input": 6, "output": 11}}, '
    '"systemPromptReport": {"workspaceFiles": ["AGENTS.md", "SOUL.md"]}}}}'
)
TRAILING_TOKEN = [
    ("Sure, here it is. NO_REPLY", "Sure, here it is."),
    ("Done! 😄 NO_REPLY", "Done!"),
    ("File's there. Not urgent.\n\nNO_REPLY", "File's there. Not urgent."),
    ("First line.\nSure, here it is. **NO_REPLY**", "First line.\nSure, here it is."),
    ("无紧急事项。NO_REPLY", "无紧急事项。"),
    ("Done. NO_REPLY. NO_REPLY", "Done."),
    ("Checked v1.2 → NO_REPLY", "Checked v1.2"),
    ("Nothing to add. => **NO_REPLY**", "Nothing to add."),
    ("Sure, here it is. NO_REPLY\n\nNO_REPLY", "Sure, here it is."),
    (
        "Here it is: " + "a long answer " * 8 + "→ NO_REPLY",
        "Here it is: " + "a long answer " * 7 + "a long answer",
    ),
]
SILENT_FORMS = [
    "No urgent items → NO_REPLY",
    "无紧急事项 → NO_REPLY",
    "Nothing new: NO_REPLY",
    "Nothing to add — NO_REPLY",
    "All quiet -> NO_REPLY.",
    "Thinking: …\n\nNO_REPLY",
    "Thinking: the bots are talking to each other.\n\nNO_REPLY",
    "think\nThe user greeted the other bot; nothing for me…NO_REPLY",
    "Thought: not addressed to me. NO_REPLY",
    "Reasoning:\n- not for me\n\n**NO_REPLY**",
    OPENCLAW_RUN,
    json.dumps(json.loads(OPENCLAW_RUN), indent=2),
    '{"content": [{"type": "text", "text": "NO_REPLY"}]}',
    '{"choices": [{"message": {"role": "assistant", "content": "no_reply"}}]}',
    '{"output": [{"type": "message", "content": [{"type": "output_text", "text": "NO_REPLY"}]}]}',
    '{"text": "NO_REPLY"}',
    "NO_REPLY\r\nNO_REPLY",
    "NO_REPLY\tNO_REPLY",
    "NO_REPLY\u00a0NO_REPLY",
    "NO_REPLY \r\n\t NO_REPLY\u00a0NO_REPLY\r\n",
]
FALSE_POSITIVES = [
    "Reply NO_REPLY if you have nothing to add",
    "Reply NO_REPLY if you have nothing to add.",
    "OK",
    "No.",
    "NO REPLY NEEDED? Actually here's the answer: 42",
    "The token NO_REPLY tells the gateway to stay quiet.",
    "Thinking: the answer is 42.",
    "Thinking about it, the answer is NO_REPLY's meaning.",
    "Think\nof a number.",
    "Answer: 42",
    "The time is 14:02",
    "Sure NO_REPLY",
    '{"result": {"payloads": [{"text": "Here is the answer."}]}}',
    '{"action": "NO_REPLY", "reason": "nothing to add"}',
    '{"result": "NO_REPLY"} trailing',
]


@pytest.mark.parametrize(("text", "sent"), TRAILING_TOKEN)
def test_issue20_a_token_after_the_last_sentence_is_stripped(text: str, sent: str) -> None:
    assert not is_silent(text)
    assert apply_silence(text) == sent
    assert apply_silence(text, SilencePolicy(strip_trailing=False)) == text


@pytest.mark.parametrize("text", SILENT_FORMS)
def test_issue20_narration_reasoning_envelopes_and_repeats_are_silence(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None
    assert apply_silence(text, SilencePolicy(strip_trailing=False, drop_narration=False)) is None


def test_issue20_a_narration_line_after_an_answer_is_stripped() -> None:
    assert apply_silence("Report attached.\n\nNo urgent items → NO_REPLY") == "Report attached."
    assert apply_silence("No urgent items → NO_REPLY\nBut one thing.") == "But one thing."


@pytest.mark.parametrize("text", FALSE_POSITIVES)
def test_issue20_prose_that_mentions_the_token_is_sent_unchanged(text: str) -> None:
    assert not is_silent(text)
    assert apply_silence(text) == text


def test_issue20_run_envelopes_are_bounded_and_strict() -> None:
    huge = '{"result": {"payloads": [{"text": "NO_REPLY"}]}, "pad": "' + "x" * 70_000 + '"}'
    assert apply_silence(huge) == huge  # longer than guards.envelope.ENVELOPE_MAX
    nan = '{"result": NaN, "text": "NO_REPLY"}'
    assert apply_silence(nan) == nan
    deep = '{"result": ' * 5000 + '"NO_REPLY"' + "}" * 5000
    assert apply_silence(deep) == deep
    assert apply_silence('{"payloads": []}') == '{"payloads": []}'


FILLERS = ["\u3164", "\u115f", "\u1160", "\uffa0", "\u2800"]


@pytest.mark.parametrize("filler", FILLERS)
def test_issue20_invisible_fillers_inside_or_around_the_token_are_silent(filler: str) -> None:
    for text in (
        f"{filler}NO_REPLY{filler}",
        f"NO_{filler}REPLY",
        f"N{filler}O{filler}_{filler}REPLY",
        f"{filler * 3}\n**NO_REPLY**{filler}",
    ):
        assert is_silent(text), repr(text)
        assert apply_silence(f"Answer.\n{text}") == "Answer."
    assert apply_silence(filler * 5) is None  # reads as nothing: never sent


@pytest.mark.parametrize(
    "text",
    [
        "\u202eYLPER_ON\u202c",
        "\u202eYLPER_ON",
        " \u202eylper-on\u202c ",
        "\u202e**YLPER_ON**\u202c",
    ],
)
def test_issue20_a_right_to_left_override_that_shows_the_token_is_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None
    assert apply_silence(f"Answer.\n{text}") == "Answer."


@pytest.mark.parametrize(
    "text",
    [
        "N\u0301O_REPLY",
        unicodedata.normalize("NFD", "ŃÓ_RÉPLY"),
        "ŃÓ_RÉPLY",
        "N\u0308O\u0303_R\u0323EPLY",
        "".join(ch + "\u0336" for ch in "NO_REPLY"),
        "N\u20ddO_REPLY",
    ],
)
def test_issue20_combining_marks_on_the_letters_are_silent(text: str) -> None:
    assert is_silent(text)
    assert apply_silence(text) is None


@pytest.mark.parametrize(
    "line",
    ["\u2017", "\u2014", "\u2500", "\u2501", "\uff3f", "\u0332", "\u2e3a", "\u02cd", "\ufe4d"],
)
def test_issue20_line_characters_in_place_of_the_underscore_are_silent(line: str) -> None:
    text = f"NO{line}REPLY"
    assert is_silent(text)
    assert apply_silence(text) is None
    assert apply_silence(f"Sure, here it is. {text}") == "Sure, here it is."


LOOKALIKES_20 = [
    "\u3164NO_REPLY\u3164",
    "NO_\u2800REPLY",
    "\u202eYLPER_ON\u202c",
    "N\u0301O_REPLY",
    "NO\u2017REPLY",
    "NO\u0332REPLY",
]
ISSUE20_TEXTS = [
    *(text for text, _ in TRAILING_TOKEN),
    *SILENT_FORMS,
    *FALSE_POSITIVES[:-4],
    *LOOKALIKES_20,
    "Answer.\n\u202eYLPER_ON\u202c",
    "Report attached.\n\nNo urgent items → NO_REPLY",
]


@pytest.mark.parametrize("text", ISSUE20_TEXTS)
def test_issue20_stream_agrees_at_every_split_point(text: str) -> None:
    whole = apply_silence(text)
    for cut in range(len(text) + 1):
        assert _stream(text, [cut]) == whole, cut
    assert _stream(text, list(range(len(text)))) == whole


@pytest.mark.parametrize(("text", "sent"), TRAILING_TOKEN[:3])
def test_issue20_stream_never_posts_a_trailing_token(text: str, sent: str) -> None:
    stream = SilenceStreamFilter()
    posted = "".join(stream.feed(char) for char in text)
    assert "NO_REPLY" not in posted
    assert sent.startswith(posted)
    assert posted + (stream.finish() or "") == sent


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ISSUE20_TEXTS), cut_lists)
def test_issue20_stream_equals_apply_silence_for_any_cuts(text: str, cuts: list[int]) -> None:
    assert _stream(text, cuts) == apply_silence(text)


PIECES_20 = st.sampled_from(
    [
        "NO_REPLY",
        "Sure, here it is.",
        " ",
        "\n",
        "\r\n",
        "\t",
        "\u00a0",
        "→",
        ": ",
        " — ",
        "Thinking:",
        "think\n",
        "No urgent items",
        "无紧急事项",
        "。",
        "\u202e",
        "\u202c",
        "YLPER_ON",
        "\u3164",
        "\u0301",
        "\u2017",
        "{",
        '"text": ',
        '"NO_REPLY"',
        "}",
        "42",
        "😄",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(PIECES_20, max_size=10).map("".join), cut_lists, silence_policies)
def test_issue20_stream_equals_apply_silence_for_mixes(
    text: str, cuts: list[int], policy: SilencePolicy
) -> None:
    assert _stream(text, cuts, policy) == apply_silence(text, policy)


def test_issue20_hostile_lines_are_decided_quickly_and_sanely() -> None:
    assert apply_silence("Hi " + "." * 100_000 + " NO_REPLY") == "Hi " + "." * 100_000
    spaced = apply_silence("Hi" + " ." * 50_000 + " NO_REPLY")
    assert spaced is not None
    assert spaced.startswith("Hi . .")
    assert "NO_REPLY" not in spaced
    assert apply_silence("Hi. " + "😄" * 50_000 + " NO_REPLY") == "Hi."
    assert apply_silence("\u202e" * 50_000 + "YLPER_ON") is None
    assert apply_silence("Thinking:" + " x" * 50_000 + "\nNO_REPLY") is None
    stream = SilenceStreamFilter()
    for _ in range(5_000):
        assert stream.feed("Thinking: x ") == ""
    assert stream.finish() == "Thinking: x " * 5_000
