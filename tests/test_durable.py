"""common/durable.py: atomic writes keep permissions sensible, and only "cannot" errors of a directory
fsync are ignored (the storage-fault tests cover the failures end to end)."""

import errno
import os
import stat

import pytest

from common import durable


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_what_open_would_give_and_a_replaced_file_keeps_its_mode(tmp_path):
    old_mask = os.umask(0o027)
    try:
        new = tmp_path / "new.json"
        durable.write_atomically(new, lambda fh: fh.write(b"{}"))
        assert mode(new) == 0o640  # not mkstemp's 0600: results are read by other users and containers
        os.chmod(new, 0o604)
        durable.write_atomically(new, lambda fh: fh.write(b"[]"))
        assert mode(new) == 0o604 and new.read_bytes() == b"[]"
    finally:
        os.umask(old_mask)


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_bytes(b"old")

    def fail(fh):
        fh.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError, match="summary.json"):  # the error names the file
        durable.write_atomically(path, fail)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


@pytest.mark.parametrize("code, raised", [(errno.EINVAL, False), (errno.EIO, True)])
def test_a_directory_fsync_ignores_only_what_the_platform_cannot_do(tmp_path, monkeypatch, code, raised):
    def fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)
    if raised:
        with pytest.raises(OSError, match=str(tmp_path)):
            durable.fsync_dir(tmp_path)
    else:
        durable.fsync_dir(tmp_path)


def test_checkpoints_and_ledgers_stay_owner_only(tmp_path):
    from common.checkpoint_file import save_checkpoint
    from common.privacy.ledger import PrivacyLedger

    save_checkpoint(tmp_path / "r.ckpt.npz", {"round": 1})
    ledger = PrivacyLedger.open(tmp_path / "p.ledger.json", owner="p")
    assert mode(tmp_path / "r.ckpt.npz") == mode(ledger.path) == 0o600  # node state: functions of client data
