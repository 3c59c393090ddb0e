"""Pure planning: cluster facts, diagnosis, the apply plan, status and conditions. No API, no kopf."""
