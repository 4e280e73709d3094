"""`Run.log_checkpoint` (the public call the integrations record a saved checkpoint with): a `checkpoint` event
holding the file's SHA-256 or the folder's manifest hash (computed here by hashlib, as `sha256sum` lines), its
bytes and absolute path, at the step asked or the last step logged; bad input refused at the call."""

from __future__ import annotations

import hashlib

import pytest

from runledger.core import LogError
from support.runs import listed_run


def test_a_folder_and_a_file_are_recorded_by_their_content_hash(tmp_path):
    run, sink = listed_run(tmp_path, "ckpt")
    folder = tmp_path / "checkpoint-2"
    (folder / "sub").mkdir(parents=True)
    files = {"model.safetensors": b"\x00\x01weights", "sub/optimizer.pt": b"state", "trainer_state.json": b"{}"}
    for rel, data in files.items():
        (folder / rel).write_bytes(data)
    manifest = "".join(f"{hashlib.sha256(files[rel]).hexdigest()}  {rel}\n" for rel in sorted(files))
    run.log({"loss": 1.0}, step=5)
    got = run.log_checkpoint(folder, seconds=0.25)
    assert got == {"path": str(folder.resolve()), "bytes": sum(map(len, files.values())),
                   "content_hash": hashlib.sha256(manifest.encode()).hexdigest(), "config_hash": None,
                   "reason": "periodic", "seconds": 0.25}
    one = folder / "model.safetensors"
    run.log_checkpoint(one, step=7, reason="final")
    assert sink.payloads("checkpoint") == [(5, got), (7, {"path": str(one.resolve()), "bytes": len(files["model.safetensors"]),
                                                          "content_hash": hashlib.sha256(files["model.safetensors"]).hexdigest(),
                                                          "config_hash": None, "reason": "final"})]


def test_bad_input_is_refused_at_the_call(tmp_path):
    run, sink = listed_run(tmp_path, "ckpt")
    for path, kw, said in ((tmp_path / "absent", {}, "no file or folder"), (tmp_path, {"reason": "nightly"}, "reason"),
                           (tmp_path, {"step": -1}, "step")):
        with pytest.raises(LogError, match=said):
            run.log_checkpoint(path, **kw)
    run.finish()
    with pytest.raises(LogError, match="finished"):
        run.log_checkpoint(tmp_path)
    assert sink.payloads("checkpoint") == []


def test_a_disabled_run_records_nothing(tmp_path):
    run, sink = listed_run(tmp_path, "ckpt", mode="disabled")
    assert run.log_checkpoint(tmp_path / "absent") == {} and sink.payloads("checkpoint") == []


@pytest.mark.parametrize("bad", [{"path": "ckpt/4"}, {"path": "ckpt/4", "step": "four", "content_hash": "h"}, ["ckpt/4", 4]])
def test_a_resumed_from_without_its_path_step_and_hash_is_refused_in_one_line_before_anything_starts(tmp_path, bad):
    import runledger

    with pytest.raises(LogError, match="resumed_from .*a dict of path, step"):
        runledger.init(project="p", root=tmp_path / "root", resumed_from=bad)
    assert not (tmp_path / "root").exists()  # nothing started, nothing written
