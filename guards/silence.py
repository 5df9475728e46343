"""Silence: a reply that means "say nothing" (NO_REPLY, narration) never reaches the chat.

Reasoning blocks (`<think>`, `<thinking>`, `<reasoning>`; see guards.reasoning) are
removed from every reply first; a reply that was only reasoning is silence.

A reply is normalised before it is compared with the silence tokens: folded as it reads
(guards.lookalike.fold: every format character such as zero-width and bidi marks, the
blank Hangul fillers and Braille pattern and the combining marks on letters dropped,
NFKC so full-width letters are plain ones, Cyrillic/Greek look-alikes, Unicode dashes
and the line characters that stand in for `_` mapped to ASCII, case folded),
surrounding whitespace, Markdown wrapping (`**`, `_`, `~~`, backticks, code fences with a
language), brackets, quotes, heading/list/quote markers and punctuation stripped from
both ends, and runs of spaces, `-` and `_` between words made one space. Tokens are
normalised the same way, so `NO_REPLY`, `no-reply`, `NO REPLY`, `ＮＯ＿ＲＥＰＬＹ` and
`[no_reply]` are one token, and `[SILENT]` matches a configured `[silent]` or `SILENT`.
Only the comparison uses the folded form: what is sent is the reply as written.

Also silence: the token repeated (`NO_REPLY NO_REPLY`, split by any whitespace: CRLF,
tab, NBSP), a token whose only company is emoji, symbols or punctuation (`😄 NO_REPLY`),
Hermes' envelope `{"action": "NO_REPLY"}` (that one key, any whitespace, its value a
token), an agent run envelope whose final text is a token (guards.envelope: the openclaw
`{"runId": …, "result": {"payloads": [{"text": "NO_REPLY"}], …}}`, `{"text": …}`,
`{"content": [{"text": …}]}`, `{"choices": [{"message": {"content": …}}]}`), text that
shows as a token only through a right-to-left override (RLO `YLPER_ON` PDF, see
guards.lookalike.displayed), and:
- Narration of the choice: a one-line lead-in of at most 80 characters with no sentence
  end in it (`.`, `!`, `?`, `…`, `。`, `！`, `？`), then an arrow (`→`, `->`, `=>`, `⇒`…), a
  colon or a dash, then a token form, in any language: `No urgent items → NO_REPLY`,
  `无紧急事项 → NO_REPLY`, `Nothing new: NO_REPLY`. As a line at either end of a longer
  reply it is stripped like a token line.
- Untagged reasoning: a reply whose first line is `think`, `thinking`, `thought(s)` or
  `reasoning` (any case) alone or followed by a colon or an ellipsis, and that ends with
  a token, on its own line or not (`Thinking: …`, a blank line, `NO_REPLY`; `think`, then
  `…NO_REPLY`). Such a reply that does not end with the token is sent as written (where
  its reasoning ends cannot be told).

Stripped, the text before it sent (with `strip_trailing`): a token form that ends the
last line after a sentence end (`Sure, here it is. NO_REPLY` sends `Sure, here it is.`;
the sentence end is kept) or after an arrow, colon or dash whose lead-in is longer than
80 characters or holds a sentence end (`Checked v1.2 → NO_REPLY` sends `Checked v1.2`).
The token form starts at the earliest of the line's last 16 separators it can (`Done.
NO_REPLY. NO_REPLY` sends `Done.`). Sent unchanged: a token inside prose or after a word
with no separator (`Reply NO_REPLY if you have nothing to add`, `Sure NO_REPLY`), `OK`,
`No.`, `NO REPLY NEEDED? Actually here's the answer: 42`, and JSON (a reply starting with
`{` or `[`) that is no envelope.

Decisions the design left open:
- An empty or whitespace-only reply is never sent (`apply_silence` returns None): every
  platform rejects an empty message, whatever the policy.
- Narration is silence only when it is marked as narration: wrapped in `*`/`_` or
  brackets (`*stays silent*`, `(no reply)`, `[no response]`), or nothing but
  punctuation or a mute emoji (`.`, `…`, `🔇`). A bare "Silent" is an answer, not narration.
- "Emoji, symbols or punctuation" means no letter and no digit of any script: a token
  next to a word or a number (`NO_REPLY 2`, `NO_REPLY です`) is prose and is sent.
- The envelope's value is matched like a token (`{"action": "no_reply"}` is silence),
  the rest of it exactly (no code fence, no other key); one longer than 256 characters
  is not one. An agent run envelope is strict JSON of at most 64 KiB. A streamed reply
  that starts with `{` is held while it may still become either.
- A streamed reply is held while it may still become any of the above: a first line
  that starts like `Thinking` (`T`, `Th`…) or is a reasoning preamble is held until the
  reply ends; a line without a sentence end shorter than 80 characters may still become
  narration and is held until it gets one, grows past that or ends; the part of the last
  line after a sentence end, arrow, colon or dash that may still become a token is held.
- Only the blank lines next to a stripped token line are removed; a reply with nothing
  stripped is sent byte for byte (reasoning aside).
- A non-string is never silent: `is_silent` returns False and `apply_silence` hands it
  back unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from guards.envelope import final_text, is_unfinished_object
from guards.lookalike import displayed, fold, is_blank
from guards.reasoning import ReasoningFilter, strip_reasoning

NO_REPLY = "NO_REPLY"

# Zero-width characters, the soft hyphen and the emoji variation selector: a held-back
# tail of a line may end in them.
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad\ufe0f"
# Curly quotes become straight ones so `doesn’t` and `doesn't` normalise alike.
_STRAIGHT_QUOTES = {"‘": "'", "’": "'", "“": '"', "”": '"'}
_CURLY_QUOTES = re.compile("[‘’“”]")
_SPACES = "".join(ch for ch in map(chr, range(0x3001)) if ch.isspace())
_BLANKS = _SPACES + _INVISIBLE
_WRAPPERS = _SPACES + "*_~`#>-|\"'„«»‹›()[]{}<>" + ".,!?;:…"
_FENCE = re.compile(r"(?P<fence>`{3,}|~{3,})[^\n]*\n(?P<body>.*?)\n?[ \t]*(?P=fence)", re.DOTALL)
_FENCE_OPENERS = ("```", "~~~")
_SEPARATORS = re.compile("[" + re.escape(_SPACES.replace("\n", "") + "-_") + "]+")
_NARRATION_OPENERS = "*_([{<"
_NARRATION_CLOSERS = "*_)]}>"
# A letter or digit of any script: what makes the company of a token prose.
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")
_ENVELOPE_MAX = 256
_ENVELOPE_START = re.compile(r"\s*\{")
_ENVELOPE = re.compile(r'\{\s*"action"\s*:\s*"(?P<value>[^"\\]*)"\s*\}')
# Where a token at the end of a line may follow other text: after a sentence's end (the
# sentence is kept), or after an arrow, colon or dash leading to it (narration).
_SENTENCE_ENDS = ".!?…。！？｡"
_TAIL_SEPARATOR = re.compile(
    r"(?P<end>(?<![.!?…。！？｡])[.!?…。！？｡]+)"
    r"|-+>|=+>|[→⇒⟶⟹➔➜➙➛➝➞➟➠➡⇨⇾⭢⮕:：–—―]|(?<=\s)[-−‐‑‒](?=\s)"
)
# The last separator before a position: the greedy `.*` backs off from the end, so the
# search costs the distance from the end, not the line's length.
_LAST_SEPARATOR = re.compile(r"(?s:.*)(?P<separator>" + _TAIL_SEPARATOR.pattern + ")")
# How many separators from a line's end a token form after text may start at.
_MAX_SEPARATORS = 16
# A lead-in this long or shorter, on one line, with no sentence end in it, is narration
# of the choice ("No urgent items → NO_REPLY"); a longer one, or a sentence, is an answer.
_NARRATION_HEAD_MAX = 80
# Reasoning written without tags: a first line "Thinking:", "Thought…", "Reasoning:" or
# "think" alone.
_PREAMBLE_WORDS = ("thinking", "thoughts", "thought", "think", "reasoning")
_PREAMBLE = re.compile(
    r"\s*(?:" + "|".join(_PREAMBLE_WORDS) + r")(?:[ \t]*(?::|：|\.\.\.|…)|[ \t]*\r?\n)",
    re.IGNORECASE,
)
# The start of a reply that may still become such a first line ("T", "Thin", "think ").
_PREAMBLE_START = re.compile(
    r"\s*(?:"
    + "|".join(sorted({word[:n] for word in _PREAMBLE_WORDS for n in range(1, len(word) + 1)}))
    + r")[ \t]*\.{0,2}\r?",
    re.IGNORECASE,
)
_OVERRIDE = "\u202e"
# An override run still open at the end of a reply being written may show as a token
# once closed, as long as it is no longer than this.
_OPEN_OVERRIDE_MAX = 64


def _visible(text: str) -> str:
    """The text as it reads (see guards.lookalike.fold), case folded, with straight quotes."""
    if text.isascii():
        return text.casefold()
    return _CURLY_QUOTES.sub(_straight_quote, fold(text))


def _straight_quote(curly: re.Match[str]) -> str:
    """The straight quote for a curly one."""
    return _STRAIGHT_QUOTES[curly[0]]


def _core(text: str, *, written_so_far: bool = False) -> str:
    """The normalised content of a reply or token: what is compared for silence.

    With `written_so_far`, the text is the start of a reply still being written: a code
    fence may still be open, and an unfinished fence opening line yields "" (anything
    may follow).
    """
    core = _visible(text)
    while True:
        inner = core.strip(_SPACES)
        fenced = _FENCE.fullmatch(inner)
        if fenced:
            inner = fenced["body"]
        elif written_so_far and inner.startswith(_FENCE_OPENERS):
            if "\n" not in inner:
                return ""
            inner = inner.partition("\n")[2]
        inner = inner.strip(_WRAPPERS)
        if inner == core:
            return _SEPARATORS.sub(" ", core)
        core = inner


_NARRATION = frozenset(
    _core(phrase)
    for phrase in (
        "silent",
        "silence",
        "silently",
        "quiet",
        "nothing",
        "no reply",
        "no response",
        "no answer",
        "no comment",
        "no message",
        "stays silent",
        "stay silent",
        "staying silent",
        "remains silent",
        "remain silent",
        "keeps silent",
        "stays quiet",
        "remains quiet",
        "keeps quiet",
        "says nothing",
        "say nothing",
        "not replying",
        "not responding",
        "does not reply",
        "does not respond",
        "doesn't reply",
        "doesn't respond",
    )
)
_MUTE_EMOJI = frozenset({"🔇", "🔕", "🤐", "🤫", "😶", "🙊"})


def _is_blank(text: str) -> bool:
    """True when nothing but whitespace and invisible characters is left."""
    return not text.strip() if text.isascii() else is_blank(text)


@dataclass(frozen=True, slots=True)
class SilencePolicy:
    """Which replies mean "send nothing", and whether token lines and narration are dropped."""

    tokens: tuple[str, ...] = (NO_REPLY,)
    strip_trailing: bool = True
    drop_narration: bool = True
    _token_cores: frozenset[str] = field(init=False, repr=False, compare=False)
    _silent_cores: frozenset[str] = field(init=False, repr=False, compare=False)
    # Longest first, so a token inside a longer one is not taken out of it.
    _ordered_cores: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _longest: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A config list (or a lone string) becomes a tuple, so the policy stays hashable.
        tokens = (self.tokens,) if isinstance(self.tokens, str) else tuple(self.tokens)
        cores = frozenset(_core(token) for token in tokens)
        if "" in cores:
            raise ValueError(
                "silence tokens must keep a letter, digit or symbol once normalised, "
                f"got {tokens!r}"
            )
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "_token_cores", cores)
        extra = _NARRATION | _MUTE_EMOJI if self.drop_narration else frozenset()
        object.__setattr__(self, "_silent_cores", cores | extra)
        ordered = tuple(sorted(cores, key=len, reverse=True))
        object.__setattr__(self, "_ordered_cores", ordered)
        object.__setattr__(self, "_longest", len(ordered[0]))

    def may_become_token(self, line: str) -> bool:
        """True when a line being written (no reasoning in it) may still be a token line."""
        return (
            self._may_become_token_form(_core(line, written_so_far=True))
            or _may_become_envelope(line)
            or self._may_become_narration(line)
            or (_OVERRIDE in line and self._may_show_token(line))
        )

    def may_become_silent(self, text: str) -> bool:
        """True when a reply being written (no reasoning in it) may still be all silence."""
        if _is_blank(text) or _PREAMBLE.match(text) or _PREAMBLE_START.fullmatch(text):
            return True
        so_far = _core(text, written_so_far=True)
        return (
            any(core.startswith(so_far) for core in self._silent_cores)
            or self._may_become_token_form(so_far)
            or _may_become_envelope(text)
            or ("{" in text and (is_unfinished_object(text) or _is_run_envelope(text, self)))
            or self._may_become_narration(text)
            or (_OVERRIDE in text and self._may_show_token(text))
        )

    def tail_hold(self, line: str, settled: int = 0) -> tuple[int, int]:
        """Where the part of a line being written that may still be a stripped token starts.

        That is after a sentence's end, or before an arrow, colon or dash, followed by
        what may still become a token form; the line's length when there is none. Also
        returns how much of the line is settled (no token form can start before it,
        however the line goes on), for the next call on the longer line to start from.
        """
        cut = len(line)
        tails, settled = self._tails(line, settled, written_so_far=True)
        for separator, tail in tails:
            if self._may_become_token_form(tail):
                start, end = separator.span("separator")
                cut = end if separator["end"] else start
        return cut, settled

    def _tails(
        self, line: str, settled: int = 0, *, written_so_far: bool = False
    ) -> tuple[list[tuple[re.Match[str], str]], int]:
        """The last separators of a line after `settled`, last first, with the core after each.

        At most _MAX_SEPARATORS, and none once what follows holds more letters and digits
        outside tokens than a token has: no token form can start further left. (A
        separator may be inside a token, as the dash in `NO—REPLY`, so a tail that is not
        a token form does not end the search.) Also returns where the line is settled.
        """
        tails: list[tuple[re.Match[str], str]] = []
        for separator in _separators_from_end(line, settled):
            if len(tails) == _MAX_SEPARATORS:
                return tails, tails[-1][0].start("separator")
            tail = _core(line[separator.end("separator") :], written_so_far=written_so_far)
            if len(_LETTER_OR_DIGIT.findall(self._without_tokens(tail))) > self._longest:
                return tails, separator.end("separator")
            tails.append((separator, tail))
        return tails, settled

    def _token_split(self, line: str, core: str) -> tuple[int, bool] | None:
        """How a line whose core is `core` ends in a token form after other text, if it does.

        Returns where the kept text ends (after a sentence's end, or before the arrow,
        colon or dash) and whether the line is narration (silence as a whole): a lead-in
        on one line of at most _NARRATION_HEAD_MAX characters with no sentence end in it,
        then an arrow, colon or dash, then the token. The token form starts at
        the earliest separator it can: `Done. NO_REPLY. NO_REPLY` keeps `Done.`.
        """
        if self._without_tokens(core) is core or line.lstrip(_SPACES).startswith(("{", "[")):
            return None  # no token in it (the usual reply), or JSON: only an envelope is
        found: tuple[int, int, bool] | None = None
        for separator, tail in self._tails(line)[0]:
            if self._is_token_form(tail):
                start, end = separator.span("separator")
                found = start, end, separator["end"] is not None
        if found is None or not _LETTER_OR_DIGIT.search(_core(line[: found[0]])):
            return None
        start, end, sentence_end = found
        if sentence_end:
            return end, False
        return start, _is_narration_head(line[:start])

    def _may_become_narration(self, text: str) -> bool:
        """True when a reply or line being written may still become a narration line."""
        if _is_narration_head(text):
            return True  # an arrow, colon or dash and the token may still follow
        return any(
            _is_narration_head(text[: mark.start()])
            and self._may_become_token_form(_core(text[mark.end() :], written_so_far=True))
            for mark in _TAIL_SEPARATOR.finditer(text, 0, _NARRATION_HEAD_MAX + 8)
            if not mark["end"]
        )

    def _may_show_token(self, text: str) -> bool:
        """True when text with a right-to-left override may still show as a token form."""
        opened = text.rfind(_OVERRIDE)
        run = text[opened:]
        if "\u202c" not in run and "\n" not in run and len(run) <= _OPEN_OVERRIDE_MAX:
            return True  # the run may still close as a reversed token
        return self._may_become_token_form(_core(displayed(text), written_so_far=True))

    def _ends_with_token(self, core: str) -> bool:
        """True when the core ends with a token that is not the end of a longer word."""
        return any(
            core.endswith(token)
            and _LETTER_OR_DIGIT.match(core, len(core) - len(token) - 1) is None
            for token in self._ordered_cores
        )

    def _is_token_form(self, core: str) -> bool:
        """True for a token, repeated or not, whose only company is emoji or punctuation."""
        if core in self._token_cores:
            return True
        rest = self._without_tokens(core)
        # Usually no token is in it at all: then `rest` is `core` itself.
        return rest is not core and _LETTER_OR_DIGIT.search(rest) is None

    def _may_become_token_form(self, so_far: str) -> bool:
        """True when the start `so_far` of a core may still become a token form."""
        rest = self._without_tokens(so_far)
        first = _LETTER_OR_DIGIT.search(rest)
        if first is None:
            return True
        # The letters may be the start of one more token, after emoji and punctuation only.
        return any(
            token.startswith(rest[cut:])
            for cut in range(max(0, len(rest) - self._longest), first.start() + 1)
            for token in self._ordered_cores
        )

    def _without_tokens(self, core: str) -> str:
        """`core` with every token in it made a space (itself when it holds none)."""
        for token in self._ordered_cores:
            if token in core:
                core = core.replace(token, " ")
        return core


_DEFAULT_POLICY = SilencePolicy()


def _is_envelope(text: str, policy: SilencePolicy) -> bool:
    """True for Hermes' `{"action": "NO_REPLY"}`: exactly that JSON, its value a token."""
    if not _ENVELOPE_START.match(text):
        return False
    envelope = text.strip()
    if len(envelope) > _ENVELOPE_MAX:
        return False
    found = _ENVELOPE.fullmatch(envelope)
    return found is not None and _core(found["value"]) in policy._token_cores


