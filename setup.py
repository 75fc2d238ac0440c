"""Package list for setuptools (everything else is in pyproject.toml): the kforge packages plus
the top-level themes/ folder, installed as kforge_tui.themes."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["kforge", "kforge.*", "kforge_tui", "kforge_tui.*"]),
                "kforge_tui.themes"])
