"""`make demo` (``python -m chatfleet_platform.demo.demo``): Chatfleet's main job, live, on the local platform.

``demo`` runs the steps (cluster, operator, a fleet, a chat on the real node); ``demo_release`` is step 5,
the releases (a bad canary rolled back, a good one promoted).
"""
