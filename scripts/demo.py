"""mnemo demo: an assistant's working week, remembered and recalled, fully offline.

Kept so that `scripts/demo` and `python scripts/demo.py [--store demo.db] [--data FILE]` go on
working: it runs `mnemo demo` with the same arguments. The demo itself is `mnemo.cli.demo`, its
conversation shipped as package data.
"""

from __future__ import annotations

import sys

from mnemo.cli import app

if __name__ == "__main__":
    app(["demo", *sys.argv[1:]], prog_name="mnemo")
