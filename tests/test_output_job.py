"""OutputJob, the one way a data command's output resumes, on a toy command: each input file is
copied, upper-cased, into out-NNNNN.txt (one work unit a file)."""

import logging
import os

import pytest

from bert_packed.console.progress import Progress
from bert_packed.errors import OutputDirectoryError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import DataFile, DatasetFilesError, DatasetInfo
from bert_packed.inputs.file_identity import FileIdentity
from bert_packed.storage import files
from bert_packed.storage.output_job import InputsChangedError, OutputJob

LOUD = {"shout": True, "voice": {"volume": 10}}


def upper_case(inputs, output_dir, settings, fail_at=None, done=None):
    """The toy command: returns its metadata; `done` collects the units it did."""
    job = OutputJob(output_dir, "upper_case", "unpacked data", {"settings": settings, "sources": inputs}, inputs,
                    outputs=("out-",))
    finished = job.finished()
    if finished is not None:
        return finished
    with job.writing() as finished:
        if finished is not None:
            return finished

        def copy(index, path):
            if index == fail_at:
                raise KeyboardInterrupt
            name = f"out-{index:05d}.txt"
            files.write_text_atomically(os.path.join(output_dir, name), open(path).read().upper())
            (done if done is not None else []).append(index)
            job.units.save(f"copy-{index:05d}", {"file": name, **FileIdentity.of(os.path.join(output_dir, name)).content})

        summaries = job.each_unit(copy, [(f"copy-{i:05d}", (i, path)) for i, path in enumerate(inputs)], 1,
                                  Progress("upper_case", total=len(inputs)))
        entries = tuple(DataFile.of(os.path.join(output_dir, s["file"]), records=1, sequences=1) for s in summaries)
        return job.commit(DatasetInfo(packed=False, shapes=Shapes(8, 1), num_sequences=len(entries),
                                      num_records=len(entries), files=entries, sources=tuple(inputs)))


def test_a_job_resumes_its_units_commits_last_and_starts_over_when_an_input_changes(tmp_path, monkeypatch, caplog):
    inputs = []
    for index, text in enumerate(["one", "two", "three"]):
        inputs.append(str(tmp_path / f"in{index}.txt"))
        open(inputs[-1], "w").write(text)
    out = str(tmp_path / "out")
    done = []
    with pytest.raises(KeyboardInterrupt):
        upper_case(inputs, out, LOUD, fail_at=2, done=done)
    assert done == [0, 1] and not os.path.exists(os.path.join(out, "metadata.json"))
    # Another run's settings: refused, naming them; nothing touched.
    with pytest.raises(OutputDirectoryError, match=r"holds an unfinished upper_case run with other settings \(volume\)"):
        upper_case(inputs, out, {**LOUD, "voice": {"volume": 11}})
    done.clear()
    with caplog.at_level(logging.INFO):
        metadata = upper_case(inputs, out, LOUD, done=done)
    assert done == [2] and "resuming the unfinished run: 2 units of its work already done" in caplog.text
    assert sorted(os.listdir(out)) == ["metadata.json", "out-00000.txt", "out-00001.txt", "out-00002.txt"]
    assert open(os.path.join(out, "out-00002.txt")).read() == "THREE" and metadata["num_sequences"] == 3
    # Finished: nothing to do, read only; other settings refused, naming them.
    assert upper_case(inputs, out, LOUD, done=done) == metadata and done == [2]
    with pytest.raises(OutputDirectoryError, match=r"already holds unpacked data made with other settings \(shout\)"):
        upper_case(inputs, out, {**LOUD, "shout": False})
    # A file of the finished output cut short: named, not taken for finished.
    open(os.path.join(out, "out-00000.txt"), "w").write("ON")
    with pytest.raises(DatasetFilesError, match=r"out-00000.txt: 2 bytes, but metadata.json records 3: cut short"):
        upper_case(inputs, out, LOUD)
    open(os.path.join(out, "out-00000.txt"), "w").write("ONE")
    # An input edited: made again. A kill while the old output is being removed starts over again.
    open(inputs[1], "w").write("TWO!")
    remove = files.remove
    monkeypatch.setattr(files, "remove", lambda path: (_ for _ in ()).throw(KeyboardInterrupt)
                        if path.endswith("out-00001.txt") else remove(path))
    with pytest.raises(KeyboardInterrupt):
        upper_case(inputs, out, LOUD)
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(out, "metadata.json"))
    done.clear()
    upper_case(inputs, out, LOUD, done=done)
    assert done == [0, 1, 2] and open(os.path.join(out, "out-00001.txt")).read() == "TWO!"
    # A unit's output removed from an unfinished run: it starts over, not from a hole.
    with pytest.raises(KeyboardInterrupt):
        upper_case(inputs, str(tmp_path / "again"), LOUD, fail_at=2)
    os.remove(tmp_path / "again" / "out-00000.txt")
    done.clear()
    with caplog.at_level(logging.WARNING):
        upper_case(inputs, str(tmp_path / "again"), LOUD, done=done)
    assert done == [0, 1, 2] and "(out-00000.txt, which it wrote, is gone or changed); starting over" in caplog.text