def _may_become_envelope(text: str) -> bool:
    """True while a reply being written may still become an envelope (held until `}`)."""
    if "{" not in text or not _ENVELOPE_START.match(text):
        return False
    head = text.strip()
    return len(head) <= _ENVELOPE_MAX and ("}" not in head or bool(_ENVELOPE.fullmatch(head)))


def _separators_from_end(line: str, start: int = 0) -> Iterator[re.Match[str]]:
    """The separators (_TAIL_SEPARATOR) of a line from `start` on, last first."""
    end = len(line)
    while (found := _LAST_SEPARATOR.match(line, start, end)) is not None:
        yield found
        end = found.start("separator")


def _is_run_envelope(text: str, policy: SilencePolicy) -> bool:
    """True for an agent run envelope (guards.envelope) whose final text is a token form."""
    final = final_text(text)
    return final is not None and policy._is_token_form(_core(final))


def _is_narration_head(text: str) -> bool:
    """True for a lead-in that may narrate the choice of silence (see _token_split)."""
    head = text.lstrip(_SPACES)
    if "\n" in head:
        return False  # narration is one line
    head = head.rstrip(_SPACES)
    return 0 < len(head) <= _NARRATION_HEAD_MAX and not any(end in head for end in _SENTENCE_ENDS)


def _is_silence(text: str, policy: SilencePolicy, core: str | None = None) -> bool:
    """True when reasoning-free text (whose core may be given) says nothing but silence.

    A token form, an envelope (Hermes' or an agent run's), a token shown by a
    right-to-left override, untagged reasoning ending in the token, or narration leading
    to the token.
    """
    if core is None:
        core = _core(text)
    if policy._is_token_form(core):
        return True
    if "{" in text and (_is_envelope(text, policy) or _is_run_envelope(text, policy)):
        return True
    if _OVERRIDE in text and policy._is_token_form(_core(displayed(text))):
        return True
    if _PREAMBLE.match(text) and policy._ends_with_token(core):
        return True
    split = policy._token_split(text, core)
    return split is not None and split[1]


