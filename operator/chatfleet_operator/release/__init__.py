"""The release: typed state in status, canary and blue-green strategies, the pure planner, measurement."""
