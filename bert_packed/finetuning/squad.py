"""SQuAD v1.1: its JSON files read, each question and its context cut into windows (one sequence
each), the windows' span logits turned into answers, and the official evaluation script's scores.

google-research/bert's run_squad makes each window [CLS] question [SEP] context window [SEP],
the windows of a context overlapping by --doc_stride; a token is scored in the window where it
has the most context on both sides. The answer predicted is the best span of n_best_size start
and end candidates, at most max_answer_length tokens, within the context. Here a token's place in
the context comes from the tokenizer's character offsets (as transformers' run_qa takes it), so
an answer is cut from the context as written, accents and case included.

    examples = read_squad_examples("squad/dev-v1.1.json")
    windows = make_windows(examples, tokenizer, max_seq_length=384, doc_stride=128, max_query_length=64)
    answers = predict_answers(examples, windows, start_logits, end_logits, n_best_size=20, max_answer_length=30)
    squad_scores(examples, answers)                                   # {"exact_match": ..., "f1": ...}
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import re
import string

import numpy as np

from bert_packed.finetuning.encode import EncodedExamples
from bert_packed.finetuning.tasks import TaskDataError
from bert_packed.storage import files

# [CLS] question [SEP] window [SEP]: the tokens a window adds to its question's and context's.
SPECIAL_TOKENS = 3


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """A question on a context.

    Attributes:
      qas_id: the question's "id".
      question: its text.
      context: the paragraph's text.
      answers: ((text, character offset in context), ...): the first is trained on; all are
        scored against (the dev set gives three).
      line: the line of the file where the question's id is (1 first), for messages.
    """

    qas_id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    line: int


@dataclasses.dataclass(frozen=True)
class Windows:
    """The sequences the examples are cut into.

    Attributes:
      encoded: the sequences, with their answers' first and last token (features.SPAN_TARGETS;
        0, the [CLS], where the window does not hold the answer).
      example_index: int [n]: the example each window is of.
      spans: int64 [len, 2] arrays: each token's characters in its example's context, -1 for the
        question and special tokens.
      max_context: bool [len] arrays: whether each token is scored in this window (the window
        where it has the most context; False off the context).
    """

    encoded: EncodedExamples
    example_index: np.ndarray
    spans: list[np.ndarray]
    max_context: list[np.ndarray]


def read_squad_examples(path: str, training: bool = False) -> list[SquadExample]:
    """The questions of a SQuAD v1.1 file ({"data": [{"paragraphs": [{"context", "qas": [{"id",
    "question", "answers": [{"text", "answer_start"}]}]}]}]}), in file order.

    Args:
      path: the file.
      training: each question must have an answer (a predict file's may have none).

    Raises:
      TaskDataError: naming the file and line: not SQuAD JSON, a question without text, an answer
        whose text is not at its answer_start, a training question without an answer, no question.
    """
    if files.isdir(path):
        raise TaskDataError(f"{path}: a directory; expected a SQuAD v1.1 JSON file")
    with files.open_file(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
        data = json.loads(text)["data"]
        paragraphs = [paragraph for article in data for paragraph in article["paragraphs"]]
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise TaskDataError(f"{path}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x}); expected a SQuAD v1.1 JSON "
                            f"file") from None
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}:{e.lineno}: not JSON ({e.msg}); expected a SQuAD v1.1 JSON file") from None
    except (KeyError, TypeError):
        raise TaskDataError(f"{path}: not a SQuAD file: expected {{\"data\": [{{\"paragraphs\": [...]}}]}}") from None
    lines, line, last = {}, 1, 0  # the lines of each question id, in order, in one pass over the text
    for match in re.finditer(r'"id"\s*:\s*"((?:[^"\\]|\\.)*)"', text):
        line += text.count("\n", last, match.start())
        last = match.start()
        lines.setdefault(json.loads(f'"{match.group(1)}"'), []).append(line)
    examples, seen = [], {}
    for number, paragraph in enumerate(paragraphs, 1):
        context = paragraph.get("context") if isinstance(paragraph, dict) else None
        questions = paragraph.get("qas") if isinstance(paragraph, dict) else None
        if not isinstance(context, str) or not isinstance(questions, list):
            raise TaskDataError(f"{path}: paragraph {number}: expected {{\"context\": a text, \"qas\": [questions]}}")
        for qa in questions:  # a paragraph without questions is passed over, as google-research's reader does
            example = _example(qa, context, path, number, lines)
            if example.qas_id in seen:
                raise TaskDataError(f"{path}:{example.line}: question id {example.qas_id!r} is given twice (line "
                                    f"{seen[example.qas_id]} too): predictions.json keys each answer by its id")
            if training and not example.answers:
                raise TaskDataError(f"{path}:{example.line}: question {example.qas_id!r} has no answer: each "
                                    f"training question needs one (SQuAD v1.1)")
            seen[example.qas_id] = example.line
            examples.append(example)
    if not examples:
        raise TaskDataError(f"{path}: no question; expected a SQuAD v1.1 JSON file")
    return examples


def _example(qa, context: str, path: str, paragraph: int, lines: dict[str, list[int]]) -> SquadExample:
    """One question of the file's `paragraph`-th paragraph, checked (read_squad_examples;
    `lines`: the lines of each id not yet read, in order)."""
    qas_id = qa.get("id") if isinstance(qa, dict) else None
    if not isinstance(qas_id, str) or not isinstance(qa.get("question"), str):
        raise TaskDataError(f"{path}: paragraph {paragraph}: a question without a text \"id\" and \"question\"; "
                            f"expected SQuAD v1.1's layout")
    line = lines[qas_id].pop(0) if lines.get(qas_id) else 1
    where = f"{path}:{line}: question {qas_id!r}"
    if not qa["question"].strip():
        raise TaskDataError(f"{where}: its \"question\" is empty; expected the question's text")
    if qa.get("is_impossible"):
        raise TaskDataError(f"{where} has no answer (is_impossible, SQuAD 2.0): SQuAD v1.1's questions only")
    answers = qa.get("answers", [])
    if not isinstance(answers, list):
        raise TaskDataError(f"{where}: \"answers\" is not a list")
    checked = []
    for answer in answers:
        answer_text = answer.get("text") if isinstance(answer, dict) else None
        start = answer.get("answer_start") if isinstance(answer, dict) else None
        if (not isinstance(answer_text, str) or not answer_text.strip() or isinstance(start, bool)
                or not isinstance(start, int) or start < 0):  # JSON's true is no offset
            raise TaskDataError(f"{where}: an answer without a \"text\" and an \"answer_start\" of 0 or more")
        if context[start:start + len(answer_text)] != answer_text:
            raise TaskDataError(f"{where}: the answer {answer_text[:60]!r} is not at its answer_start {start} "
                                f"(the context there reads {context[start:start + len(answer_text)][:60]!r})")
        checked.append((answer_text, start))
    return SquadExample(qas_id, qa["question"], context, tuple(checked), line)


def make_windows(examples: list[SquadExample], tokenizer, max_seq_length: int, doc_stride: int,
                 max_query_length: int, path: str) -> Windows:
    """Each example's question with each window of its context, as one sequence.

    A context of 10 tokens, a question of 2 and max_seq_length 10 leave windows of 5 tokens; at
    doc_stride 3 they start at tokens 0, 3, 6 ([0-4] [3-7] [6-9]), the last ending at the context's
    end. Token 3 is scored in the first window (three tokens on its left and one on its right
    there, none on its left in the second), token 4 in the second (one and three there, none on
    its right in the first): min(left, right), the longer window first on a tie.

    Args:
      examples: from read_squad_examples.
      tokenizer: a pretraining_data.tokenization.Tokenizer.
      max_seq_length, doc_stride, max_query_length: run_squad's flags.
      path: the examples' file, for messages.

    Raises:
      TaskDataError: a question of more than max_query_length tokens (naming its file and line).
    """
    questions = tokenizer.encode([e.question for e in examples])
    contexts = tokenizer.encode_with_offsets([e.context for e in examples])
    input_ids, segment_ids, starts, ends, example_index, spans, max_context = [], [], [], [], [], [], []
    unanswerable = {"covers no token": 0, "is longer than every window": 0}
    for index, (example, question, (context, offsets)) in enumerate(zip(examples, questions, contexts)):
        if len(question) > max_query_length:
            raise TaskDataError(f"{path}:{example.line}: question {example.qas_id!r} is {len(question)} tokens, above "
                                f"--max_query_length={max_query_length}: raise it (run_squad's default is 64)")
        answer = _answer_tokens(example, offsets)
        window_length = max_seq_length - len(question) - SPECIAL_TOKENS
        windows = _window_starts(len(context), window_length, doc_stride)
        best = _best_windows(windows, window_length, len(context))
        if example.answers and answer is None:
            unanswerable["covers no token"] += 1
        elif answer is not None and not any(start <= answer[0] and answer[1] < start + window_length for start in windows):
            unanswerable["is longer than every window"] += 1
        for start in windows:
            end = min(start + window_length, len(context))
            ids = np.concatenate([[tokenizer.cls_id], question, [tokenizer.sep_id], context[start:end],
                                  [tokenizer.sep_id]]).astype(np.int32)
            first = len(question) + 2  # the window's first token in the sequence
            input_ids.append(ids)
            segment_ids.append(np.concatenate([np.zeros(first, np.int32), np.ones(end - start + 1, np.int32)]))
            inside = answer is not None and start <= answer[0] and answer[1] < end
            starts.append(answer[0] - start + first if inside else 0)
            ends.append(answer[1] - start + first if inside else 0)
            example_index.append(index)
            window_spans = np.full((len(ids), 2), -1, np.int64)
            window_spans[first:first + end - start] = offsets[start:end]
            spans.append(window_spans)
            scored = np.zeros(len(ids), bool)
            scored[first:first + end - start] = best[start:end] == start
            max_context.append(scored)
    for what, count in unanswerable.items():
        if count:  # trained on as "no answer here" (each window's [CLS]), as google-research's does
            logging.warning("%s: %d question%s whose answer %s: each of its windows says no answer there",
                            path, count, "" if count == 1 else "s", what)
    targets = {"start_positions": np.asarray(starts, np.int32), "end_positions": np.asarray(ends, np.int32)}
    return Windows(EncodedExamples(input_ids, segment_ids, targets), np.asarray(example_index, np.int64), spans,
                   max_context)


def _answer_tokens(example: SquadExample, offsets: np.ndarray) -> tuple[int, int] | None:
    """The context tokens of the example's first answer (first, last), None when it has none."""
    if not example.answers or not len(offsets):
        return None
    text, start = example.answers[0]
    end = start + len(text)
    covering = np.flatnonzero((offsets[:, 1] > start) & (offsets[:, 0] < end))
    return (int(covering[0]), int(covering[-1])) if len(covering) else None