def is_silent(text: str, policy: SilencePolicy | None = None) -> bool:
    """True when the whole reply is a silence token once normalised; never for a non-string.

    Reasoning does not count: a reply that is only reasoning, or reasoning and a token, is
    silent.
    """
    if not isinstance(text, str):
        return False
    visible = strip_reasoning(text) if "<" in text else text
    return _is_silence(visible, policy or _DEFAULT_POLICY) or (
        visible != text and _is_blank(visible)
    )


def _is_narration(text: str, core: str) -> bool:
    """True for marked narration such as `*stays silent*` or `(no reply)`, or a mute emoji."""
    if core in _MUTE_EMOJI:
        return True
    if core not in _NARRATION:
        return False
    marked = _visible(text).strip().rstrip(".,!?;:… ")
    return bool(marked) and marked[0] in _NARRATION_OPENERS and marked[-1] in _NARRATION_CLOSERS


def _says_nothing(text: str, policy: SilencePolicy, core: str | None = None) -> bool:
    """True when the reasoning-free reply (whose core may be given) must not be sent."""
    if core is None:
        core = _core(text)
    if not core:
        # Nothing but whitespace (never sent), or only punctuation and markup (narration).
        return policy.drop_narration or _is_blank(text)
    return _is_silence(text, policy, core) or (policy.drop_narration and _is_narration(text, core))