def test_damaged_work_starts_over_and_a_removal_killed_midway_is_made_again(tmp_path, monkeypatch, caplog):
    inputs = [str(tmp_path / "in0.txt"), str(tmp_path / "in1.txt")]
    for path in inputs:
        open(path, "w").write("text")
    out = str(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        upper_case(inputs, out, {}, fail_at=1)
    open(os.path.join(out, ".work", "copy-00000.json"), "w").write('{"file": "out-00')  # torn by the storage
    done = []
    with caplog.at_level(logging.WARNING):
        upper_case(inputs, out, {}, done=done)
    assert done == [0, 1] and "copy-00000.json: damaged" in caplog.text
    # The output removed whole (as --output_file's parts are once dealt): a kill midway leaves a
    # run that the same command makes again, not a dataset with files missing.
    job = OutputJob(out, "upper_case", "unpacked data", {"settings": {}, "sources": inputs}, inputs, outputs=("out-",))
    rmtree = files.rmtree
    monkeypatch.setattr(files, "rmtree", lambda path: (_ for _ in ()).throw(KeyboardInterrupt) if path == out
                        else rmtree(path))
    with pytest.raises(KeyboardInterrupt):
        job.remove()
    monkeypatch.undo()
    assert os.listdir(out) == [".work"] and os.listdir(os.path.join(out, ".work")) == ["run.json"]
    done.clear()
    upper_case(inputs, out, {}, done=done)
    assert done == [0, 1]
    job.remove()
    assert not os.path.exists(out)


def test_an_input_changed_during_the_run_is_not_committed_and_the_rerun_starts_over(tmp_path, monkeypatch):
    inputs = [str(tmp_path / "in0.txt")]
    open(inputs[0], "w").write("one")
    out = str(tmp_path / "out")
    save = files.write_text_atomically

    def save_then_edit_the_input(path, text):
        save(path, text)
        if "copy-00000" in path:
            open(inputs[0], "w").write("ONE, edited")

    monkeypatch.setattr(files, "write_text_atomically", save_then_edit_the_input)
    with pytest.raises(InputsChangedError, match=rf"{inputs[0]}: changed while its output was being made"):
        upper_case(inputs, out, {})
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(out, "metadata.json"))
    upper_case(inputs, out, {})
    assert open(os.path.join(out, "out-00000.txt")).read() == "ONE, EDITED"


def directories_of_each_kind(tmp_path):
    """(the input file, and a directory of each kind: data, a run, a Hugging Face export, a TF1
    export, a vocabulary's (what python -m bert_packed.vocab writes: no output))."""
    from bert_packed.model.huggingface import EXPORT_FILES

    inputs = [str(tmp_path / "in0.txt")]
    open(inputs[0], "w").write("one")
    data, run, huggingface, google, vocabulary = (tmp_path / name for name in ("data", "run", "hf", "tf1", "vocab"))
    upper_case(inputs, str(data), {})
    for directory, names in ((run, ["run.json"]), (huggingface, list(EXPORT_FILES)),
                             (google, ["bert_config.json", "vocab.txt", "model.ckpt-3.index"]),
                             (vocabulary, ["bert_config.json", "vocab.txt"])):
        directory.mkdir()
        for name in names:
            (directory / name).write_text("{}")
    return inputs, data, run, huggingface, google, vocabulary


