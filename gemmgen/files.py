"""Reading a file a user named: whatever goes wrong is one line that names the file and what it
should have been, never a decoding traceback."""
from __future__ import annotations

from pathlib import Path

from gemmgen.errors import GemmgenError


def read_text(path: str | Path, what: str, error: type[GemmgenError] = GemmgenError) -> str:
    """The text of `path` (UTF-8, a byte-order mark dropped); `what` names what it should hold
    ("a shapes CSV"), `error` is the caller's error class."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise error(f"{p} is a folder; give {what}") from None
    except FileNotFoundError:
        raise error(f"{p}: no such file (give {what})") from None
    except OSError as exc:
        raise error(f"cannot read {p}: {exc.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{p} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}): "
                    f"it should be {what}") from None
