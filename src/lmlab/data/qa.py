"""Open-domain QA items and their prompts, with the character spans of the question's key tokens E_Q.

A prompt is a 3-shot completion prompt ("Q: ...\\nA: ...\\n" three times, then "Q: {question}\\nA:").
E_Q is the subject entity and the property word of the target question when the dataset names them
(the generated sets, PopQA; where the question words the property otherwise, as PopQA's "place of birth" in "In what
city was X born?", the subject alone); otherwise (TriviaQA, NQ-open, HotpotQA) it is extracted from the question by a rule of
ours (`key_spans`: the named entities, numbers and quoted titles, and the first content word the question asks
about). The paper extracted these "exact tokens" with an LLM; the whole question is never E_Q, since the
random-token control needs question tokens outside it. Spans are character offsets into the prompt, turned into token positions
with the tokenizer's offset mapping, never by re-tokenizing pieces.
"""

from __future__ import annotations

import re
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
    relation: str | None = None  # the property asked (a set of several relations); token patching swaps within one
    exact: bool = False  # a closed class of answers (continents): correct only when the answer is a gold alias


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
    spans, source = [], "subject+property"
    if item.subject:
        found = _find_in(text, item.subject, q_start, q_end)
        if found is None:
            return QAPrompt(text, (q_start, q_end), [], eq_source=f"missing:{item.subject}")
        spans.append(found)
    if item.prop:
        found = _find_in(text, item.prop, q_start, q_end)
        if found is not None:
            spans.append(found)
        elif item.subject:  # a property the question words otherwise (PopQA's "place of birth"): the subject alone
            source = "subject"
        else:
            return QAPrompt(text, (q_start, q_end), [], eq_source=f"missing:{item.prop}")
    if not spans:
        found = [(q_start + a, q_start + b) for a, b in key_spans(item.question)]
        if not found:
            return QAPrompt(text, (q_start, q_end), [], eq_source="missing:extracted")
        return QAPrompt(text, (q_start, q_end), found, eq_source="extracted")
    return QAPrompt(text, (q_start, q_end), sorted(spans), eq_source=source)


# words a question is built of, never its key tokens (the wh-words, auxiliaries, articles, prepositions, and the
# verbs of asking)
FUNCTION_WORDS = frozenset("""
a an the of in on at to for from by with about as into onto over under between among during after before since
until and or but nor not no is are was were be been being am do does did done has have had having can could will
would shall should may might must what which who whom whose when where why how that this these those there it its
their his her they them he she we you i me my our your name named called known one ones s
""".split())
_WORD = re.compile(r"[\w][\w'’.-]*\w|[\w]")
_QUOTED = re.compile(r"[\"“]([^\"”]+)[\"”]")


def key_spans(question: str) -> list[tuple[int, int]]:
    """A rule for a question's exact tokens where its dataset names none: quoted titles; runs of capitalised words
    and numbers (a name: "Eiffel Tower", "1969"; the question's first word only when a second capitalised word
    follows it); and the first content word outside them (the property asked about: "capital", "wrote"). Character
    spans into `question`, sorted and disjoint; [] when it finds nothing."""
    spans: list[tuple[int, int]] = [m.span(1) for m in _QUOTED.finditer(question)]
    inside = lambda a, b: any(s <= a and b <= e for s, e in spans)
    words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(question)]
    run: list[tuple[int, int]] = []

    def close():
        if run:
            spans.append((run[0][0], run[-1][1]))
            run.clear()

    for i, (a, b, w) in enumerate(words):
        named = (w[0].isupper() or w[0].isdigit()) and not inside(a, b)
        if named and i == 0 and w.lower() in FUNCTION_WORDS:
            named = False  # "What", "Who": a question's first word is capitalised by grammar
        if named:
            run.append((a, b))
        else:
            close()
    close()
    for a, b, w in words:
        if w.lower() not in FUNCTION_WORDS and not inside(a, b) and not any(s <= a < e for s, e in spans):
            spans.append((a, b))
            break
    return sorted(set(spans))