def test_each_kind_of_output_is_known_by_its_file_and_every_writer_refuses_another_kind(tmp_path):
    """Data, a training run and an exported model are held by one claim (output_job.claimed): each
    refuses a directory of another kind in one line naming it, and writes nothing there."""
    from conftest import TINY, VOCAB

    from bert_packed.model import BertConfig
    from bert_packed.model.checkpoint import export_directory
    from bert_packed.model.huggingface import EXPORT_FILES, require_export_directory
    from bert_packed.storage.output_job import TRAINING_RUN, claimed, found_output

    inputs, data, run, huggingface, google, vocabulary = directories_of_each_kind(tmp_path)
    assert [found_output(str(d)) for d in (data, run, huggingface, google, vocabulary, tmp_path / "none")] == [
        "unpacked data", "a training run", "an exported model", "an exported model", None, None]
    before = {d: (sorted(os.listdir(d)), os.stat(d).st_mtime_ns) for d in (data, run, huggingface, google)}
    for export in (huggingface, google):
        with pytest.raises(OutputDirectoryError, match=rf"^{export}: holds an exported model; unpacked data would be "
                                                       rf"mixed into it. Use another directory$"):
            upper_case(inputs, str(export), {})
        with pytest.raises(OutputDirectoryError, match=rf"^{export}: holds an exported model; a training run would"):
            with claimed(str(export), "run_pretraining", TRAINING_RUN):
                pass
    exported = lambda name: name in EXPORT_FILES  # noqa: E731 - what export_huggingface writes
    for directory, kind in ((data, "unpacked data"), (run, "a training run")):
        with pytest.raises(OutputDirectoryError, match=rf"^{directory}: holds {kind}; an exported model would be"):
            with export_directory(str(directory), exported):
                pass
        with pytest.raises(OutputDirectoryError, match=rf"^{directory}: holds {kind}; an exported model would be"):
            require_export_directory(str(directory), VOCAB, True, BertConfig(**TINY), str(tmp_path / "other"))
    assert {d: (sorted(os.listdir(d)), os.stat(d).st_mtime_ns) for d in (data, run, huggingface, google)} == before
    with export_directory(str(huggingface), exported):  # a previous export: written over
        pass
    upper_case(inputs, str(vocabulary), {})  # a directory of the user's files, no output: taken


def test_an_export_writes_over_an_export_only_and_one_killed_midway_is_still_an_export(tmp_path):
    """An export's names without its weights are the user's files (a vocabulary's), not an export
    to write over; an export killed after removing the one it writes over stays an export."""
    from bert_packed.model.checkpoint import CheckpointError, export_directory
    from bert_packed.model.huggingface import EXPORT_FILES
    from bert_packed.storage.output_job import found_output

    inputs, _, _, _, google, vocabulary = directories_of_each_kind(tmp_path)
    google_names = lambda name: name in ("bert_config.json", "vocab.txt") or name.startswith("model.ckpt-")  # noqa: E731
    with pytest.raises(CheckpointError, match=rf"^{vocabulary}: holds bert_config.json and vocab.txt but no exported "
                                              rf"model, which would write over them; use an empty or new directory$"):
        with export_directory(str(vocabulary), google_names):
            pass
    with pytest.raises(CheckpointError, match=rf"^{google}: holds bert_config.json and 1 more, which an export of "
                                              rf"this format does not write \(another format's, or your own\); "):
        with export_directory(str(google), lambda name: name in EXPORT_FILES):
            pass
    with pytest.raises(KeyboardInterrupt), export_directory(str(google), google_names):
        os.remove(google / "model.ckpt-3.index")
        raise KeyboardInterrupt
    assert found_output(str(google)) == "an exported model" and ".export_under_way" in os.listdir(google)
    with pytest.raises(OutputDirectoryError, match=rf"^{google}: holds an exported model under way, or killed midway "
                                                   rf"\(the same export command finishes it\); unpacked data would be"):
        upper_case(inputs, str(google), {})
    with export_directory(str(google), google_names):
        (google / "model.ckpt-4.index").write_text("{}")
    assert sorted(os.listdir(google)) == ["bert_config.json", "model.ckpt-4.index", "vocab.txt"]
