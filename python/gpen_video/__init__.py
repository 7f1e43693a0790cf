"""Restore faces in video with GPEN: the gpen-video command, from Python.

In: a video or still image (or a folder of them for :func:`restore_folder`) and the command's
long flags as keyword arguments. Out: the restored file and the run's statistics (the command's
``--stats-json`` record, or ``batch``'s ``--report``) as a dict; a failed run raises
:class:`Error` with the command's own message and exit code.

Keyword arguments become long flags: an underscore is a dash, ``True`` gives the bare flag,
``False`` and ``None`` leave it out, a list or tuple repeats it, and anything else is passed as
its text::

    import gpen_video
    stats = gpen_video.restore("in.mp4", "out.mp4", preset="ultrafast", frames=10,
                               overwrite=True, only_face=["a.jpg", "b.jpg"])

``python -m gpen_video`` (and the ``gpen-video`` command the package installs) runs the command
itself with the arguments given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib import util as _importlib_util
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

__all__ = ["Error", "restore", "restore_folder", "executable", "environment", "run"]

StrPath = Union[str, "os.PathLike[str]"]

_PACKAGE = Path(__file__).resolve().parent


class Error(Exception):
    """A run of gpen-video that failed.

    ``message`` is the command's own error text (its ``error:`` lines), ``returncode`` its exit
    code and ``stderr`` the end of everything it wrote to standard error.
    """

    def __init__(self, message: str, returncode: int, stderr: str = "") -> None:
        super().__init__(f"{message} (exit code {returncode})")
        self.message = message
        self.returncode = returncode
        self.stderr = stderr


def executable() -> Path:
    """The path of the gpen-video executable inside this package."""
    return _PACKAGE / "bin" / "gpen-video"


def _onnxruntime_library() -> Optional[str]:
    """The ONNX Runtime library of the installed ``onnxruntime`` (or ``onnxruntime-gpu``) wheel,
    found without importing it; ``None`` when neither is installed."""
    spec = _importlib_util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        capi = Path(folder) / "capi"
        plain = capi / "libonnxruntime.so"
        if plain.exists():
            return str(plain)
        versioned = sorted(capi.glob("libonnxruntime.so.*"))
        if versioned:
            return str(versioned[-1])
    return None


def environment(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment the command runs in: ``base`` (default: this process's), with
    ``ORT_DYLIB_PATH`` pointing at the installed ``onnxruntime`` wheel's library when it is not
    already set (the executable also looks in its own site-packages; this covers an
    ``onnxruntime`` installed in another one, such as the user's)."""
    env = dict(os.environ if base is None else base)
    if not env.get("ORT_DYLIB_PATH"):
        lib = _onnxruntime_library()
        if lib is not None:
            env["ORT_DYLIB_PATH"] = lib
    return env


def _flags(flags: Mapping[str, Any]) -> List[str]:
    """Keyword arguments as long flags (see the module's documentation)."""
    args: List[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                args.extend([flag, _text(item)])
        else:
            args.extend([flag, _text(value)])
    return args


def _text(value: Any) -> str:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def _message(stderr: str) -> str:
    """The command's own error text: its ``error:`` lines and what follows them, else the last
    line it wrote."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("error:"):
            return "\n".join(lines[i:])
    return lines[-1] if lines else "gpen-video failed without a message"


def run(args: Sequence[StrPath], *, echo: bool = True) -> subprocess.CompletedProcess:
    """Runs the command with ``args`` (after the program name); standard error is passed on to
    this process's as it comes (``echo=False`` keeps it quiet) and kept. Raises :class:`Error`
    when the command fails."""
    argv = [str(executable())] + [_text(a) for a in args]
    proc = subprocess.Popen(argv, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    kept = bytearray()
    assert proc.stderr is not None and proc.stdout is not None
    for chunk in iter(lambda: proc.stderr.read1(65536), b""):  # type: ignore[union-attr]
        if echo:
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
        kept += chunk
        del kept[: max(0, len(kept) - (1 << 20))]
    stdout = proc.stdout.read()
    code = proc.wait()
    stderr = kept.decode("utf-8", "replace")
    if code != 0:
        raise Error(_message(stderr), code, stderr)
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _with_json(flag: str, args: List[StrPath], flags: Dict[str, Any], echo: bool) -> Dict[str, Any]:
    """Runs with ``flag`` (``stats_json`` or ``report``) writing JSON to the caller's path or a
    temporary one, and returns what it holds."""
    given = flags.get(flag)
    with tempfile.TemporaryDirectory(prefix="gpen-video-") as tmp:
        path = Path(_text(given)) if given else Path(tmp) / "record.json"
        flags[flag] = path
        run(args + _flags(flags), echo=echo)
        with open(path, encoding="utf-8") as f:
            record: Dict[str, Any] = json.load(f)
    return record


def restore(src: StrPath, dst: StrPath, *, echo: bool = True, **flags: Any) -> Dict[str, Any]:
    """Restores the faces in the video or image ``src`` into ``dst``.

    Keyword arguments are the command's long flags (``preset="ultrafast"``, ``frames=10``,
    ``overwrite=True``, ``only_face=["a.jpg", "b.jpg"]``). Returns the run's statistics, the
    ``--stats-json`` record, as a dict. Raises :class:`Error` with the command's message and
    exit code when the run fails (a missing input, an unknown flag, ...).
    """
    return _with_json("stats_json", [src, dst], dict(flags), echo)


def restore_folder(in_dir: StrPath, out_dir: StrPath, *, echo: bool = True, **flags: Any) -> Dict[str, Any]:
    """Restores every video and still image in ``in_dir`` into ``out_dir`` (``gpen-video batch``).

    Keyword arguments are ``batch``'s long flags (``recursive=True``, ``jobs=2``, ...). Returns
    the batch's report (the ``--report`` record: what was done, skipped and failed) as a dict.
    Raises :class:`Error` when any clip fails (exit code 1) or the batch cannot run.
    """
    return _with_json("report", ["batch", in_dir, out_dir], dict(flags), echo)