def apply_silence(text: str, policy: SilencePolicy | None = None) -> str | None:
    """The reply to send, or None to send nothing; reasoning and end token lines stripped."""
    if not isinstance(text, str):
        return text
    visible = strip_reasoning(text) if "<" in text else text
    return _without_silence(visible, policy or _DEFAULT_POLICY)


def _without_silence(text: str, policy: SilencePolicy) -> str | None:
    """`apply_silence` of a reply that holds no reasoning."""
    core = _core(text)
    if _says_nothing(text, policy, core):
        return None
    if not policy.strip_trailing or (
        policy._without_tokens(core) is core and _OVERRIDE not in text
    ):
        return text  # nothing to strip: no token shows anywhere in it
    lines = text.split("\n")
    start, stop = 0, len(lines)
    while True:
        head = _first_content(lines, start)
        if not _is_silence(lines[head], policy):
            break
        start = head + 1
        while start < stop and _is_blank(lines[start]):
            start += 1
        if start == stop:
            return None
    while True:
        tail = _last_content(lines, stop)
        if tail == head or not _is_silence(lines[tail], policy):
            break
        stop = tail
        while _is_blank(lines[stop - 1]):
            stop -= 1
    last = _last_content(lines, stop)
    split = policy._token_split(lines[last], core if len(lines) == 1 else _core(lines[last]))
    if split is not None:
        # A token after the last sentence (or a long lead-in): the text before it is sent.
        lines[last] = lines[last][: split[0]].rstrip(_BLANKS)
        stop = last + 1
    elif (start, stop) == (0, len(lines)):
        return text
    rest = "\n".join(lines[start:stop])
    return None if _says_nothing(rest, policy) else rest


