"""Incremental detokenisation for streamed output.

Text is produced by decoding the whole output so far and handing out what is new, so tokens that only
together form a character (byte-level BPE splits multi-byte characters across tokens) come out as that
character. Two kinds of text are held back until more tokens arrive or generation ends:

* an incomplete multi-byte character at the end (decoded as U+FFFD, the replacement character);
* an end that could be the start of a stop string, so that a stop string that ends generation is written in
  one piece, never cut in two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalText:
    """Turns a growing list of output ids into text increments whose concatenation is the final text.

    Args:
        decode: The model's ``ids -> text`` function.
        stop_texts: Texts of the stop sequences (held back while the output could be starting one).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop_texts: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stop_texts = [s for s in stop_texts if s]
        self.sent = ""

    def update(self, ids: Sequence[int]) -> str:
        """The new text that is safe to show for output ``ids`` (possibly empty)."""
        text = self.decode(ids).rstrip(REPLACEMENT)
        if not text.startswith(self.sent):  # a decoder that rewrote earlier text: wait for the end
            return ""
        text = text[: len(text) - self._stop_prefix(text)]
        if len(text) <= len(self.sent):
            return ""
        new = text[len(self.sent) :]
        self.sent = text
        return new

    def finish(self, ids: Sequence[int], final: str | None = None) -> str:
        """Everything not yet handed out, once generation has ended.

        With a tokenizer whose decoding of a prefix is not always a prefix of its decoding of the whole (not
        the case for byte-level BPE), text already handed out cannot be taken back: the rest then starts
        where the two texts first differ, and the pieces' concatenation can differ from the final text.
        """
        final = self.decode(ids) if final is None else final
        common = 0
        for mine, theirs in zip(self.sent, final, strict=False):
            if mine != theirs:
                break
            common += 1
        rest = final[common:]
        self.sent = final
        return rest

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of ``text`` (past what was sent) that begins some stop string."""
        longest = 0
        for stop in self.stop_texts:
            for length in range(min(len(stop), len(text) - len(self.sent)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
