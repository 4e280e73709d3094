"""Signed notes and checkpoints against the C2SP specs' own examples (signed-note.md's verifier key
and note, C2SP/C2SP commit 5ba5ee83), and the refusals a verifier owes."""

from __future__ import annotations

import os

import pytest

from runledger.ledger.tlog import checkpoint, merkle, note

SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = ("This is an example message.\n\n"
             "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n")


def test_the_spec_example_note_verifies_with_the_spec_key():
    v = note.Verifier.parse(SPEC_VKEY)
    assert v.text() == SPEC_VKEY
    text, good = note.open_note(SPEC_NOTE, [v])
    assert text == "This is an example message.\n" and good == [v]


def test_an_edited_note_or_another_key_is_refused():
    v = note.Verifier.parse(SPEC_VKEY)
    with pytest.raises(note.NoteError, match="does not verify"):
        note.open_note(SPEC_NOTE.replace("example message", "exemplary message"), [v])
    other = note.Signer.generate("example.com/foo").verifier
    with pytest.raises(note.NoteError, match="no signature by a known key"):
        note.open_note(SPEC_NOTE, [other])


def test_a_vkey_whose_id_does_not_match_is_refused():
    with pytest.raises(note.NoteError, match="id"):
        note.Verifier.parse(SPEC_VKEY.replace("530d903a", "530d903b"))


def test_sign_then_open_and_unknown_signatures_are_ignored():
    a, b = note.Signer.generate("log.example/a"), note.Signer.generate("witness.example/b")
    signed = note.sign("hello\n", a)
    cosigned = signed + note.sign("hello\n", b).split("\n\n")[1]
    assert note.open_note(cosigned, [a.verifier])[0] == "hello\n"
    assert note.Signer.parse(a.text()) == a


def test_checkpoint_round_trip_and_origin():
    s = note.Signer.generate("runledger.test/log")
    cp = checkpoint.Checkpoint("runledger.test/log", 8, merkle.EMPTY_ROOT)
    signed = checkpoint.sign(cp, s)
    assert signed.startswith("runledger.test/log\n8\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n\n\u2014 runledger.test/log ")
    assert checkpoint.open_signed(signed, [s.verifier], "runledger.test/log") == cp
    with pytest.raises(note.NoteError, match="not 'other'"):
        checkpoint.open_signed(signed, [s.verifier], "other")


def test_the_key_file_is_0600_and_one_others_read_is_refused(tmp_path):
    s = note.Signer.generate("runledger.test/k")
    path = note.write_key(tmp_path / "k" / "tlog.key", s)
    assert path.stat().st_mode & 0o777 == 0o600
    assert note.read_key(path) == s
    with pytest.raises(FileExistsError):
        note.write_key(path, note.Signer.generate("runledger.test/k"))
    os.chmod(path, 0o644)
    with pytest.raises(note.NoteError, match="readable by others"):
        note.read_key(path)


def test_keys_round_trip_whatever_their_base64_holds():
    for _ in range(64):  # (base64 holds "+" in about one key in two: the separator must not split it)
        s = note.Signer.generate("runledger.test/k")
        assert note.Signer.parse(s.text()) == s
        assert note.Verifier.parse(s.verifier.text()) == s.verifier
