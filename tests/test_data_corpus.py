import pytest

from bert_packed.pretraining_data.corpus import CorpusError, detect_format, read_documents, split_sentences


@pytest.mark.parametrize("text, sentences", [
    ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
    ("Mr. Smith met Dr. Jones at St. Paul's.", ["Mr. Smith met Dr. Jones at St. Paul's."]),
    ("It costs 3.50 dollars. It rose in 1990.", ["It costs 3.50 dollars.", "It rose in 1990."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("The U.S. Army and e.g. Navy. Next one.", ["The U.S. Army and e.g. Navy.", "Next one."]),
    ("written by J. R. R. Tolkien. A book.", ["written by J. R. R. Tolkien.", "A book."]),
    ("lower case. next is not a sentence start", ["lower case. next is not a sentence start"]),
])
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_wikiextractor_documents_skip_the_title_and_keep_empty_ones(tmp_path):
    path = tmp_path / "wiki_00"
    path.write_text('<doc id="1" url="u" title="Alpha">\nAlpha\n\nFirst one. Second one.\n\nThird one.\n</doc>\n'
                    '<doc id="2" url="u" title="Empty">\nEmpty\n\n</doc>\n'
                    '<doc id="3" url="u" title="Beta">\nBeta\nOnly one.\n</doc>\n')
    documents = read_documents(str(path))
    assert [d.sentences for d in documents] == [["First one.", "Second one.", "Third one."], [], ["Only one."]]
    assert documents[1].source == f"{path}:8"  # the line of its <doc>


def test_plain_text_is_one_sentence_a_line_with_blank_lines_between_documents(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("a b.\nc d.\n\n\ne f.\n")
    assert [d.sentences for d in read_documents(str(path))] == [["a b.", "c d."], ["e f."]]


@pytest.mark.parametrize("content, message", [
    (b"", "holds no text"),
    (b"\n\n  \n", "holds no text"),
    (b'<doc id="1" title="A">\nA\ntext.\n', "never closed"),
    (b'<doc id="1" title="A">\ntext.\n<doc id="2">\n</doc>\n', "<doc> inside the <doc> opened at"),
    (b"caf\xe9 au lait\n", "not UTF-8 text"),
])
def test_bad_corpus_files_are_named(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=message) as info:
        read_documents(str(path))
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(CorpusError, match="no such input file"):
        read_documents(str(tmp_path / "missing"))
    with pytest.raises(CorpusError, match="is a directory"):
        read_documents(str(tmp_path))


@pytest.mark.parametrize("text, input_format, reason", [
    ('<doc id="1" title="A">\nA\nOne. Two.\n</doc>\n', "wikiextractor", "opens a <doc>"),
    ('{"text": "One. Two."}\n{"text": "Three."}\n', "jsonl", "opens a JSON object"),
    ("\n\nOne sentence.\nAnother one.\n\nA second document.\n", "sentences", "blank lines separate groups"),
    ("A first document. It has two sentences.\n\nA second one. Also two.\n", "documents",
     "a blank line after each line, and 2 of"),
    ("A first document. It has two sentences.\nA second one. Also two.\nA third, of one.\n", "documents",
     "2 of its first 3 lines hold several sentences"),
    ("One sentence.\nAnother one.\nA third one.\n", "sentences", "lines hold one sentence each: one document"),
])
def test_the_format_is_detected_from_the_first_lines(tmp_path, text, input_format, reason):
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    detected, why = detect_format(str(path))
    assert detected == input_format and reason in why


def test_each_format_reads_documents_of_sentences(tmp_path):
    expected = [["One here.", "Two there."], ["Three, alone."]]
    texts = {
        "sentences": "One here.\nTwo there.\n\nThree, alone.\n",
        "documents": "One here. Two there.\n\nThree, alone.\n",
        "jsonl": '{"text": "One here.\\nTwo there.", "id": 1}\n\n{"id": 2, "text": "Three, alone."}\n',
        "wikiextractor": '<doc id="1" title="T">\nT\nOne here. Two there.\n</doc>\n<doc id="2">\nThree, alone.\n</doc>\n',
    }
    for input_format, text in texts.items():
        path = tmp_path / input_format
        path.write_text(text)
        assert [d.sentences for d in read_documents(str(path), input_format)] == expected, input_format
        assert [d.sentences for d in read_documents(str(path))] == expected, input_format  # detected
    path = tmp_path / "other_field.jsonl"
    path.write_text('{"content": "One here. Two there."}\n')
    assert [d.sentences for d in read_documents(str(path), "jsonl", text_field="content")] == expected[:1]


@pytest.mark.parametrize("input_format, text, message", [
    ("jsonl", '{"text": "One."}\n{"text": "Two.",\n', r"bad.txt:2: not a JSON object \(Expecting"),
    ("jsonl", '{"text": "One."}\n["Two."]\n', r'bad.txt:2: expected a JSON object with a string field "text" '
                                               r"\(--text_field\), found a JSON list"),
    ("jsonl", '{"text": 12}\n', r'bad.txt:1: .* found "text" holding a JSON int'),
    ("jsonl", '{}\n', r'bad.txt:1: .* found an empty object'),
    ("sentences", 'One.\n{"text": "Two."}\n', r"bad.txt:2: a JSON object in a file read as one sentence a line"),
    ("jsonl", '{"body": "One.", "title": "T"}\n', r'bad.txt:1: .* found fields body, title'),
    ("sentences", 'One.\n<doc id="2" title="B">\nTwo.\n</doc>\n', r"bad.txt:2: a WikiExtractor <doc> line in a file "
                                                                  r"read as one sentence a line"),
    ("wikiextractor", "One sentence.\nTwo.\n", r"holds no text read as WikiExtractor output .*--input_format="
                                               r"wikiextractor"),
])
def test_a_file_not_in_the_format_is_named_with_its_line(tmp_path, input_format, text, message):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(CorpusError, match=message):
        read_documents(str(path), input_format)


def test_a_byte_order_mark_is_not_text_and_a_line_longer_than_read_at_once_keeps_its_number(tmp_path, monkeypatch):
    from bert_packed.pretraining_data import corpus

    path = tmp_path / "bom.jsonl"
    path.write_text('\ufeff{"text": "One here. Two there."}\n', encoding="utf-8")
    assert detect_format(str(path))[0] == "jsonl"
    assert [d.sentences for d in read_documents(str(path))] == [["One here.", "Two there."]]
    monkeypatch.setattr(corpus, "MAX_LINE_CHARACTERS", 16)  # every line below is read in pieces
    path = tmp_path / "long.jsonl"
    path.write_text('{"text": "One here. Two there."}\n{"text": "Three, alone."}\n{"text": 3}\n')
    with pytest.raises(CorpusError, match=r"long.jsonl:3: .* found \"text\" holding a JSON int"):
        read_documents(str(path), "jsonl")
    path = tmp_path / "long.txt"
    path.write_text("One here. Two there.\nThree, alone. And four.\n")
    documents = read_documents(str(path), "documents")
    assert [(d.source, d.sentences) for d in documents] == [
        (f"{path}:1", ["One here.", "Two there."]), (f"{path}:2", ["Three, alone.", "And four."])]
