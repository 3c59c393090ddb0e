"""`kubectl chatbot` plugin (stub): prints ChatbotServices and their status. The release issue extends it."""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    """Print `kubectl get chatbotservices -o wide` for the given arguments (e.g. -n NS, NAME)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["status"]:
        args = args[1:]
    return subprocess.call(["kubectl", "get", "chatbotservices.chatfleet.io", "-o", "wide", *args])


if __name__ == "__main__":
    sys.exit(main())
