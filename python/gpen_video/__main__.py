"""``python -m gpen_video`` and the installed ``gpen-video`` command: in, the command's
arguments; out, the executable bundled in this package run with them in this process's place
(same exit code and signals), with ONNX Runtime's library found in the installed wheel."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from . import environment, executable


def main(argv: Optional[List[str]] = None) -> None:
    """Replaces this process with the bundled gpen-video, given ``argv`` (default: this
    process's arguments after the program name)."""
    args = sys.argv[1:] if argv is None else argv
    exe = str(executable())
    os.execve(exe, ["gpen-video", *args], environment())


if __name__ == "__main__":
    main()
