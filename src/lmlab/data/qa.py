"""Open-domain QA items and their prompts, with the character spans of the question's key tokens E_Q.

A prompt is a 3-shot completion prompt ("Q: ...\\nA: ...\\n" three times, then "Q: {question}\\nA:").
E_Q is the subject entity and the property word of the target question when the dataset names them
(the generated sets, PopQA); otherwise (TriviaQA, NQ-open, HotpotQA) it is the whole question
(METHODS.md decision). Spans are character offsets into the prompt, turned into token positions
with the tokenizer's offset mapping, never by re-tokenizing pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_SHOTS = (("What is the capital of Japan?", "Tokyo"), ("Who wrote Hamlet?", "William Shakespeare"),
                 ("What is the largest planet in the Solar System?", "Jupiter"))


@dataclass
class QAItem:
    id: str
    dataset: str
    question: str
    aliases: list[str]
    subject: str | None = None
    prop: str | None = None
    popularity: float | None = None
    shots: tuple[tuple[str, str], ...] = DEFAULT_SHOTS


@dataclass
class QAPrompt:
    text: str
    question_span: tuple[int, int]  # the target question inside `text`
    eq_spans: list[tuple[int, int]] = field(default_factory=list)  # E_Q: subject and property (or the question)
    eq_source: str = "subject+property"


def _find_in(text: str, needle: str, start: int, end: int) -> tuple[int, int] | None:
    """The last occurrence of `needle` within text[start:end], on word boundaries where possible."""
    pos = text.rfind(needle, start, end)
    return None if pos < 0 else (pos, pos + len(needle))


def build_prompt(item: QAItem) -> QAPrompt:
    shots = "".join(f"Q: {q}\nA: {a}\n" for q, a in item.shots)
    text = f"{shots}Q: {item.question}\nA:"
    q_start = len(shots) + 3
    q_end = q_start + len(item.question)
    spans = []
    for piece in (item.subject, item.prop):
        if piece:
            found = _find_in(text, piece, q_start, q_end)
            if found is None:
                return QAPrompt(text, (q_start, q_end), [], eq_source=f"missing:{piece}")
            spans.append(found)
    if not spans:
        return QAPrompt(text, (q_start, q_end), [(q_start, q_end)], eq_source="whole question")
    return QAPrompt(text, (q_start, q_end), sorted(spans))
