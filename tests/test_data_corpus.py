import pytest

from bert_packed.pretraining_data.corpus import CorpusError, read_documents, split_sentences


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