def _window_starts(num_tokens: int, window_length: int, doc_stride: int) -> list[int]:
    """google-research's doc spans: windows of window_length tokens, each doc_stride after the
    last (at most its length), until one reaches the end; one empty window for an empty context."""
    starts, start = [], 0
    while True:
        starts.append(start)
        length = min(num_tokens - start, window_length)
        if start + length >= num_tokens:
            return starts
        start += min(length, doc_stride)


def _best_windows(starts: list[int], window_length: int, num_tokens: int) -> np.ndarray:
    """For each token, the start of the window where it has the most context, google-research's
    _check_is_max_context: min(left, right) + 0.01 * the window's length, the first best."""
    best, best_score = np.zeros(num_tokens, np.int64), np.full(num_tokens, -1.0)
    for start in starts:
        end = min(start + window_length, num_tokens)
        tokens = np.arange(start, end)
        score = np.minimum(tokens - start, end - 1 - tokens) + 0.01 * (end - start)
        better = score > best_score[start:end]
        best[start:end][better], best_score[start:end][better] = start, score[better]
    return best


def predict_answers(examples: list[SquadExample], windows: Windows, start_logits: np.ndarray,
                    end_logits: np.ndarray, n_best_size: int, max_answer_length: int
                    ) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Each question's answer: its best span over its windows, as google-research's
    write_predictions picks it.

    In each window, the n_best_size highest start and end logits are candidates; a span from a
    start to an end is kept when both lie in the context, the start is scored in this window
    (Windows.max_context), the end is not before the start and it is at most max_answer_length
    tokens. The best kept span (start + end logit) is the answer, cut from the context by its
    tokens' characters; a question with none answers "".

    Args:
      examples: the questions.
      windows: make_windows' of them.
      start_logits, end_logits: float [num_windows, >= each window's length]: each window's
        logits, position 0 at its [CLS].
      n_best_size, max_answer_length: run_squad's flags.

    Returns:
      ({qas_id: answer}, {qas_id: [{"text", "probability", "start_logit", "end_logit"}, ...]}):
      predictions.json's and nbest_predictions.json's.
    """
    candidates = collections.defaultdict(list)
    for window, example in enumerate(windows.example_index):
        spans, scored = windows.spans[window], windows.max_context[window]
        length = len(spans)
        start_scores, end_scores = start_logits[window, :length], end_logits[window, :length]
        best_starts = np.argsort(-start_scores, kind="stable")[:n_best_size]
        best_ends = np.argsort(-end_scores, kind="stable")[:n_best_size]
        for start in best_starts:
            for end in best_ends:
                if (spans[start, 0] < 0 or spans[end, 0] < 0 or not scored[start] or end < start
                        or end - start + 1 > max_answer_length):
                    continue
                candidates[int(example)].append((float(start_scores[start] + end_scores[end]), float(start_scores[start]),
                                                 float(end_scores[end]), int(spans[start, 0]), int(spans[end, 1])))
    answers, nbest = {}, {}
    for index, example in enumerate(examples):
        best, seen = [], set()
        for total, start_logit, end_logit, first, last in sorted(candidates[index], key=lambda c: -c[0]):
            text = example.context[first:last]
            if text not in seen:
                seen.add(text)
                best.append((total, text, start_logit, end_logit))
            if len(best) == n_best_size:
                break
        if not best:
            best = [(0.0, "", 0.0, 0.0)]
        totals = np.array([total for total, *_ in best])
        probabilities = np.exp(totals - totals.max())
        probabilities /= probabilities.sum()
        answers[example.qas_id] = best[0][1]
        nbest[example.qas_id] = [{"text": text, "probability": float(p), "start_logit": start_logit,
                                  "end_logit": end_logit}
                                 for (_, text, start_logit, end_logit), p in zip(best, probabilities)]
    return answers, nbest


def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 script's normalisation: lower case, no punctuation, no articles,
    single spaces.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1_score(prediction: str, truth: str) -> float:
    """The official script's token F1 of normalised texts.

    >>> round(f1_score("the Eiffel tower in Paris", "Eiffel Tower"), 4)
    0.6667
    """
    predicted, true = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = sum((collections.Counter(predicted) & collections.Counter(true)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(true)
    return 2 * precision * recall / (precision + recall)


def squad_scores(examples: list[SquadExample], answers: dict[str, str]) -> dict[str, float]:
    """The official SQuAD v1.1 evaluation: each question's best exact match and F1 over its
    answers, averaged over every question that has answers (one without a prediction scores 0),
    in percent; {} when none has.

    >>> example = SquadExample("q1", "Where?", "In Paris.", (("Paris", 3), ("in Paris", 0)), 1)
    >>> squad_scores([example], {"q1": "paris"}), round(squad_scores([example], {"q1": "Paris, France"})["f1"], 2)
    ({'exact_match': 100.0, 'f1': 100.0}, 66.67)
    """
    exact, f1, answered = 0.0, 0.0, [example for example in examples if example.answers]
    for example in answered:
        prediction = answers.get(example.qas_id)
        if prediction is None:
            continue
        truths = [text for text, _ in example.answers]
        exact += max(float(normalize_answer(prediction) == normalize_answer(truth)) for truth in truths)
        f1 += max(f1_score(prediction, truth) for truth in truths)
    return {"exact_match": 100.0 * exact / len(answered), "f1": 100.0 * f1 / len(answered)} if answered else {}
