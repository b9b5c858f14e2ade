"""The vocabulary builder: google-research's layout, learned from a corpus in any input format,
read by the data commands' tokenizer, and trained on."""

import dataclasses
import json
import os

import numpy as np
import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, TINY, dataset_settings, inputs_of, run_command, tfrecords
from training_runs import config, make_trainer, read_log

from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import read_dataset_info
from bert_packed.packing.pack_dataset import pack_pretraining_dataset
from bert_packed.packing.pack_settings import PackSettings
from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset
from bert_packed.pretraining_data.tokenization import Tokenizer
from bert_packed.pretraining_data.vocabulary import build_vocabulary, reserved_tokens


def test_the_layout_is_google_research_s_and_the_size_a_multiple_of_8(corpus):
    uncased = build_vocabulary(corpus, 1000)
    assert uncased[:2] == ["[PAD]", "[unused0]"] and uncased[99:104] == ["[unused98]", "[UNK]", "[CLS]", "[SEP]",
                                                                          "[MASK]"]
    assert uncased[:104] == reserved_tokens()
    assert len(uncased) % 8 == 0 and len(uncased) <= 1000 and len(set(uncased)) == len(uncased)
    assert any(token.startswith("##") for token in uncased) and "the" in uncased
    assert not any(token != token.lower() for token in uncased[104:] if not token.startswith("[unused"))
    cased = build_vocabulary(corpus, 1000, do_lower_case=False)
    assert any(token != token.lower() for token in cased[104:])
    # The corpus (16 documents) has fewer pieces than 30,528: the vocabulary is what it has, to a multiple of 8.
    everything = build_vocabulary(corpus, 30_528)
    assert len(everything) % 8 == 0 and len(everything) < 30_528
    assert len(set(everything)) == len(everything)
    # The trainer broke ties by hash-map order, between equally frequent merges and characters at
    # the alphabet's cut of 1,000: each build of this corpus at 1,000 gave another set of tokens,
    # and so did one with more than 1,000 characters, however given (huggingface/tokenizers#1794).
    assert build_vocabulary(corpus, 1000) == uncased == build_vocabulary(corpus, 1000)
    rare = os.path.join(os.path.dirname(corpus[0]), "rare.txt")
    with open(rare, "w", encoding="utf-8") as f:  # 1,500 ideographs and as many letters, each once
        f.write('<doc id="1" url="" title="Rare">\nRare\n\n'
                + "".join(" ".join(chr(0x4E00 + i) + chr(0x100 + i) for i in range(j, j + 50)) + ".\n"
                          for j in range(0, 1500, 50)) + "</doc>\n")
    try:
        builds = [build_vocabulary([*corpus, rare], 2000) for _ in range(3)]
    finally:
        os.remove(rare)
    assert builds[0] == builds[1] == builds[2] and len(set(builds[0]) & {chr(0x4E00 + i) for i in range(1500)}) > 0



def test_a_vocabulary_too_small_for_the_corpus_s_characters_keeps_the_most_frequent_and_says_so(corpus, caplog):
    """The characters that continue a word come first: at a size that cannot hold the alphabet, the
    cut took base characters by code point, leaving a vocabulary of continuing pieces alone."""
    tokens = build_vocabulary(corpus, 112)
    characters = [token for token in tokens[104:] if len(token) == 1]
    assert len(characters) == 4 and sorted(tokens[104:]) == sorted([*characters, *(f"##{c}" for c in characters)])
    assert "e" in characters  # the most frequent letter of English text
    assert "--vocab_size=112: room for the 4 most frequent of the corpus's 48 characters" in caplog.text


