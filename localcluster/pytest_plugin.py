"""The pytest plugin's entry point (``localcluster.pytest_plugin``, in pyproject.toml). The code is
in ``integrations/pytest_plugin.py``; pytest finds the hooks and the fixture here."""
from .integrations.pytest_plugin import DEFAULT_WORKERS, localcluster_client, pytest_addoption, pytest_runtest_setup

__all__ = ["DEFAULT_WORKERS", "localcluster_client", "pytest_addoption", "pytest_runtest_setup"]
