"""``python -m chatfleet_runtime.relay``: run the stream relay (chatfleet_runtime.relay.server)."""

from chatfleet_runtime.relay.server import main

raise SystemExit(main())