def _first_content(lines: list[str], start: int) -> int:
    """Index of the first non-blank line at or after `start` (one exists)."""
    while _is_blank(lines[start]):
        start += 1
    return start


def _last_content(lines: list[str], stop: int) -> int:
    """Index of the last non-blank line before `stop` (one exists)."""
    stop -= 1
    while _is_blank(lines[stop]):
        stop -= 1
    return stop


class SilenceStreamFilter:
    """Streams a reply while holding back whatever may still turn out to be silence.

    `feed(chunk)` returns the text that is safe to send now; `finish()` returns the rest,
    or None when the whole reply was silence (and `feed` never returned any text). What
    is sent in total equals `apply_silence` of the whole reply: the start is held until
    it cannot become a token or narration (`N`, `NO`, `NO_`, `*(sil` …), and a last line
    that may be a token is held with the blank lines before it. Reasoning blocks are
    taken out first (guards.reasoning.ReasoningFilter), so none of them is ever sent.
    """

    def __init__(self, policy: SilencePolicy | None = None) -> None:
        self._policy = policy or _DEFAULT_POLICY
        self._reasoning = ReasoningFilter()
        # The reply without its reasoning, as far as it is decided.
        self._parts: list[str] = []
        self._pending = ""
        self._sent = 0
        self._head_done = False
        # The part of the current line already sent ("" at the start of a line).
        self._line_sent = ""
        # Where the current line starts in the reply (without reasoning), and how much of
        # it is settled (see SilencePolicy.tail_hold).
        self._line_start = 0
        self._line_settled = 0

    def feed(self, chunk: str) -> str:
        """Take the next piece of the reply; return what may be sent now (often "")."""
        chunk = self._reasoning.feed(chunk)
        if not chunk:
            return ""
        self._parts.append(chunk)
        self._pending += chunk
        if not self._head_done and not self._settle_head():
            return ""
        pending = self._pending
        hold = self._hold_from(pending)
        # What would be sent, with the end of its last line when that line is complete.
        ready = pending[: pending.find("\n", hold) + 1 or hold]
        if hold == 0 or (self._sent == 0 and self._policy.may_become_silent(ready)):
            return ""
        out = pending[:hold]
        self._pending = pending[hold:]
        self._sent += len(out)
        _, newline, after = out.rpartition("\n")
        self._line_sent = after if newline else self._line_sent + after
        return out

    def finish(self) -> str | None:
        """The text still to send once the reply is complete; None when it was all silence."""
        self._parts.append(self._reasoning.finish())
        result = _without_silence("".join(self._parts), self._policy)
        if result is None:
            return None if self._sent == 0 else ""
        return result[self._sent :]

    def _settle_head(self) -> bool:
        """Strip complete token lines at the start; True once the first line is content."""
        policy = self._policy
        while True:
            pending = self._pending
            if policy.may_become_silent(pending):
                return False
            if not policy.strip_trailing:
                break
            lines = pending.split("\n")
            head = _first_content(lines, 0)
            if head == len(lines) - 1 or not _is_silence(lines[head], policy):
                break
            rest = head + 1
            while rest < len(lines) - 1 and _is_blank(lines[rest]):
                rest += 1
            self._pending = "\n".join(lines[rest:])
        self._head_done = True
        return True

    def _tail_hold(self, sent: str, line: str, newline: int) -> int:
        """Where the held tail of a content line (its start `sent` already sent) starts."""
        start = self._sent - len(sent) + newline + 1
        settled = self._line_settled if start == self._line_start else 0
        cut, settled = self._policy.tail_hold(sent + line, settled)
        self._line_start, self._line_settled = start, settled
        return max(cut - len(sent), 0)

    def _hold_from(self, pending: str) -> int:
        """Where the held-back tail of `pending` starts: trailing blank and token lines."""
        if not self._policy.strip_trailing:
            return len(pending)
        end = len(pending)
        while True:
            newline = pending.rfind("\n", 0, end)
            line = pending[newline + 1 : end]
            sent = self._line_sent if newline < 0 else ""
            if sent:
                # The rest of a line whose start was sent: content, not a token line.
                is_content = True
            elif _is_blank(line):
                is_content = False
            elif end == len(pending):
                is_content = not self._policy.may_become_token(line)
            else:
                is_content = not _is_silence(line, self._policy)
            if is_content:
                # It may be the last line sent: a token may still end it after a sentence.
                return (
                    newline + 1 + len(line[: self._tail_hold(sent, line, newline)].rstrip(_BLANKS))
                )
            if newline < 0:
                return 0
            end = newline
