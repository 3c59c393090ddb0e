"""The canary strategy: `strategy.py` (the Canary class: its protocol answers, its traffic intent, its
route pins and mirror) and `phases.py` (one pass of each phase: shadowing, stepping, draining pinned
dialogues, promoting). Nothing outside this package imports `phases.py`.
"""
