"""Package layout (metadata is in pyproject.toml).

The repository keeps the product's folders at the top (backend/, migrations/, demo/,
trainer_hooks/); installed, the server's folders live under one `paritywatch` namespace
(`paritywatch.backend`, `paritywatch.migrations`, `paritywatch.demo`) so that generic names
such as `backend` never collide with another project's in site-packages.
"""
from setuptools import find_packages, setup

NAMESPACED = ("backend", "migrations", "demo")
# The dashboard's files travel as package data: the server finds them next to its own package
# (backend/main.py FRONTEND_DIR), in a checkout and in an installed wheel alike.
FRONTEND = {"paritywatch.frontend": ["*.html", "*.js", "static/*", "vendor/*"]}

setup(
    packages=[f"paritywatch.{p}" for p in find_packages(include=[f"{n}*" for n in NAMESPACED])]
    + find_packages(include=["trainer_hooks*"]) + list(FRONTEND),
    package_dir={f"paritywatch.{n}": n for n in (*NAMESPACED, "frontend")},
    package_data={"paritywatch.migrations": ["script.py.mako", "versions/*.py"], **FRONTEND},
)