@pytest.mark.slow  # builds a vocabulary, its data and trains on it (over 3.5 s here)
def test_a_built_vocabulary_makes_records_that_train(corpus, tmp_path):
    """The command writes the vocabulary and the BERT config of its size; the data commands read
    the vocabulary, and the tiny model trains on its records."""
    template = tmp_path / "template.json"
    template.write_text(json.dumps({**TINY, "hidden_act": "gelu", "type_vocab_size": 2}))
    vocab = tmp_path / "mine" / "vocab.txt"
    result = run_command("build_vocabulary", f"--input_file={','.join(corpus)}", f"--vocab_file={vocab}",
                         "--vocab_size=1000", f"--bert_config_file={template}")
    assert result.returncode == 0, result.stderr
    tokens = vocab.read_text().splitlines()
    written = json.loads((tmp_path / "mine" / "bert_config.json").read_text())
    assert written == {**TINY, "hidden_act": "gelu", "type_vocab_size": 2, "vocab_size": len(tokens)}
    assert result.stdout.splitlines()[0].startswith(f"build_vocabulary: {len(tokens):,} tokens, ")
    assert Tokenizer(str(vocab)).vocab_size == len(tokens)
    settings = dataclasses.replace(dataset_settings(dupe_factor=1), vocab_file=str(vocab))
    create_pretraining_dataset(corpus, str(tmp_path / "records"), settings, num_workers=1)
    trainer = make_trainer(config(tmp_path / "run", tfrecords(str(tmp_path / "records")), input_mode="padded",
                                  num_train_steps=2, vocab_size=len(tokens)))
    trainer.train()
    losses = [r["loss"] for r in read_log(tmp_path / "run" / "train_log.jsonl")]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] > 1.0
    # The records, and their packs, say their vocabulary's size: a BERT config too small for it is
    # refused at start, not at the first batch that holds a token id it lacks.
    packed = tmp_path / "packed"
    pack_pretraining_dataset(inputs_of(tfrecords(str(tmp_path / "records"))), str(packed), PackSettings(
        shapes=Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, 3)), num_workers=1)
    for records in ("records", "packed"):
        assert read_dataset_info(str(tmp_path / records)).details["vocab_size"] == len(tokens)
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**TINY, "vocab_size": 200}))
    for data in (f"{tmp_path}/records/part-*.tfrecord", f"{packed}/packed-*.tfrecord"):
        result = run_command("run_pretraining", f"--bert_config_file={small}", f"--input_files={data}",
                             f"--output_dir={tmp_path}/refused", "--num_train_steps=2")
        metadata = os.path.join(os.path.dirname(data), "metadata.json")
        assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
            f"run_pretraining: error: --input_file: made with a vocabulary of {len(tokens):,} tokens ({metadata}), "
            f"but the BERT config has vocab_size=200: give the --bert_config_file of that vocabulary (python -m "
            f"bert_packed.vocab writes one with --bert_config_file)"), result.stderr
        assert not (tmp_path / "refused").exists()


def test_bad_settings_are_one_line(corpus, tmp_path):
    """Each before the corpus is read: an output that cannot be written was found after learning."""
    (tmp_path / "a_file").write_text("x")
    for args, message in (
            ([f"--vocab_file={tmp_path}/v.txt", "--vocab_size=50"], "--vocab_size=50: must be at least 112"),
            ([], "--input_file and --vocab_file are required"),
            ([f"--vocab_file={tmp_path}/v.txt", f"--bert_config_file={tmp_path}/none.json"],
             f"--bert_config_file={tmp_path}/none.json: cannot read it as a BERT config"),
            ([f"--vocab_file={tmp_path}/v.txt", f"--output_bert_config_file={tmp_path}/c.json"],
             f"--output_bert_config_file={tmp_path}/c.json: given without --bert_config_file"),
            ([f"--vocab_file={tmp_path}/a_file/v.txt"], f"{tmp_path}/a_file: exists and is not a directory")):
        result = run_command("build_vocabulary", f"--input_file={','.join(corpus)}" if args else "--vocab_size=1000",
                             *args)
        assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr
    assert not (tmp_path / "v.txt").exists()


