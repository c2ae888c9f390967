"""The check of a composed config before any process starts: every problem at once, each module one
part of it (README, "Developing"). Imports every folder but ``launch``.
"""