def test_an_output_that_is_one_of_its_inputs_is_refused_and_a_replaced_one_said(corpus, tmp_path):
    """`--vocab_file=corpus/wiki_b` replaced the text of wiki_b with the vocabulary, exit 0."""
    copies = []
    for index, path in enumerate(corpus):
        copies.append(tmp_path / f"wiki_{index}")
        copies[-1].write_bytes(open(path, "rb").read())
    text = copies[1].read_bytes()
    glob = str(tmp_path / "wiki_*")
    template = tmp_path / "template.json"
    template.write_text(json.dumps({"vocab_size": 30522, "hidden_size": 128}))
    for args, message in (
            ([f"--vocab_file={copies[1]}"], f"--vocab_file={copies[1]}: one of the files it is made from (--input_file)"),
            ([f"--vocab_file={tmp_path}/v.txt", f"--bert_config_file={template}", f"--output_bert_config_file={template}"],
             f"--output_bert_config_file={template}: one of the files it is made from (--bert_config_file)"),
            ([f"--vocab_file={tmp_path}/v.txt", f"--bert_config_file={template}",
              f"--output_bert_config_file={tmp_path}/v.txt"], "the vocabulary's path too")):
        result = run_command("build_vocabulary", f"--input_file={glob}", "--vocab_size=200", *args)
        assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr
    assert copies[1].read_bytes() == text and not (tmp_path / "v.txt").exists()
    for replaced in (False, True):
        result = run_command("build_vocabulary", f"--input_file={glob}", "--vocab_size=200",
                             f"--vocab_file={tmp_path}/out/v.txt", f"--bert_config_file={template}")
        assert result.returncode == 0 and ("(the vocabulary there replaced)" in result.stdout) == replaced
        assert ("(the config there replaced)" in result.stdout) == replaced


def test_the_builder_is_a_function_of_its_settings(corpus, tmp_path):
    """write_vocabulary(VocabularySettings(...)) writes what the command writes and returns its
    figures: the tokens, the pieces learned, the config at the vocabulary's size, what it replaced."""
    from bert_packed.errors import SettingsError
    from bert_packed.pretraining_data.vocabulary import VocabularySettings, write_vocabulary

    template = tmp_path / "template.json"
    template.write_text(json.dumps({"vocab_size": 30522, "hidden_size": 128}))
    settings = VocabularySettings(input_file=",".join(corpus), vocab_file=str(tmp_path / "out" / "vocab.txt"),
                                  vocab_size=200, bert_config_file=str(template))
    written = write_vocabulary(settings)
    tokens = (tmp_path / "out" / "vocab.txt").read_text().splitlines()
    assert tokens == build_vocabulary(corpus, 200) and written.num_tokens == len(tokens) == 200
    assert written.num_learned == sum(not token.startswith("[") for token in tokens) > 0
    assert written.num_input_files == len(corpus) and written.replaced == frozenset()
    assert written.config_file == str(tmp_path / "out" / "bert_config.json")
    assert json.loads((tmp_path / "out" / "bert_config.json").read_text()) == {"vocab_size": 200, "hidden_size": 128}
    assert write_vocabulary(settings).replaced == {settings.vocab_file, written.config_file}
    with pytest.raises(SettingsError, match="one of the files it is made from"):
        write_vocabulary(dataclasses.replace(settings, vocab_file=corpus[0]))
    (tmp_path / "out" / "model.safetensors").write_bytes(b"")  # now an exported model's directory
    with pytest.raises(SettingsError, match=rf"^--vocab_file={tmp_path}/out/vocab.txt: in the directory of an "
                                            rf"exported model, whose own vocab.txt and bert_config.json it "):
        write_vocabulary(settings)
    with pytest.raises(SettingsError, match=r"--vocab_size='500': a str; expected an integer"):
        dataclasses.replace(settings, vocab_size="500")  # a notebook's "500": the command line's parser refuses it too


def test_a_corpus_file_changed_while_its_vocabulary_is_learned_is_refused(corpus, tmp_path, monkeypatch):
    """The corpus is read twice (its alphabet, then the trainer's pass): a file that changed
    between the two would give a vocabulary of neither text. Tried by hand on a real build too."""
    from bert_packed.inputs.file_identity import DataChangedError
    from bert_packed.pretraining_data import vocabulary

    copy = tmp_path / "wiki_00"
    copy.write_bytes(open(corpus[0], "rb").read())
    counted = vocabulary._alphabet

    def counted_then_changed(*args):
        found = counted(*args)
        with open(copy, "a", encoding="utf-8") as f:
            f.write('<doc id="9" url="" title="New">\nNew\n\nA new article.\n</doc>\n')
        return found

    monkeypatch.setattr(vocabulary, "_alphabet", counted_then_changed)
    with pytest.raises(DataChangedError, match=rf"{copy}: changed while its vocabulary was learned \(\d[\d,]* bytes, "
                                               r"was [\d,]+\); nothing was written"):
        build_vocabulary([str(copy)], 500)

